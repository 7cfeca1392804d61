// The local backend (see local_backend.h).
//
// Note [local collectives]: each collective is two barriers. Before the first, every rank posts
// its buffers; after it, each rank computes its own result from everyone's inputs into a
// temporary; after the second barrier (all reads done) it writes the result. A rank that never
// arrives makes the others throw at the deadline, naming it; a rank marked dead makes them throw
// at once.
#include "distributed/local_backend.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "tinygrad/error.h"

namespace tg::dist {

struct Post {
  const void* in = nullptr;
  size_t count = 0;
  DType dtype = DType::Float32;
  std::string what;
};

class LocalWorld {
 public:
  explicit LocalWorld(int n) : n_(n), arrived_(n, false), dead_(n), posts_(n) {}
  int size() const { return n_; }

  void mark_dead(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    dead_[rank] = why.empty() ? "exited" : why;
    cv_.notify_all();
  }

  // Posts `p` (when given) and waits until every rank has arrived (see Note [local collectives]).
  void arrive(int rank, const Post* p, const std::string& what, uint64_t seq, Seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (p) posts_[rank] = *p;
    arrived_[rank] = true;
    if (++count_ == n_) {
      count_ = 0;
      arrived_.assign(n_, false);
      gen_++;
      cv_.notify_all();
      return;
    }
    uint64_t g = gen_;
    auto any_dead = [&] {
      for (int r = 0; r < n_; r++)
        if (!dead_[r].empty() && r != rank) return true;
      return false;
    };
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
    cv_.wait_until(lock, deadline, [&] { return gen_ != g || any_dead(); });
    if (gen_ != g) return;
    std::ostringstream os;
    os << "local: " << what << " #" << seq << " on rank " << rank << " of " << n_ << ": ";
    std::string dead_list, missing;
    for (int r = 0; r < n_; r++) {
      if (r != rank && !dead_[r].empty()) dead_list += (dead_list.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " died (" + dead_[r] + ")");
      if (!arrived_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!dead_list.empty()) os << dead_list;
    else os << "timed out after " << timeout.count() << " s waiting for rank(s) " << missing;
    throw Error(os.str());
  }

  const Post& post(int r) const { return posts_[r]; }

  // Note [local messages]: send copies the message into the mailbox of (from, to) and returns;
  // recv takes the oldest message of its pair, waiting until one is there, the sender died, or
  // the deadline passed.
  void deliver(int from, int to, const void* data, size_t count, DType dtype) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* p = static_cast<const uint8_t*>(data);
    mail_[{from, to}].push_back(Message{std::vector<uint8_t>(p, p + count * itemsize(dtype)), count, dtype});
    cv_.notify_all();
  }
  void take(int from, int to, void* data, size_t count, DType dtype, Seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = mail_[{from, to}];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
    std::ostringstream what;
    what << "local: recv of " << count << " " << dtype_name(dtype) << " from rank " << from << " on rank " << to << ": ";
    bool ready = cv_.wait_until(lock, deadline, [&] { return !box.empty() || !dead_[from].empty(); });
    TG_CHECK(!box.empty() || dead_[from].empty(), what.str(), "rank ", from, " died (", dead_[from], ") without sending it");
    TG_CHECK(ready, what.str(), "timed out after ", timeout.count(), " s waiting for rank ", from, "'s send");
    Message m = std::move(box.front());
    box.pop_front();
    TG_CHECK(m.count == count && m.dtype == dtype, what.str(), "rank ", from, " sent ", m.count, " ", dtype_name(m.dtype));
    std::memcpy(data, m.bytes.data(), m.bytes.size());
  }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  uint64_t gen_ = 0;
  std::vector<bool> arrived_;
  std::vector<std::string> dead_;
  std::vector<Post> posts_;
  struct Message {
    std::vector<uint8_t> bytes;
    size_t count;
    DType dtype;
  };
  std::map<std::pair<int, int>, std::deque<Message>> mail_;  // (from, to) -> oldest first
};

namespace {

class LocalGroup : public ProcessGroup {
 public:
  LocalGroup(std::shared_ptr<LocalWorld> w, int rank) : w_(std::move(w)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->size(); }
  std::string backend() const override { return "local"; }

