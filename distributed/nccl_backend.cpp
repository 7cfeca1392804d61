// The nccl process group (see nccl_backend.h).
//
// Note [the nccl watchdog]: the host never waits for a collective on the GPU (the compute stream
// waits on its event), so nobody would notice one that never ends: a dead peer leaves NCCL's
// kernel spinning and the next host read blocked forever. So each collective started outside a
// graph capture is registered with its event and deadline, and a watchdog thread checks every
// 50 ms: ncclCommGetAsyncError (a failed peer connection, a CUDA error), and whether the oldest
// unfinished collective is past its deadline. On either it aborts the communicator (NCCL's
// kernels return, so blocked streams drain) and keeps the error, naming the collective (op,
// sequence number, bytes, dtype), this rank and the device; the next collective, check_health()
// (the collective engine calls it before every schedule) or wait() throws it. A fault that nobody
// picks up within GRACE seconds (the main thread is stuck in a host read that the abort did not
// free) is printed and ends the process, as PyTorch's NCCL watchdog does, so that a job never
// hangs: mpirun then stops the other ranks.
#include "distributed/nccl_backend.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <mutex>
#include <sstream>
#include <thread>

#include "tinygrad/runtime/nccl_api.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg::dist {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double GRACE_SECONDS = 10.0;

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    default: check_collective_dtype("nccl", d);
  }
  return ncclFloat32;
}

std::string seconds_text(Seconds s) {
  std::ostringstream os;
  os << s.count();
  return os.str();
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : op == ReduceOp::Avg ? ncclAvg : ncclSum; }

// One collective as the watchdog and the errors describe it.
struct Pending {
  uint64_t seq = 0;
  std::string what;  // "all_reduce #12 of 4194304 bytes of float32"
  std::shared_ptr<DeviceEvent> done;
  Clock::time_point deadline;
};

class NcclGroup;

class NcclWork : public Work {
 public:
  NcclWork(NcclGroup* g, std::shared_ptr<DeviceEvent> done, uint64_t seq, std::string what)
      : g_(g), done_(std::move(done)), seq_(seq), what_(std::move(what)) {}
  bool test() override;
  void wait(std::optional<Seconds> timeout) override;

