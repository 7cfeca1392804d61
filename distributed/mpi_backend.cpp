// The mpi backend (see mpi_backend.h).
//
// Note [arrival notices]: MPI cannot say which peer is missing from a collective that never
// finishes. So each rank, as it starts collective #s, sends s to every peer on a second
// communicator (tiny eager messages). A rank whose wait times out reads the notices it has and
// names the peers whose latest notice is older than s: those never reached the collective
// (dead or stuck). The cost is size()-1 small sends per collective, few next to gradient buckets.
//
// Note [liveness probe]: a notice says a peer *started* collective #s, not that it is still
// there: a rank stopped (SIGSTOP) or killed right after starting #s looks as if it had arrived.
// So before it reports, a rank whose collective timed out or failed pings every peer on the
// notice communicator and waits kProbeSeconds for the answers. Each group runs a responder
// thread that answers pings (with the latest collective its rank started) every
// kResponderPeriod, whatever the rank's main and communication threads are doing, so a rank that
// computes or waits answers and one that is stopped or dead does not. The report then names the
// peers that did not answer ("not answering (stopped or dead?)") and the answering peers that
// never reached the collective ("never reached it (stuck or slow?)"); only when every peer
// answered and reached it does it suspect the network or a slow collective.
//
// Note [a failed collective ends the job]: after a timeout or an MPI error the communicator
// holds a collective that will never finish, and MPI_Finalize (at exit) would wait for it for
// good. As NCCL's watchdog does, the first failure marks the job failed: collectives started or
// waited on after it throw at once, repeating the first failure's message (so the communication
// thread ends too, and whichever thread reports names the culprits), the error unwinds to
// main, which reports it (stderr, train.log), and at exit the runtime calls MPI_Abort instead of
// MPI_Finalize; Open MPI's mpirun then kills every rank, a stopped one included, and returns the
// error code. Rank 0 aborts as soon as it exits; the other ranks first wait until kAbortGrace
// after their failure, so that rank 0, which timed out at about the same moment, has written its
// report before the job is killed. A backstop thread aborts kBackstop after the failure in case
// the process has not reached exit by then (a thread that does not return, a caller that
// catches the error and goes on): a failed job never outlives its failure by more than that.
#include "distributed/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