  std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return reduce_block(data, data, count, 0, dtype, op, "all_reduce");
  }
  std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return reduce_block(in, out, count, static_cast<size_t>(rank_) * count, dtype, op, "reduce_scatter");
  }
  std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) override {
    size_t bytes = count * itemsize(dtype);
    uint64_t seq = start("all_gather", in, count, dtype);
    std::vector<uint8_t> tmp(bytes * size());
    for (int r = 0; r < size(); r++) std::memcpy(tmp.data() + r * bytes, w_->post(r).in, bytes);
    w_->arrive(rank_, nullptr, "all_gather", seq, timeout_);
    std::memcpy(out, tmp.data(), tmp.size());
    return finished_work();
  }
  std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) override {
    TG_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of a group of ", size());
    size_t bytes = count * itemsize(dtype);
    uint64_t seq = start("broadcast", data, count, dtype);
    std::vector<uint8_t> tmp(bytes);
    std::memcpy(tmp.data(), w_->post(root).in, bytes);
    w_->arrive(rank_, nullptr, "broadcast", seq, timeout_);
    std::memcpy(data, tmp.data(), bytes);
    return finished_work();
  }
  std::shared_ptr<Work> send(const void* data, size_t count, DType dtype, int peer) override {
    check_collective_dtype("send", dtype);
    check_peer("send", peer, rank_, size());
    w_->deliver(rank_, peer, data, count, dtype);
    return finished_work();
  }
  std::shared_ptr<Work> recv(void* data, size_t count, DType dtype, int peer) override {
    check_collective_dtype("recv", dtype);
    check_peer("recv", peer, rank_, size());
    w_->take(peer, rank_, data, count, dtype, timeout_);
    return finished_work();
  }
  std::shared_ptr<Work> barrier() override {
    uint64_t seq = next_seq();
    w_->arrive(rank_, nullptr, "barrier", seq, timeout_);
    return finished_work();
  }

 private:
  // Posts this rank's input and checks that every rank runs the same collective on the same size.
  uint64_t start(const char* what, const void* in, size_t count, DType dtype) {
    check_collective_dtype(what, dtype);
    uint64_t seq = next_seq();
    Post p{in, count, dtype, what};
    w_->arrive(rank_, &p, what, seq, timeout_);
    for (int r = 0; r < size(); r++) {
      const Post& o = w_->post(r);
      TG_CHECK(o.what == what && o.count == count && o.dtype == dtype, "local: collective #", seq, " differs between ranks: rank ",
               rank_, " runs ", what, " of ", count, " ", dtype_name(dtype), ", rank ", r, " runs ", o.what, " of ", o.count, " ",
               dtype_name(o.dtype));
    }
    return seq;
  }

  std::shared_ptr<Work> reduce_block(const void* in, void* out, size_t count, size_t offset, DType dtype, ReduceOp op,
                                     const char* what) {
    size_t total = std::string(what) == "reduce_scatter" ? count * size() : count;
    uint64_t seq = start(what, in, total, dtype);
    size_t isz = itemsize(dtype), bytes = count * isz;
    std::vector<uint8_t> tmp(bytes);
    std::memcpy(tmp.data(), static_cast<const uint8_t*>(w_->post(0).in) + offset * isz, bytes);
    for (int r = 1; r < size(); r++)
      reduce_into(tmp.data(), static_cast<const uint8_t*>(w_->post(r).in) + offset * isz, count, dtype, op);
    if (op == ReduceOp::Avg) scale_down(tmp.data(), count, dtype, size());
    w_->arrive(rank_, nullptr, what, seq, timeout_);
    std::memcpy(out, tmp.data(), bytes);
    return finished_work();
  }

  std::shared_ptr<LocalWorld> w_;
  int rank_;
};

}  // namespace

std::shared_ptr<LocalWorld> make_local_world(int n) {
  TG_CHECK(n >= 1, "local: world size must be >= 1, got ", n);
  return std::make_shared<LocalWorld>(n);
}

std::unique_ptr<ProcessGroup> local_group(const std::shared_ptr<LocalWorld>& world, int rank) {
  TG_CHECK(rank >= 0 && rank < world->size(), "local: rank ", rank, " is outside a world of ", world->size());
  return std::make_unique<LocalGroup>(world, rank);
}

void run_local(int n, const std::function<void(ProcessGroup&)>& fn, Seconds timeout) {
  auto world = make_local_world(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++) {
    threads.emplace_back([&, r] {
      auto g = local_group(world, r);
      g->set_timeout(timeout);
      try {
        fn(*g);
        world->mark_dead(r, "returned from its function");
      } catch (const std::exception& e) {
        errors[r] = e.what();
        world->mark_dead(r, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; r++) TG_CHECK(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

}  // namespace tg::dist
