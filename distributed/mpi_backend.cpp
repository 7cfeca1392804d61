// The mpi backend (see mpi_backend.h).
//
// Note [arrival notices]: MPI cannot say which peer is missing from a collective that never
// finishes. So each rank, as it starts collective #s, sends s to every peer on a second
// communicator (tiny eager messages). A rank whose wait times out reads the notices it has and
// names the peers whose latest notice is older than s: those never reached the collective
// (dead or stuck). The cost is size()-1 small sends per collective, few next to gradient buckets.
#include "distributed/mpi_backend.h"

#include <mpi.h>

#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

void mpi_check(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("mpi: ") + call + " failed on rank " + std::to_string(rank) + ": " + std::string(msg, len));
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;  // moved as 16-bit words, reduced by half_op()
    default: check_collective_dtype("mpi", d);
  }
  return MPI_DATATYPE_NULL;
}

// Note [half types over MPI]: MPI has no float16 or bfloat16. They travel as MPI_UINT16_T, and
// reductions use user-defined ops (one per dtype and reduction) that widen to float32, combine
// and round back (process_group.h's reduce_into), as NCCL does. MPI calls them on its own
// threads' buffers, so they only touch their arguments.
template <DType D, ReduceOp R>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<size_t>(*len), D, R);
}

struct HalfOps {
  MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};  // [bf16?][max?]
  HalfOps() {
    MPI_Op_create(&half_reduce<DType::Float16, ReduceOp::Sum>, 1, &ops[0][0]);
    MPI_Op_create(&half_reduce<DType::Float16, ReduceOp::Max>, 1, &ops[0][1]);
    MPI_Op_create(&half_reduce<DType::BFloat16, ReduceOp::Sum>, 1, &ops[1][0]);
    MPI_Op_create(&half_reduce<DType::BFloat16, ReduceOp::Max>, 1, &ops[1][1]);
  }
};

MPI_Op mpi_op(ReduceOp op, DType d) {
  if (is_half(d)) {
    static HalfOps half;  // created after MPI_Init (the first group), freed by MPI_Finalize
    return half.ops[d == DType::BFloat16][op == ReduceOp::Max];
  }
  return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;
}

struct MpiRuntime {
  bool we_initialised = false;
  MpiRuntime() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = 0;
    if (!inited) {
      mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread", env_rank());
      we_initialised = true;
    } else {
      MPI_Query_thread(&provided);
    }
    TG_CHECK(provided >= MPI_THREAD_MULTIPLE, "mpi: this MPI library provides thread level ", provided,
             ", the mpi backend needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE, ")");
  }
  ~MpiRuntime() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (we_initialised && !fin) MPI_Finalize();
  }
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

class MpiGroup;

class MpiWork : public Work {
 public:
  MpiWork(MpiGroup* g, MPI_Request req, std::string what, uint64_t seq, std::function<void()> on_done)
      : g_(g), req_(req), what_(std::move(what)), seq_(seq), on_done_(std::move(on_done)) {}
  bool test() override;
  void wait(std::optional<Seconds> timeout) override;

 private:
  MpiGroup* g_;
  MPI_Request req_;
  std::string what_;
  uint64_t seq_;
  std::function<void()> on_done_;
  bool done_ = false;
};

