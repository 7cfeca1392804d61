// Collective nodes and the engine that runs them (see collective_runner.h).
#include "distributed/collective_runner.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>

#include "distributed/collective_sequence.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg::dist {

namespace {

// Note [collectives of a tensor over several devices]: a rank that trains on several devices of
// its process (Note [a rank's devices] in data_parallel.h) holds logical tensors over a device
// tuple. A collective node across the ranks reads such a tensor's whole value on the tuple's
// first device (the rank's own, where its group's buffers live), runs there, and its result is
// copied to the other devices of the tuple, replicated. For a replicated tensor the first device
// reads its own part only, so the multi-device rewrite computes just that part: what only the
// other devices would have read is never run, and a direct exchange between the devices before
// it (Note [collectives between the devices of a process] in tinygrad/multi.cpp) is in effect a
// reduce onto the first device. Within the process, then across the ranks, then back: the
// hierarchical all-reduce, with one collective across the ranks per node whatever the device count.
// The argument of a collective node over pg reducing by op, after checking that pg has an engine
// and that x's dtype travels (`what` names the caller in errors).
CollectiveArg collective_arg(ProcessGroup& pg, const Tensor& x, ReduceOp op, const char* what) {
  TG_CHECK(op != ReduceOp::Avg, what, ": use Sum and scale (the division then fuses into the next kernel)");
  TG_CHECK(pg.graph_id() > 0, what, ": no CollectiveEngine serves the ", pg.backend(), " group (rank ", pg.rank(), " of ",
           pg.size(), "); create one before building collective nodes");
  check_collective_dtype(what, x.dtype());
  return {op == ReduceOp::Max ? Op::MAX : Op::ADD, pg.graph_id(), pg.size()};
}

Tensor collective_node(Op kind, ProcessGroup& pg, const Tensor& x, ReduceOp op, const char* what) {
  const CollectiveArg arg = collective_arg(pg, x, op, what);
  if (x.devices().size() > 1) return Tensor(make_collective(kind, x.to(x.devices()[0]).uop(), arg)).to(x.devices());
  return Tensor(make_collective(kind, x.uop(), arg));
}

// Note [split tensors across the ranks]: a tensor split over the devices of each rank (a
// tensor-parallel gradient: Note [split gradients across the ranks] in data_parallel.cpp) is
// summed across the ranks part by part. Where the group runs on host memory (mpi, gloo: any CPU
// device's buffer will do), the node is put on the tuple itself and the multi-device rewrite
// makes it one ALLREDUCE per device on that device's part (Note [an all-reduce across the ranks
// of a split tensor] in tinygrad/multi.cpp): nothing moves between the devices. A group whose
// buffers live on one device (nccl: one communicator per rank, on its first GPU) can run a
// collective there only, so the parts are assembled on that device, summed across the ranks in
// one call and split back along axis 0 over the tuple: each part crosses to the first device and
// back, and the result is split as x was, never replicated.
Tensor split_collective(ProcessGroup& pg, const Tensor& x) {
  const CollectiveArg arg = collective_arg(pg, x, ReduceOp::Sum, "all_reduce_split_node");
  const auto devices = x.devices();
  TG_CHECK(devices.size() > 1, "all_reduce_split_node: takes a tensor over several devices, got ", x.describe());
  if (pg.memory_device().empty()) return Tensor(make_collective(Op::ALLREDUCE, x.uop(), arg));
  return Tensor(make_collective(Op::ALLREDUCE, x.to(devices[0]).uop(), arg)).shard(devices, 0);
}

const char* collective_name(Op op) {
  return op == Op::ALLREDUCE ? "all_reduce" : op == Op::REDUCE_SCATTER ? "reduce_scatter" : "all_gather";
}

// Note [collectives on the timeline]: a host group's collective is a span on the engine's
// communication thread from when that thread takes it up to when it is done; on the scheduling
// thread its queueing is a "queue" span and the wait for it a "wait" span (each with the
// collective's sequence number), so the trace shows where in the kernels it was issued, the
// backward kernels running beside it, and where a reader waited. A device group's collective
// runs on the device's communication stream, which the host does not time: its span is the
// host's queueing, on a lane named after the stream.
void trace_args(trace::Span& span, uint64_t seq, size_t bytes, ProcessGroup& pg) {
  if (!trace::enabled()) return;
  span.arg("seq", static_cast<double>(seq));
  span.arg("bytes", static_cast<double>(bytes));
  span.arg("backend", pg.backend());
}

size_t timing_slot(Op kind) { return kind == Op::ALLREDUCE ? 0 : kind == Op::REDUCE_SCATTER ? 1 : 2; }

}  // namespace

