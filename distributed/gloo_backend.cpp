// The gloo process group (gloo_backend.h).
#include "distributed/gloo_backend.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <map>
#include <mutex>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

using Millis = std::chrono::milliseconds;

Millis millis(Seconds s) { return std::chrono::duration_cast<Millis>(s); }

// Gloo's rendezvous over the store: its keys under "gloo/".
class StoreForGloo : public gloo::rendezvous::Store {
 public:
  StoreForGloo(StoreClient& store, Seconds timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set("gloo/" + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get("gloo/" + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, millis(timeout_)); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& k : keys) prefixed.push_back("gloo/" + k);
    store_.wait(prefixed, Seconds(double(timeout.count()) / 1000.0));
  }

 private:
  StoreClient& store_;
  Seconds timeout_;
};

// Gloo's element-wise reduction for one dtype and op: out = a op b.
gloo::AllreduceOptions::Func reduction(DType dtype, ReduceOp op) {
  const ReduceOp base = op == ReduceOp::Avg ? ReduceOp::Sum : op;  // Avg divides afterwards
  return [dtype, base](void* out, const void* a, const void* b, size_t n) {
    const void* other = b;
    if (out == b) other = a;  // sum and max commute
    else if (out != a) std::memcpy(out, a, n * itemsize(dtype));
    if (other != out) reduce_into(out, other, n, dtype, base);
  };
}

// A send or recv in flight: Gloo's unbound buffers for a small header (count, dtype) and the data.
class P2PWork : public Work {
 public:
  P2PWork(std::function<void(Seconds)> finish, Seconds timeout) : finish_(std::move(finish)), timeout_(timeout) {}
  bool test() override {
    wait(std::nullopt);
    return true;
  }
  void wait(std::optional<Seconds> timeout) override {
    if (done_) return;
    done_ = true;
    finish_(timeout.value_or(timeout_));
  }

 private:
  std::function<void(Seconds)> finish_;
  Seconds timeout_;
  bool done_ = false;
};