class MpiGroup : public ProcessGroup {
 public:
  MpiGroup() {
    runtime();
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", env_rank());
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &notify_), "MPI_Comm_dup", env_rank());
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(notify_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    last_seen_.assign(size_, -1);
  }
  ~MpiGroup() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : sends_) MPI_Request_free(&s.req);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&notify_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return start("all_reduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, icount(count), mpi_type(dtype), mpi_op(op, dtype), comm_, r);
    }, avg_after(op, data, count, dtype));
  }
  std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return start("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, icount(count), mpi_type(dtype), mpi_op(op, dtype), comm_, r);
    }, avg_after(op, out, count, dtype));
  }
  std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) override {
    return start("all_gather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, icount(count), mpi_type(dtype), out, icount(count), mpi_type(dtype), comm_, r);
    }, nullptr);
  }
  std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) override {
    TG_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ", size_);
    return start("broadcast", [&](MPI_Request* r) { return MPI_Ibcast(data, icount(count), mpi_type(dtype), root, comm_, r); },
                 nullptr);
  }
  std::shared_ptr<Work> barrier() override {
    return start("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }, nullptr);
  }

  // The error for a collective that did not finish in time (see Note [arrival notices]).
  std::string timeout_message(const std::string& what, uint64_t seq, Seconds timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    drain_notices();
    std::ostringstream os;
    os << "mpi: " << what << " #" << seq << " timed out after " << timeout.count() << " s on rank " << rank_ << " of "
       << size_;
    std::string missing;
    for (int r = 0; r < size_; r++)
      if (r != rank_ && last_seen_[r] < static_cast<int64_t>(seq))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (last seen at collective #" +
                   std::to_string(last_seen_[r]) + ")";
    if (!missing.empty()) os << "; rank(s) that never reached it (dead or stuck): " << missing;
    else os << "; every rank reached it (the network or a slow rank?)";
    return os.str();
  }

 private:
  static int icount(size_t n) {
    TG_CHECK(n <= static_cast<size_t>(INT32_MAX), "mpi: a collective of ", n, " elements is too large (at most 2^31-1)");
    return static_cast<int>(n);
  }
  std::function<void()> avg_after(ReduceOp op, void* data, size_t count, DType dtype) {
    if (op != ReduceOp::Avg) return nullptr;
    int n = size_;
    return [=] { scale_down(data, count, dtype, n); };
  }

  template <class F>
  std::shared_ptr<Work> start(const char* what, F&& call, std::function<void()> on_done) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t seq = next_seq();
    announce(seq);
    MPI_Request req;
    mpi_check(call(&req), what, rank_);
    return std::make_shared<MpiWork>(this, req, what, seq, std::move(on_done));
  }

  void announce(uint64_t seq) {
    // finished notices are dropped; the rest stay until MPI is done with their buffer
    while (!sends_.empty()) {
      int flag = 0;
      MPI_Test(&sends_.front().req, &flag, MPI_STATUS_IGNORE);
      if (!flag) break;
      sends_.pop_front();
    }
    for (int r = 0; r < size_; r++) {
      if (r == rank_) continue;
      sends_.push_back(Send{static_cast<int64_t>(seq), MPI_REQUEST_NULL});
      MPI_Isend(&sends_.back().seq, 1, MPI_INT64_T, r, 0, notify_, &sends_.back().req);
    }
    drain_notices();
  }

  void drain_notices() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, 0, notify_, &flag, &st);
      if (!flag) return;
      int64_t s = -1;
      MPI_Recv(&s, 1, MPI_INT64_T, st.MPI_SOURCE, 0, notify_, MPI_STATUS_IGNORE);
      if (s > last_seen_[st.MPI_SOURCE]) last_seen_[st.MPI_SOURCE] = s;
    }
  }

  struct Send {
    int64_t seq;
    MPI_Request req;
  };
  MPI_Comm comm_ = MPI_COMM_NULL, notify_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mu_;
  std::deque<Send> sends_;  // deque: buffers keep their address while MPI sends them
  std::vector<int64_t> last_seen_;
};

bool MpiWork::test() {
  if (done_) return true;
  int flag = 0;
  mpi_check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what_.c_str(), g_->rank());
  if (!flag) return false;
  done_ = true;
  if (on_done_) on_done_();
  return true;
}

void MpiWork::wait(std::optional<Seconds> timeout) {
  Seconds limit = timeout.value_or(g_->timeout());
  // MPI progresses a nonblocking collective only inside MPI calls: poll without sleeping for the
  // first milliseconds (yielding the core), then every 50 us, so a long wait costs little CPU.
  auto start = std::chrono::steady_clock::now();
  while (!test()) {
    auto waited = std::chrono::steady_clock::now() - start;
    if (waited > limit) throw Error(g_->timeout_message(what_, seq_, limit));
    if (waited < std::chrono::milliseconds(20)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

std::unique_ptr<ProcessGroup> mpi_world_group() { return std::make_unique<MpiGroup>(); }

}  // namespace tg::dist