Tensor all_reduce_node(ProcessGroup& pg, const Tensor& x, ReduceOp op) {
  return collective_node(Op::ALLREDUCE, pg, x, op, "all_reduce_node");
}

Tensor all_reduce_split_node(ProcessGroup& pg, const Tensor& x) {
  return split_collective(pg, x);  // Note [split tensors across the ranks]
}

Tensor reduce_scatter_node(ProcessGroup& pg, const Tensor& x, ReduceOp op) {
  TG_CHECK(x.ndim() == 1, "reduce_scatter_node: takes a 1-d tensor, got ", x.describe());
  TG_CHECK(x.shape(0) % pg.size() == 0, "reduce_scatter_node: ", x.shape(0), " elements do not split into ", pg.size(),
           " equal blocks (pad it)");
  return collective_node(Op::REDUCE_SCATTER, pg, x, op, "reduce_scatter_node");
}

Tensor all_gather_node(ProcessGroup& pg, const Tensor& x) {
  TG_CHECK(x.ndim() == 1, "all_gather_node: takes a 1-d tensor, got ", x.describe());
  return collective_node(Op::ALLGATHER, pg, x, ReduceOp::Sum, "all_gather_node");
}

CollectiveEngine::CollectiveEngine(ProcessGroup& pg, bool async)
    : pg_(pg), async_(async && pg.memory_device().empty()) {  // device groups queue on a stream instead
  TG_CHECK(pg_.graph_id() == 0, "CollectiveEngine: the ", pg_.backend(), " group already has an engine");
  if (async_) thread_ = std::thread([this] { loop(); });
  id_ = register_collective_runner(this);
  pg_.set_graph_id(id_);
}

CollectiveEngine::~CollectiveEngine() {
  unregister_collective_runner(id_);
  pg_.set_graph_id(0);
  if (async_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void CollectiveEngine::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void CollectiveEngine::check_sequence(const std::vector<const ScheduleItem*>& items) {
  pg_.check_health();
  std::vector<CollectiveDesc> seq;
  seq.reserve(items.size());
  for (const ScheduleItem* item : items) seq.push_back(describe_item(*item));
  uint64_t hash = sequence_hash(seq);
  if (checked_.count(hash)) return;
  agree_on_sequence(pg_, seq, hash);
  checked_.insert(hash);
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr, "*** comm   a sequence of %zu collectives agreed on by %d ranks\n", seq.size(), pg_.size());
}

// Note [collectives on a device's streams]: a group whose buffers live on a device (nccl) queues
// each collective on the device's communication stream: it waits on an event recorded behind
// the compute stream's work so far (the kernels that produce its input), runs, and records an
// event that the compute stream waits on in the returned wait, which run_schedule calls before
// the first item that reads the result. The host queues and returns at once; a collective that
// never ends is the group's watchdog's to find (check_health). During a device-graph capture the
// same calls are recorded into the graph: the fork onto the communication stream and the join
// back are graph edges.
CollectiveWait CollectiveEngine::start_on_device(const ScheduleItem& item) {
  const Op kind = item.ast->op;
  const CollectiveArg arg = item.ast->arg_collective();
  auto out = item.buffers[0], in = item.buffers[1];
  TG_CHECK(canonical_device(out->device()) == pg_.memory_device(), "collective runner: the ", pg_.backend(),
           " group runs on ", pg_.memory_device(), "; the buffer is on ", out->device());
  Device& dev = get_device(out->device());
  void* dst = out->ensure_allocated();
  const void* src = in->ensure_allocated();
  const size_t n_in = static_cast<size_t>(in->numel()), n_out = static_cast<size_t>(out->numel());
  const ReduceOp op = arg.reduce == Op::MAX ? ReduceOp::Max : ReduceOp::Sum;
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr, "*** comm   %4llu %s %s of %zu %s (%.2f MB) on %s's communication stream%s\n",
                 static_cast<unsigned long long>(count_), collective_name(kind),
                 kind == Op::ALLGATHER ? "" : reduce_op_name(op), n_in, dtype_name(out->dtype()), in->nbytes() / 1e6,
                 out->device().c_str(), dev.capturing() ? " (captured into the graph)" : "");
  trace::Span span("collective", collective_name(kind));  // the host's queueing, on the stream's lane
  if (trace::enabled()) span.on_lane(trace::lane(out->device() + " communication stream"));
  trace_args(span, count_, in->nbytes(), pg_);
  count_++;
  if (auto ready = dev.record_event(StreamKind::Compute)) dev.wait_event(StreamKind::Comm, *ready);
  switch (kind) {
    case Op::ALLREDUCE: pg_.all_reduce_into(src, dst, n_out, out->dtype(), op); break;
    case Op::REDUCE_SCATTER: pg_.reduce_scatter(src, dst, n_out, out->dtype(), op); break;
    default: pg_.all_gather(src, dst, n_in, out->dtype()); break;
  }
  std::shared_ptr<DeviceEvent> done = dev.record_event(StreamKind::Comm);
  if (!done) return nullptr;
  return [&dev, done] { dev.wait_event(StreamKind::Compute, *done); };
}