 private:
  NcclGroup* g_;
  std::shared_ptr<DeviceEvent> done_;
  uint64_t seq_;
  std::string what_;
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(Bootstrap& boot, std::string device, Seconds timeout, std::unique_ptr<ProcessGroup> watcher)
      : dev_(get_device(device)), device_(canonical_device(device)), rank_(boot.rank()), size_(boot.size()),
        watch_(std::move(watcher)) {
    timeout_ = timeout;
    TG_CHECK(dev_.supports(Feature::Streams), "nccl: device ", device_, " has no streams (nccl runs on CUDA devices)");
    ncclUniqueId id{};
    if (rank_ == 0) TG_NCCL(rank_, ncclGetUniqueId, &id);
    boot.broadcast(&id, sizeof(id), 0);
    dev_.make_current();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; settle() polls against the deadline
    ncclResult_t r = nccl::api().ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    settle(r, "ncclCommInitRankConfig", "joining the communicator of " + std::to_string(size_) + " ranks");
    stream_ = static_cast<cudaStream_t>(dev_.native_stream(StreamKind::Comm));
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (comm_) {  // a faulted communicator was aborted already
      dev_.make_current();
      nccl::api().ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::string memory_device() const override { return device_; }

  std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return all_reduce_into(data, data, count, dtype, op);
  }
  std::shared_ptr<Work> all_reduce_into(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return start("all_reduce", count, dtype, [&] {
      return nccl::api().ncclAllReduce(in, out, count, nccl_type(dtype), nccl_op(op), comm_, stream_);
    });
  }
  std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return start("reduce_scatter", count * size_, dtype, [&] {
      return nccl::api().ncclReduceScatter(in, out, count, nccl_type(dtype), nccl_op(op), comm_, stream_);
    });
  }
  std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) override {
    return start("all_gather", count * size_, dtype, [&] {
      return nccl::api().ncclAllGather(in, out, count, nccl_type(dtype), comm_, stream_);
    });
  }
  std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) override {
    TG_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ", size_);
    return start("broadcast", count, dtype, [&] {
      return nccl::api().ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_);
    });
  }
  std::shared_ptr<Work> send(const void* data, size_t count, DType dtype, int peer) override {
    check_peer("send", peer, rank_, size_);
    return start(("send to rank " + std::to_string(peer)).c_str(), count, dtype, [&] {
      return nccl::api().ncclSend(data, count, nccl_type(dtype), peer, comm_, stream_);
    });
  }
  std::shared_ptr<Work> recv(void* data, size_t count, DType dtype, int peer) override {
    check_peer("recv", peer, rank_, size_);
    return start(("recv from rank " + std::to_string(peer)).c_str(), count, dtype, [&] {
      return nccl::api().ncclRecv(data, count, nccl_type(dtype), peer, comm_, stream_);
    });
  }
  std::shared_ptr<Work> barrier() override {
    if (!scratch_) scratch_ = std::make_unique<Buffer>(device_, DType::Float32, 1);
    return all_reduce(scratch_->ensure_allocated(), 1, DType::Float32, ReduceOp::Sum);
  }

  void check_health() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) {
      reported_ = true;
      throw Error(error_);
    }
  }

  // Polls the last call's state until it is no longer in progress (non-blocking communicators).
  // The caller holds call_mu_.
  void settle(ncclResult_t r, const char* call, const std::string& what) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
    while (r == ncclInProgress && comm_) {
      if (Clock::now() > deadline) {
        abort_locked(std::string(call) + " (" + what + ") did not finish within " + seconds_text(timeout_) +
                     " s (a rank that never joined, or a network that does not connect them)");
        check_health();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      nccl::api().ncclCommGetAsyncError(comm_, &r);
    }
    check_health();
    nccl::check(r, call, rank_);
  }

  // The deadline-bounded wait of one collective (Work::wait).
  void wait_for(DeviceEvent* done, uint64_t seq, const std::string& what, Seconds limit) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
    while (!(done ? done->done() : true)) {
      check_health();
      if (Clock::now() > deadline) {
        fault(what + " timed out after " + seconds_text(limit) + " s", seq);
        check_health();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check_health();
  }

 private:
  template <class Call>
  std::shared_ptr<Work> start(const char* op, size_t elements, DType dtype, Call call) {
    std::lock_guard<std::mutex> calls(call_mu_);
    check_health();
    dev_.make_current();
    std::ostringstream what;
    const uint64_t seq = next_seq();
    what << op << " #" << seq << " of " << elements * itemsize(dtype) << " bytes of " << dtype_name(dtype);
    if (watch_) watch_->notice_arrival(seq);  // Note [arrival notices for a device group] in mpi_backend.cpp
    ncclResult_t r = call();
    settle(r, op, what.str());
    if (dev_.capturing()) return finished_work();  // recorded into a graph: its replays are launched whole
    auto done = dev_.record_event(StreamKind::Comm);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(
          Pending{seq, what.str(), done, Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_)});
    }
    return std::make_shared<NcclWork>(this, done, seq, what.str());
  }

  // Aborts the communicator once and keeps the error (Note [the nccl watchdog]). Lock order:
  // call_mu_ (no NCCL call runs while the communicator goes), then mu_.
  void fault(const std::string& why, std::optional<uint64_t> seq = std::nullopt) {
    std::lock_guard<std::mutex> calls(call_mu_);
    abort_locked(why, seq);
  }
  void abort_locked(const std::string& why, std::optional<uint64_t> seq = std::nullopt) {
    // the culprits first: the peers are asked before this rank's communicator goes
    std::string culprits = watch_ && seq ? watch_->report_failure(*seq) : std::string();
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    error_ = "nccl: " + why + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (" + device_ +
             "); " + (culprits.empty() ? "the communicator was aborted (a peer that died, stopped or runs a different "
                                         "collective?)"
                                       : culprits + "; the communicator was aborted");
    faulted_at_ = Clock::now();
    if (comm_) nccl::api().ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_; })) {
      if (!error_.empty()) {
        if (!reported_ && Clock::now() - faulted_at_ > std::chrono::duration<double>(GRACE_SECONDS)) {
          std::fprintf(stderr, "tg: error: %s (nobody took the error within %.0f s; ending the process)\n",
                       error_.c_str(), GRACE_SECONDS);
          std::fflush(stderr);
          std::_Exit(1);
        }
        continue;
      }
      while (!pending_.empty() && pending_.front().done->done()) pending_.pop_front();
      ncclResult_t async = ncclSuccess;
      if (comm_) nccl::api().ncclCommGetAsyncError(comm_, &async);
      std::string why;
      if (async != ncclSuccess && async != ncclInProgress)
        why = (pending_.empty() ? std::string("a collective") : pending_.front().what) + " failed: " +
              nccl::error_name(async);
      else if (!pending_.empty() && Clock::now() > pending_.front().deadline)
        why = pending_.front().what + " timed out after " + seconds_text(timeout_) + " s";
      if (why.empty()) continue;
      std::optional<uint64_t> seq;
      if (!pending_.empty()) seq = pending_.front().seq;
      lock.unlock();
      fault(why, seq);
      lock.lock();
    }
  }

  Device& dev_;
  std::string device_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<ProcessGroup> watch_;  // the host group of the notices (may be null)
  std::unique_ptr<Buffer> scratch_;  // barrier()'s one float
  std::mutex call_mu_;               // held by every NCCL call on comm_ from the ranks' threads
  std::mutex mu_;                    // the watchdog's state: pending_, error_, comm_'s end
  std::condition_variable cv_;
  std::deque<Pending> pending_;  // oldest first
  std::string error_;
  bool reported_ = false, stop_ = false;
  Clock::time_point faulted_at_;
  std::thread watchdog_;
};

bool NcclWork::test() {
  g_->check_health();
  return !done_ || done_->done();
}

void NcclWork::wait(std::optional<Seconds> timeout) {
  g_->wait_for(done_.get(), seq_, what_, timeout.value_or(g_->timeout()));
}

}  // namespace

std::string nccl_status() { return nccl::status(); }

std::unique_ptr<ProcessGroup> nccl_group(Bootstrap& bootstrap, const std::string& device, Seconds timeout,
                                         std::unique_ptr<ProcessGroup> watch) {
  return std::make_unique<NcclGroup>(bootstrap, device, timeout, std::move(watch));
}

}  // namespace tg::dist