// Note [gloo arrival notices]: Gloo's collectives end a timeout with "timed out waiting for
// recv", not with the rank that is missing. So as it starts collective #s each rank sets its key
// "arrived/<rank>" in the store to s (one key per rank, overwritten: the store does not grow with
// the steps), and a rank whose collective failed reads every rank's key: those below s never
// reached #s. Where every rank arrived, one of them stopped answering inside it (a SIGSTOP, a
// dead peer). One store round trip per collective, next to the gradient buckets of a step. A
// failed collective leaves the group failed: later ones throw the first failure, and the process
// should end (tg launch then stops the others).
class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout, const std::string& address)
      : store_(std::move(store)), rank_(rank), size_(size) {
    timeout_ = timeout;
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    ctx_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx_->setTimeout(millis(timeout));
    StoreForGloo rendezvous(*store_, timeout);
    try {
      ctx_->connectFullMesh(rendezvous, device);
    } catch (const std::exception& e) {
      TG_FAIL("gloo: rank ", rank, " of ", size, " could not connect to its peers (", e.what(), ")");
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    check_collective_dtype("all_reduce", dtype);
    run("all_reduce", [&] { reduce_in_place(data, count, dtype, op); });
    return finished_work();
  }

  std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    check_collective_dtype("reduce_scatter", dtype);
    run("reduce_scatter", [&] {
      const size_t bytes = count * itemsize(dtype);
      std::vector<char> all(static_cast<const char*>(in), static_cast<const char*>(in) + bytes * size_t(size_));
      reduce_in_place(all.data(), count * size_t(size_), dtype, op);
      std::memcpy(out, all.data() + bytes * size_t(rank_), bytes);
    });
    return finished_work();
  }

  std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) override {
    check_collective_dtype("all_gather", dtype);
    run("all_gather", [&] {
      gloo::AllgatherOptions o(ctx_);
      o.setInput(const_cast<char*>(static_cast<const char*>(in)), count * itemsize(dtype));
      o.setOutput(static_cast<char*>(out), count * itemsize(dtype) * size_t(size_));
      o.setTimeout(millis(timeout_));
      gloo::allgather(o);
    });
    return finished_work();
  }

  std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) override {
    check_collective_dtype("broadcast", dtype);
    TG_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ", size_);
    run("broadcast", [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(data), count * itemsize(dtype));
      o.setRoot(root);
      o.setTimeout(millis(timeout_));
      gloo::broadcast(o);
    });
    return finished_work();
  }

  std::shared_ptr<Work> barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(millis(timeout_));
      gloo::barrier(o);
    });
    return finished_work();
  }

  // A device group's arrival notices (nccl under tg launch or srun): the same scheme as the
  // group's own (Note [gloo arrival notices]), under "device_arrived/<rank>".
  void notice_arrival(uint64_t seq) override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      store_->set("device_arrived/" + std::to_string(rank_), std::to_string(seq));
    } catch (const std::exception&) {
      // the notice is a diagnosis aid: a store that is gone must not fail the collective itself
    }
  }
  std::string report_failure(uint64_t seq) override {
    std::lock_guard<std::mutex> lock(mu_);
    return missing_ranks("device_arrived/", seq).substr(2);  // without the leading "; "
  }

  std::shared_ptr<Work> send(const void* data, size_t count, DType dtype, int peer) override {
    check_collective_dtype("send", dtype);
    check_peer("send", peer, rank_, size_);
    std::lock_guard<std::mutex> lock(mu_);
    check_not_failed();
    const uint64_t slot = next_slot(sent_[peer]);
    auto header = std::make_shared<std::array<int64_t, 2>>(std::array<int64_t, 2>{int64_t(count), int64_t(dtype)});
    auto h = std::shared_ptr<gloo::transport::UnboundBuffer>(ctx_->createUnboundBuffer(header->data(), 16));
    auto d = std::shared_ptr<gloo::transport::UnboundBuffer>(
        ctx_->createUnboundBuffer(const_cast<void*>(data), count * itemsize(dtype)));
    h->send(peer, slot);
    d->send(peer, slot + 1);
    return std::make_shared<P2PWork>(
        [this, header, h, d, peer](Seconds limit) {
          p2p_wait("send", peer, limit, [&](Millis ms) { return h->waitSend(ms) && d->waitSend(ms); });
        },
        timeout_);
  }

  std::shared_ptr<Work> recv(void* data, size_t count, DType dtype, int peer) override {
    check_collective_dtype("recv", dtype);
    check_peer("recv", peer, rank_, size_);
    std::lock_guard<std::mutex> lock(mu_);
    check_not_failed();
    const uint64_t slot = next_slot(received_[peer]);
    auto header = std::make_shared<std::array<int64_t, 2>>();
    auto h = std::shared_ptr<gloo::transport::UnboundBuffer>(ctx_->createUnboundBuffer(header->data(), 16));
    auto d = std::shared_ptr<gloo::transport::UnboundBuffer>(ctx_->createUnboundBuffer(data, count * itemsize(dtype)));
    h->recv(peer, slot);
    d->recv(peer, slot + 1);  // posted now: a sender waits for it (a ring of sends, then recvs)
    return std::make_shared<P2PWork>(
        [this, header, h, d, count, dtype, peer](Seconds limit) {
          p2p_wait("recv", peer, limit, [&](Millis ms) { return h->waitRecv(ms); });
          const auto [sent_count, sent_dtype] = *header;
          TG_CHECK(sent_count == int64_t(count) && sent_dtype == int64_t(dtype), "recv: rank ", rank_, " expected ",
                   count, " ", dtype_name(dtype), " from rank ", peer, ", which sent ", sent_count, " ",
                   dtype_name(static_cast<DType>(sent_dtype)));
          p2p_wait("recv", peer, limit, [&](Millis ms) { return d->waitRecv(ms); });
        },
        timeout_);
  }

 private:
  // Note [gloo arrival notices]: the notice, the collective, and on failure the missing ranks.
  void run(const char* what, const std::function<void()>& collective) {
    std::lock_guard<std::mutex> lock(mu_);
    check_not_failed();
    const uint64_t seq = next_seq();
    const std::string name = std::string(what) + " #" + std::to_string(seq);
    try {
      store_->set("arrived/" + std::to_string(rank_), std::to_string(seq));
      collective();
    } catch (const std::exception& e) {
      failure_ = "gloo: " + name + " failed on rank " + std::to_string(rank_) + " (" + e.what() + ")" +
                 missing_ranks("arrived/", seq);
      throw Error(failure_);
    }
  }

  void reduce_in_place(void* data, size_t count, DType dtype, ReduceOp op) {
    switch (dtype) {
      case DType::Float32: allreduce_as<float>(data, count, dtype, op); break;
      case DType::Float64: allreduce_as<double>(data, count, dtype, op); break;
      case DType::Int32: allreduce_as<int32_t>(data, count, dtype, op); break;
      case DType::Int64: allreduce_as<int64_t>(data, count, dtype, op); break;
      default: allreduce_as<uint16_t>(data, count, dtype, op); break;  // float16, bfloat16 as 16-bit words
    }
    if (op == ReduceOp::Avg) scale_down(data, count, dtype, size_);
  }

  // Gloo splits a buffer into whole elements of T (a reduction never sees half an element).
  template <class T>
  void allreduce_as(void* data, size_t count, DType dtype, ReduceOp op) {
    gloo::AllreduceOptions o(ctx_);
    o.setOutput(static_cast<T*>(data), count);
    o.setReduceFunction(reduction(dtype, op));
    o.setTimeout(millis(timeout_));
    gloo::allreduce(o);
  }

  // "; never reached it: rank ..." from the ranks' latest notices under `key` (Note [gloo arrival notices]).
  std::string missing_ranks(const std::string& key, uint64_t seq) {
    std::string never;
    try {
      for (int r = 0; r < size_; r++) {
        const auto at = store_->try_get(key + std::to_string(r));
        if (!at || std::stoull(*at) < seq) never += (never.empty() ? "" : ", ") + std::to_string(r);
      }
    } catch (const std::exception& e) {
      return std::string("; the store could not say which ranks arrived (") + e.what() + ")";
    }
    return never.empty() ? "; every rank reached it: one stopped answering inside it"
                         : "; never reached it: rank " + never;
  }

  void p2p_wait(const char* what, int peer, Seconds limit, const std::function<bool(Millis)>& wait) {
    bool ok = false;
    std::string why = "timed out";
    try {
      ok = wait(millis(limit));
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (ok) return;
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = std::string("gloo: ") + what + " between rank " + std::to_string(rank_) + " and rank " +
               std::to_string(peer) + " did not finish within " + std::to_string(limit.count()) + " s (" + why + ")";
    throw Error(failure_);
  }

  static uint64_t next_slot(uint64_t& counter) { return (uint64_t(1) << 40) + 2 * counter++; }

  void check_not_failed() const {
    TG_CHECK(failure_.empty(), "gloo: the group failed earlier, collectives cannot continue: ", failure_);
  }

  std::unique_ptr<StoreClient> store_;
  int rank_, size_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::mutex mu_;  // one collective at a time (they run in the same order on every rank)
  std::string failure_;
  std::map<int, uint64_t> sent_, received_;
};

}  // namespace

std::unique_ptr<ProcessGroup> gloo_group(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout,
                                         const std::string& address) {
  return std::make_unique<GlooGroup>(std::move(store), rank, size, timeout, address);
}

std::string address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  TG_CHECK(rc == 0 && found, "gloo: cannot resolve the store's host '", host, "' (", gai_strerror(rc), ")");
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in mine{};
  socklen_t len = sizeof mine;
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) == 0;
  ::freeaddrinfo(found);
  if (fd >= 0) ::close(fd);
  TG_CHECK(ok, "gloo: no route to the store's host '", host, "'");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &mine.sin_addr, text, sizeof text);
  return text;
}

}  // namespace tg::dist