std::string mpi_error_text(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

void mpi_check(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  throw Error(std::string("mpi: ") + call + " failed on rank " + std::to_string(rank) + ": " + mpi_error_text(rc));
}

std::string timed_out_text(Seconds limit) {
  std::ostringstream os;
  os << "timed out after " << limit.count() << " s";
  return os.str();
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

constexpr int P2P_TAG = 1;  // send/recv on the collectives' communicator (collectives use no tag)

MPI_Op mpi_op(ReduceOp op, DType d) {
  if (is_half(d)) {
    static HalfOps half;  // created after MPI_Init (the first group), freed by MPI_Finalize
    return half.ops[d == DType::BFloat16][op == ReduceOp::Max];
  }
  return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;
}

// ---- the failed job (Note [a failed collective ends the job]) ----

constexpr Seconds kAbortGrace{1.0};  // ranks other than 0 abort this long after their failure
constexpr Seconds kBackstop{1.6};    // any rank aborts this long after its failure

using Clock = std::chrono::steady_clock;

// Process-wide and trivially destructible: the backstop thread may read them during exit.
std::atomic<bool> g_job_failed{false};
std::atomic<int64_t> g_failed_at_ns{0};
std::atomic<bool> g_aborting{false};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

bool job_failed() { return g_job_failed.load(); }

void sleep_until_after_failure(Seconds delay) {
  auto due = Clock::time_point(std::chrono::nanoseconds(g_failed_at_ns.load())) +
             std::chrono::duration_cast<Clock::duration>(delay);
  std::this_thread::sleep_until(due);
}

// Flushes what this rank has written and ends the whole job through mpirun.
[[noreturn]] void abort_failed_job(const char* who) {
  if (g_aborting.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the other caller aborts
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::cout.flush();
  std::fflush(nullptr);
  std::fprintf(stderr, "mpi: rank %d ends the job (MPI_Abort, %s) after a failed collective\n", rank, who);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; should it, the exit status still says failure
}

void start_backstop() {
  std::thread([] {
    sleep_until_after_failure(kBackstop);
    abort_failed_job("the process had not exited");
  }).detach();
}

// Marks the job failed; true for the first failure in this process, which records when and
// starts the backstop.
bool mark_job_failed() {
  if (g_job_failed.exchange(true)) return false;
  g_failed_at_ns.store(now_ns());
  start_backstop();
  return true;
}

// The first failure's message, for the errors of the collectives abandoned after it (another
// thread may be waiting on one and report it instead). Never destroyed: read until exit.
std::mutex& first_failure_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::string& first_failure_text() {
  static auto* s = new std::string;
  return *s;
}

void record_first_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(first_failure_mutex());
  first_failure_text() = message;
}

// The first failure's message, waiting up to a second while its culprits are being probed.
std::string first_failure() {
  auto until = Clock::now() + std::chrono::seconds(1);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(first_failure_mutex());
      if (!first_failure_text().empty() || Clock::now() > until) return first_failure_text();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// At exit after a failure: rank 0 at once, the others after the grace.
[[noreturn]] void end_failed_job_at_exit() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) sleep_until_after_failure(kAbortGrace);
  abort_failed_job("at exit");
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
    if (fin) return;
    if (job_failed()) end_failed_job_at_exit();  // MPI_Finalize would wait for the failed collective
    if (we_initialised) MPI_Finalize();
  }
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

class MpiGroup;

class MpiWork : public Work {
 public:
  MpiWork(MpiGroup* g, MPI_Request req, std::string what, uint64_t seq, std::function<void()> on_done, int peer = -1)
      : g_(g), req_(req), what_(std::move(what)), seq_(seq), on_done_(std::move(on_done)), peer_(peer) {}
  bool test() override;
  void wait(std::optional<Seconds> timeout) override;

  // recv: the count and type it expects, checked against what arrived (a shorter message is no
  // error to MPI).
  int recv_count = -1;
  MPI_Datatype recv_type = MPI_DATATYPE_NULL;

 private:
  std::string failure(const std::string& how);

  MpiGroup* g_;
  MPI_Request req_;
  std::string what_;
  uint64_t seq_;
  std::function<void()> on_done_;
  int peer_;  // point to point: the other rank (-1 for a collective)
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
    foreign_seen_.assign(size_, -1);
    probe_answers_.assign(size_, -1);
    responder_ = std::thread([this] { answer_pings(); });
  }
  ~MpiGroup() override {
    stop_responder_ = true;
    responder_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : sends_) MPI_Request_free(&s.req);
    for (auto& s : pongs_) MPI_Request_free(&s.req);
    for (auto& s : foreign_sends_) MPI_Request_free(&s.req);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !job_failed()) {  // a failed collective may still hold them (the job is aborting)
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
  std::shared_ptr<Work> send(const void* data, size_t count, DType dtype, int peer) override {
    return start_p2p("send", peer, count, dtype, [&](MPI_Request* r) {
      return MPI_Isend(data, icount(count), mpi_type(dtype), peer, P2P_TAG, comm_, r);
    });
  }
  std::shared_ptr<Work> recv(void* data, size_t count, DType dtype, int peer) override {
    return start_p2p("recv", peer, count, dtype, [&](MPI_Request* r) {
      return MPI_Irecv(data, icount(count), mpi_type(dtype), peer, P2P_TAG, comm_, r);
    });
  }

  // Note [arrival notices for a device group]: NCCL, like MPI, cannot say which peer is missing
  // from a collective that never ends. So the nccl group keeps the MPI group it was bootstrapped
  // with and, as it starts collective #s, has it send s to every peer under a tag of its own
  // (kForeignTag; the MPI group's own notices keep theirs). When the nccl watchdog finds a
  // timeout or an error, report_failure reads those notices, probes the peers' liveness and
  // names the silent ones and those whose latest notice is older than s, as for MPI's own
  // collectives; it also marks the job failed, so that the process ends through MPI_Abort
  // instead of waiting in MPI_Finalize for a rank that is gone.
  void notice_arrival(uint64_t seq) override {
    std::lock_guard<std::mutex> lock(mu_);
    forget_finished(foreign_sends_);
    for (int r = 0; r < size_; r++) {
      if (r == rank_) continue;
      foreign_sends_.push_back(Send{static_cast<int64_t>(seq), MPI_REQUEST_NULL});
      MPI_Isend(&foreign_sends_.back().seq, 1, MPI_INT64_T, r, kForeignTag, notify_, &foreign_sends_.back().req);
    }
    drain(kForeignTag, foreign_seen_);
  }
  std::string report_failure(uint64_t seq) override {
    mark_job_failed();
    auto [silent, absent] = silent_and_absent(seq, kForeignTag, foreign_seen_);
    auto list = [&](const std::vector<int>& ranks) {
      std::string out = "rank(s) ";
      for (size_t i = 0; i < ranks.size(); i++)
        out += (i ? ", " : "") + std::to_string(ranks[i]) + " (last seen at #" + std::to_string(foreign_seen_[ranks[i]]) + ")";
      return out;
    };
    std::string out;
    if (!silent.empty()) out = "not answering (stopped or dead?): " + list(silent);
    if (!absent.empty()) out += (out.empty() ? "" : "; ") + std::string("never reached it (stuck or slow?): ") + list(absent);
    return out.empty() ? "every rank reached it and answers (a slow collective or the network?)" : out;
  }

  // The error for a send or recv that timed out or failed: marks the job failed (Note [a failed
  // collective ends the job]) and says whether the peer still answers (Note [liveness probe]).
  std::string p2p_failure_message(const std::string& what, int peer, const std::string& how) {
    bool first = mark_job_failed();
    std::ostringstream os;
    os << "mpi: " << what << " " << how << " on rank " << rank_ << " of " << size_;
    if (!first) return os.str() + " after an earlier failure: " + first_failure();
    std::vector<bool> answered;
    {
      std::lock_guard<std::mutex> lock(mu_);
      answered = probe_peers();
    }
    if (!answered[peer]) os << "; rank " << peer << " is not answering (stopped or dead?)";
    else os << "; rank " << peer << " answers but has not matched it (a send/recv order or size that differs?)";
    record_first_failure(os.str());
    return os.str();
  }

  // The error for a collective that timed out or failed (`how`: "timed out after 5 s"): marks
  // the job failed and names the culprits (Notes [arrival notices], [liveness probe]).
  std::string failure_message(const std::string& what, uint64_t seq, const std::string& how) {
    bool first = mark_job_failed();
    std::ostringstream os;
    os << "mpi: " << what << " #" << seq << " " << how << " on rank " << rank_ << " of " << size_;
    if (!first) return os.str() + " after an earlier failure: " + first_failure();
    os << "; " << culprits(seq);
    record_first_failure(os.str());
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

  // A point-to-point operation: no sequence number, no arrival notice (only two ranks take part).
  template <class F>
  std::shared_ptr<Work> start_p2p(const char* op, int peer, size_t count, DType dtype, F&& call) {
    check_peer(op, peer, rank_, size_);
    std::ostringstream what;
    what << op << " of " << count << " " << dtype_name(dtype) << (op[0] == 's' ? " to" : " from") << " rank " << peer;
    TG_CHECK(!job_failed(), "mpi: ", what.str(), " not started on rank ", rank_, " after an earlier failure: ",
             first_failure());
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = call(&req);
    if (rc != MPI_SUCCESS) throw Error(p2p_failure_message(what.str(), peer, "failed to start (" + mpi_error_text(rc) + ")"));
    auto work = std::make_shared<MpiWork>(this, req, what.str(), 0, nullptr, peer);
    if (op[0] == 'r') {
      work->recv_count = icount(count);
      work->recv_type = mpi_type(dtype);
    }
    return work;
  }

  template <class F>
  std::shared_ptr<Work> start(const char* what, F&& call, std::function<void()> on_done) {
    uint64_t seq = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    // outside the lock: a failing thread may hold it while it probes the peers
    TG_CHECK(!job_failed(), "mpi: ", what, " not started on rank ", rank_, " after an earlier failure: ", first_failure());
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = next_seq();
      started_ = static_cast<int64_t>(seq);
      announce(seq);
      rc = call(&req);
    }
    if (rc != MPI_SUCCESS) throw Error(failure_message(what, seq, "failed to start (" + mpi_error_text(rc) + ")"));
    return std::make_shared<MpiWork>(this, req, what, seq, std::move(on_done));
  }

  void announce(uint64_t seq) {
    forget_finished(sends_);  // the rest stay until MPI is done with their buffer
    for (int r = 0; r < size_; r++) {
      if (r == rank_) continue;
      sends_.push_back(Send{static_cast<int64_t>(seq), MPI_REQUEST_NULL});
      MPI_Isend(&sends_.back().seq, 1, MPI_INT64_T, r, kNoticeTag, notify_, &sends_.back().req);
    }
    drain_notices();
  }

  void drain_notices() { drain(kNoticeTag, last_seen_); }
  // Reads every notice under `tag` that has arrived into `seen` (the latest per peer).
  void drain(int tag, std::vector<int64_t>& seen) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag, notify_, &flag, &st);
      if (!flag) return;
      int64_t s = -1;
      MPI_Recv(&s, 1, MPI_INT64_T, st.MPI_SOURCE, tag, notify_, MPI_STATUS_IGNORE);
      if (s > seen[st.MPI_SOURCE]) seen[st.MPI_SOURCE] = s;
    }
  }

  // ---- liveness (Note [liveness probe]) ----
  static constexpr int kNoticeTag = 0, kPingTag = 1, kPongTag = 2, kForeignTag = 3;
  static constexpr Seconds kProbeSeconds{0.5};
  static constexpr std::chrono::milliseconds kResponderPeriod{10};

  // The responder thread: answers each ping with the latest collective this rank started.
  void answer_pings() {
    while (!stop_responder_) {
      forget_finished(pongs_);
      for (;;) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, kPingTag, notify_, &flag, &msg, &st) != MPI_SUCCESS || !flag) break;
        int64_t ping = 0;
        MPI_Mrecv(&ping, 1, MPI_INT64_T, &msg, MPI_STATUS_IGNORE);
        pongs_.push_back(Send{started_.load(), MPI_REQUEST_NULL});
        MPI_Isend(&pongs_.back().seq, 1, MPI_INT64_T, st.MPI_SOURCE, kPongTag, notify_, &pongs_.back().req);
      }
      std::this_thread::sleep_for(kResponderPeriod);
    }
  }

  // Pings every peer and waits up to kProbeSeconds: true for the peers that answered, whose
  // latest started collective then updates last_seen_. Called once, after the first failure.
  std::vector<bool> probe_peers() {
    std::vector<MPI_Request> answers(size_, MPI_REQUEST_NULL);
    for (int r = 0; r < size_; r++) {
      if (r == rank_) continue;
      MPI_Irecv(&probe_answers_[r], 1, MPI_INT64_T, r, kPongTag, notify_, &answers[r]);
      MPI_Request ping = MPI_REQUEST_NULL;
      if (MPI_Isend(&ping_, 1, MPI_INT64_T, r, kPingTag, notify_, &ping) == MPI_SUCCESS) MPI_Request_free(&ping);
    }
    std::vector<bool> answered(size_, false);
    answered[rank_] = true;
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(kProbeSeconds);
    int pending = size_ - 1;
    while (pending > 0 && Clock::now() < deadline) {
      for (int r = 0; r < size_; r++) {
        int flag = 0;
        if (answered[r] || MPI_Test(&answers[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) continue;
        answered[r] = true;
        pending--;
        last_seen_[r] = std::max(last_seen_[r], probe_answers_[r]);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int r = 0; r < size_; r++) {
      if (answered[r]) continue;
      MPI_Cancel(&answers[r]);
      MPI_Request_free(&answers[r]);  // probe_answers_ outlives the request
    }
    return answered;
  }

  // "ranks 1 (last seen at collective #7), 3 (...)" for the listed peers.
  std::string rank_list(const std::vector<int>& ranks) const {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); i++)
      out += (i ? ", " : "") + std::to_string(ranks[i]) + " (last seen at collective #" +
             std::to_string(last_seen_[ranks[i]]) + ")";
    return out;
  }

  // Who is to blame for collective #seq: the peers not answering, then those that answer but
  // never reached it; the network only when every peer answers and reached it.
  std::string culprits(uint64_t seq) {
    auto [silent, absent] = silent_and_absent(seq, kNoticeTag, last_seen_);
    std::string out;
    if (!silent.empty()) out += "not answering (stopped or dead?): " + rank_list(silent);
    if (!absent.empty()) out += (out.empty() ? "" : "; ") + std::string("never reached it (stuck or slow?): ") + rank_list(absent);
    if (out.empty()) out = "every rank reached it and answers (a slow collective or the network?)";
    return out;
  }

  // The peers that do not answer a liveness probe, and those that answer but whose latest notice
  // under `tag` (read into `seen`) is older than seq.
  std::pair<std::vector<int>, std::vector<int>> silent_and_absent(uint64_t seq, int tag, std::vector<int64_t>& seen) {
    std::lock_guard<std::mutex> lock(mu_);
    drain(tag, seen);
    std::vector<bool> answered = probe_peers();
    drain(tag, seen);
    std::vector<int> silent, absent;
    for (int r = 0; r < size_; r++) {
      if (!answered[r]) silent.push_back(r);
      else if (r != rank_ && seen[r] < static_cast<int64_t>(seq)) absent.push_back(r);
    }
    return {silent, absent};
  }

  struct Send {
    int64_t seq;
    MPI_Request req;
  };
  // Drops the sends at the front that MPI has finished with.
  static void forget_finished(std::deque<Send>& sends) {
    while (!sends.empty()) {
      int flag = 0;
      MPI_Test(&sends.front().req, &flag, MPI_STATUS_IGNORE);
      if (!flag) break;
      sends.pop_front();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL, notify_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mu_;
  std::deque<Send> sends_;  // deque: buffers keep their address while MPI sends them
  std::vector<int64_t> last_seen_;
  std::deque<Send> foreign_sends_;       // Note [arrival notices for a device group]
  std::vector<int64_t> foreign_seen_;
  std::atomic<int64_t> started_{-1};     // the latest collective this rank started
  std::deque<Send> pongs_;               // the responder thread's answers in flight
  std::vector<int64_t> probe_answers_;   // receive buffers of the probe, one per peer
  int64_t ping_ = 0;
  std::atomic<bool> stop_responder_{false};
  std::thread responder_;
};

std::string MpiWork::failure(const std::string& how) {
  return peer_ >= 0 ? g_->p2p_failure_message(what_, peer_, how) : g_->failure_message(what_, seq_, how);
}

bool MpiWork::test() {
  if (done_) return true;
  int flag = 0;
  MPI_Status status;
  int rc = MPI_Test(&req_, &flag, &status);
  if (rc != MPI_SUCCESS) throw Error(failure("failed (" + mpi_error_text(rc) + ")"));
  if (!flag) return false;
  if (recv_count >= 0) {
    int got = 0;
    MPI_Get_count(&status, recv_type, &got);
    TG_CHECK(got == recv_count, "mpi: ", what_, " on rank ", g_->rank(), ": rank ", peer_, " sent ", got, " elements");
  }
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
    if (waited > limit) throw Error(failure(timed_out_text(limit)));
    if (job_failed()) throw Error(failure("abandoned"));
    if (waited < std::chrono::milliseconds(20)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

std::unique_ptr<ProcessGroup> mpi_world_group() { return std::make_unique<MpiGroup>(); }

}  // namespace tg::dist
