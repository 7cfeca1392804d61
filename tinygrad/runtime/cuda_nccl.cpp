// NCCL's runner of the collectives between the GPUs of one process (see cuda_nccl.h).
//
// Note [NCCL between the GPUs of a process]: a tuple of CUDA devices gets one communicator per
// device, made together by ncclCommInitAll (a clique of the process's GPUs, in tuple order) when
// its first collective runs, and kept for the process's life (cached per tuple: the runner is
// made once per tuple, device.h's tuple_collectives). A collective item (Note [one item for a
// collective between devices] in schedule/schedule.cpp) is one grouped call: ncclGroupStart, one
// ncclAllReduce / ncclAllGather / ncclReduceScatter per device on that device's communication
// stream, ncclGroupEnd. It is ordered with the kernels as the collectives across ranks are (Note
// [collectives on a device's streams] in distributed/collective_runner.cpp): each communication
// stream first waits on an event recorded on its device's compute stream behind the kernels that
// made the operand, and the returned wait makes each compute stream wait on an event recorded on
// its communication stream after the call; run_schedule calls it before the first item that
// touches one of the buffers, which until then stay alive (the memory pool is ordered by the
// compute streams alone). The host never waits. Under a CUDA graph capture (a one-device tuple's
// replay; lists over several devices are replayed item by item) the same calls, forks and joins
// are recorded into the graph, and a graph holding collectives is re-instantiated, never updated
// (Note [CUDA graphs for replays] in cuda_graph.cpp). The communicators are blocking: the GPUs
// are this process's own, so no peer can vanish mid-collective as a rank can, and a failed call
// throws, naming the call and the device's place in the tuple. NCCL sets the thread's device
// itself, so the cached current context is forgotten after each call (Context::forget_current).
#include "tinygrad/runtime/cuda_nccl.h"

#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cuda_context.h"
#include "tinygrad/runtime/nccl_api.h"

namespace tg::cuda {

namespace {

// The GPU ordinal of a canonical CUDA device name: "CUDA" -> 0, "CUDA:3" -> 3.
int ordinal_of(const std::string& device) {
  auto colon = device.find(':');
  return colon == std::string::npos ? 0 : std::stoi(device.substr(colon + 1));
}

// Bool travels as bytes: its sum (OR) is their max, its product (AND) their min.
ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::Bool: case DType::UInt8: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(Op reduce, DType d) {
  const bool boolean = d == DType::Bool;
  switch (reduce) {
    case Op::MAX: return ncclMax;
    case Op::MUL: return boolean ? ncclMin : ncclProd;
    default: return boolean ? ncclMax : ncclSum;
  }
}

const char* kind_name(Op kind) {
  return kind == Op::ALLREDUCE ? "all_reduce" : kind == Op::REDUCE_SCATTER ? "reduce_scatter" : "all_gather";
}

class NcclClique : public CollectiveRunner {
 public:
  explicit NcclClique(std::vector<std::string> devices) : devices_(std::move(devices)) {
    for (auto& d : devices_) {
      devs_.push_back(&get_device(d));
      tuple_ += (tuple_.empty() ? "" : ",") + d;
    }
  }