CollectiveWait CollectiveEngine::start(const ScheduleItem& item) {
  const Op kind = item.ast->op;
  const CollectiveArg arg = item.ast->arg_collective();
  TG_ASSERT(arg.ranks == pg_.size(), "collective node for ", arg.ranks, " ranks run by a group of ", pg_.size());
  if (!pg_.memory_device().empty()) return start_on_device(item);
  auto out = item.buffers[0], in = item.buffers[1];
  TG_CHECK(out->device().rfind("CPU", 0) == 0, "collective runner: the ", pg_.backend(),
           " backend runs collectives on host memory; the buffer is on ", out->device());
  ReduceOp op = arg.reduce == Op::MAX ? ReduceOp::Max : ReduceOp::Sum;
  void* dst = out->ensure_allocated();  // allocations stay on the scheduling thread
  const void* src = in->ensure_allocated();
  uint64_t id = count_++;
  const size_t n_in = static_cast<size_t>(in->numel()), n_out = static_cast<size_t>(out->numel());
  const DType dtype = out->dtype();
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr, "*** comm   %4llu %s %s of %zu %s (%.2f MB)%s\n", static_cast<unsigned long long>(id),
                 collective_name(kind), kind == Op::ALLGATHER ? "" : reduce_op_name(op), n_in, dtype_name(dtype),
                 in->nbytes() / 1e6, async_ ? " started" : "");
  auto task = [this, kind, out, in, dst, src, n_in, n_out, dtype, op, id] {
    auto t0 = std::chrono::steady_clock::now();
    if (async_ && trace::enabled()) trace::thread_id("communication (" + pg_.backend() + ")");
    trace::Span span("collective", collective_name(kind));
    trace_args(span, id, in->nbytes(), pg_);
    switch (kind) {
      case Op::ALLREDUCE:
        if (dst != src) std::memcpy(dst, src, out->nbytes());  // in place: Note [all-reduces in place] in schedule.cpp
        pg_.all_reduce(dst, n_out, dtype, op)->wait();
        break;
      case Op::REDUCE_SCATTER: pg_.reduce_scatter(src, dst, n_out, dtype, op)->wait(); break;
      default: pg_.all_gather(src, dst, n_in, dtype)->wait(); break;
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (async_) {
      std::lock_guard<std::mutex> lock(mu_);
      timing_[timing_slot(kind)].busy_s += took;
    }
    if (knobs::DEBUG >= 1 && async_)
      std::fprintf(stderr, "*** comm   %4llu %s done in %.3f ms\n", static_cast<unsigned long long>(id),
                   collective_name(kind), took * 1e3);
  };
  if (!async_) {
    task();
    return nullptr;
  }
  trace::Span queued("queue", "queue");
  queued.arg("for", collective_name(kind));
  queued.arg("seq", static_cast<double>(id));
  auto job = std::make_shared<std::packaged_task<void()>>(task);
  std::shared_future<void> done = job->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back([job] { (*job)(); });
  }
  cv_.notify_one();
  return [this, done, kind, id] {
    trace::Span span("wait", "wait");
    span.arg("for", collective_name(kind));
    span.arg("seq", static_cast<double>(id));
    auto t0 = std::chrono::steady_clock::now();
    done.get();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    timing_[timing_slot(kind)].waited_s += waited;
  };
}

// Note [hidden communication]: busy_s minus waited_s is the communication that ran while the
// scheduling thread did other work (launched kernels): what the order of a schedule hid. A
// collective waited for at once (issued just before its reader) adds as much to both.
CollectiveEngine::Timing CollectiveEngine::timing(Op kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return timing_[timing_slot(kind)];
}

}  // namespace tg::dist