  CollectiveWait start(const ScheduleItem& item) override {
    const size_t n = devs_.size();
    TG_ASSERT(item.buffers.size() == 2 * n && item.outputs == n, "nccl over ", tuple_, ": an item of ",
              item.buffers.size(), " buffers and ", item.outputs, " outputs");
    std::call_once(opened_, [this] { open(); });
    const Op kind = item.ast->op;
    const DType dtype = item.buffers[0]->dtype();
    std::vector<void*> out(n), in(n);
    for (size_t k = 0; k < n; k++) {
      TG_ASSERT(item.buffers[k]->device() == devices_[k], "nccl over ", tuple_, ": result ", k, " on ",
                item.buffers[k]->device());
      out[k] = item.buffers[k]->ensure_allocated();
      in[k] = item.buffers[n + k]->ensure_allocated();
    }
    const size_t count = static_cast<size_t>(kind == Op::REDUCE_SCATTER ? item.buffers[0]->numel()
                                                                         : item.buffers[n]->numel());
    const ncclRedOp_t op = nccl_op(item.ast->arg_collective().reduce, dtype);
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "*** comm   %4llu %s of %zu %s (%.2f MB a device) over %s: NCCL, one grouped call%s\n",
                   static_cast<unsigned long long>(count_), kind_name(kind), static_cast<size_t>(item.buffers[n]->numel()),
                   dtype_name(dtype), item.buffers[n]->nbytes() / 1e6, tuple_.c_str(),
                   devs_[0]->capturing() ? " (captured into the graph)" : "");
    trace::Span span("collective", kind_name(kind));  // the host's queueing
    if (trace::enabled()) span.arg("devices", tuple_);
    count_++;
    for (Device* d : devs_)
      if (auto ready = d->record_event(StreamKind::Compute)) d->wait_event(StreamKind::Comm, *ready);
    grouped([&](size_t k, cudaStream_t stream) {
      const auto t = nccl_type(dtype);
      switch (kind) {
        case Op::ALLREDUCE: return nccl::api().ncclAllReduce(in[k], out[k], count, t, op, comms_[k], stream);
        case Op::REDUCE_SCATTER: return nccl::api().ncclReduceScatter(in[k], out[k], count, t, op, comms_[k], stream);
        default: return nccl::api().ncclAllGather(in[k], out[k], count, t, comms_[k], stream);
      }
    });
    std::vector<std::shared_ptr<DeviceEvent>> done;
    for (Device* d : devs_) done.push_back(d->record_event(StreamKind::Comm));
    return [devs = devs_, done] {
      for (size_t k = 0; k < devs.size(); k++) devs[k]->wait_event(StreamKind::Compute, *done[k]);
    };
  }

 private:
  void open() {
    std::vector<int> ordinals;
    for (auto& d : devices_) ordinals.push_back(ordinal_of(d));
    comms_.assign(devices_.size(), nullptr);
    ncclResult_t r = nccl::api().ncclCommInitAll(comms_.data(), static_cast<int>(ordinals.size()), ordinals.data());
    Context::forget_current();
    nccl::check(r, "ncclCommInitAll", 0);
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "*** comm   NCCL communicators of %s made (%s)\n", tuple_.c_str(), nccl_description().c_str());
  }

  // One grouped call: call(k, device k's communication stream) for every device between
  // ncclGroupStart and ncclGroupEnd, which is reached however a call ends.
  template <class Call>
  void grouped(Call call) {
    TG_NCCL(0, ncclGroupStart);
    ncclResult_t first = ncclSuccess;
    size_t failed = 0;
    for (size_t k = 0; k < devs_.size() && first == ncclSuccess; k++) {
      devs_[k]->make_current();
      first = call(k, static_cast<cudaStream_t>(devs_[k]->native_stream(StreamKind::Comm)));
      failed = k;
    }
    ncclResult_t end = nccl::api().ncclGroupEnd();
    Context::forget_current();
    nccl::check(first, "a collective call", static_cast<int>(failed));
    nccl::check(end, "ncclGroupEnd", 0);
  }

  std::vector<std::string> devices_;
  std::vector<Device*> devs_;
  std::string tuple_;
  std::vector<ncclComm_t> comms_;  // never destroyed: they serve until the process ends
  std::once_flag opened_;
  uint64_t count_ = 0;
};

}  // namespace

bool nccl_available() { return nccl::unavailable_reason().empty(); }

std::string nccl_description() { return nccl::status(); }

void register_nccl_collectives() {
  register_collective_library("NCCL", [](const std::vector<std::string>& devices) {
    return register_collective_runner(new NcclClique(devices));  // leaked with its communicators
  });
}

}  // namespace tg::cuda
