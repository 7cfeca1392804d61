// TinyJit: captures the kernels a step function runs once and replays them on later calls with
// the same input shapes, without building the graph, scheduling, rendering or looking programs
// up again. The trainer wraps its step in one; JIT=0 turns capturing off.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tinygrad/engine/realize.h"
#include "tinygrad/tensor.h"

namespace tg {

// Note [what a captured step is]: the first call with a given input signature (shapes, dtypes,
// devices of the inputs) runs the function normally; the second captures it: every item that
// run_schedule runs is recorded with its buffers and compiled launch (set_exec_recorder),
// every Tensor::assign with the buffer the tensor held before and after (the tensor observer
// hook, Note [tensor observers] in engine/observe.h), and the host work registered with
// jit_on_replay. Later calls replay that record. The buffers of a record play one of five parts:
//   input   the buffer of input i: rebound to the buffer of this call's input i
//   state   the buffer an assigned tensor (a parameter, optimizer state, BatchNorm statistic)
//           held when the capture began: rebound to the buffer that tensor holds now, so a
//           checkpoint load or another capture between calls is seen (one per part for a
//           tensor over several devices: Note [a state tensor over several devices])
//   fresh   written in the step and escaping it (the new value of an assigned tensor, an
//           output such as the loss): a new buffer on every replay, so a loss returned by one
//           replay stays valid after the next; the assigned tensors are pointed at their new
//           buffers and the outputs are returned as new tensors
//   in place  the new value of a state tensor whose update kernel may write over the old one
//           (Note [state updated in place] in jit_in_place.cpp): bound to the buffer the tensor
//           holds, or to a copy of it while something outside the step holds that buffer too
//   fixed   everything else (intermediates, constants, the optimizer's per-step scalars, whose
//           contents the replayed host work rewrites, tensors the step reads but does not
//           assign): the captured buffer itself. Assigning such a tensor between calls (new
//           weights for a frozen layer) makes the capture stale: the next call captures again.
// A replay runs the host work (the optimizer counts the step and writes lr and bias
// corrections into its scalar buffers), binds the buffers, and runs the items through
// run_exec_items: kernels are launched directly, copies copied, collectives handed to the
// registered collective runner as in run_schedule.
//
// What a captured function must keep: the same computation on every call from the second on
// (no host control flow that depends on data). A function that reads device data on the host
// while it is being captured (Tensor::item, to_vector; e.g. clip_grad_norm, a host-side
// skip-on-NaN decision) cannot be replayed; a decision taken on the device and returned as an
// output, read by the caller after the call (dist::coordinated_step_lazy), can: TinyJit then runs it normally on every call and says why
// (disabled_reason(), DEBUG=1). Tensors that only the function's own graph saw (gradients held in
// .grad()) are not updated by replays; the outputs and assigned tensors are. Tensors created
// from host data inside the function are captured as constants. Memory: an optimizer step
// that is being captured leaves no gradients (Note [a capture leaves no gradients] in
// nn/optim.cpp), so the capturing call's graph dies with the call; the step's intermediates
// share memory as in Note [sharing fixed intermediates] (jit_arena.cpp).
//
// A call whose input signature has no capture yet starts over for that signature (runs
// normally, captures on its next call): each signature keeps its own capture, so a smaller last
// batch of an epoch gets one too. Call reset() to drop them.
//
// Note [a state tensor over several devices]: a tensor over a device tuple (tinygrad/multi.h;
// the parameters and optimizer moments of train.devices or model.tensor_parallel, replicated or
// split) holds one buffer per device: its value is a MULTI of its parts' buffers. Its assign
// reaches the JIT with every part's buffer before and after (TensorObserver::on_assign_parts),
// and each part is a state slot of its own, keyed by (state tensor, part): a replay binds part
// p of the tensor's value now to the slot, and afterwards points the tensor at a MULTI of its
// parts' fresh buffers, with the split it had. The captured list holds every device's kernels
// and the copies and collectives between them, in the order run_schedule ran them; replays run
// it item by item (a device graph takes only a list on one device). Outputs over a tuple (a loss
// the rewrite left replicated) come back the same way, as a MULTI of fresh buffers. The inputs
// must be on one device: a step that shards its batch itself (the trainer's place_batch) is
// captured with the shard's copies; an input over a tuple is refused (disabled_reason()).
//
// Note [device graphs]: a device that can launch a captured list as one graph (CUDA graphs)
// registers a GraphFactory for its base name. After a capture whose items all run on such a
// device, TinyJit asks the factory for a graph (the list it is given has the buffers that are
// bound anew on every replay set to null) and replays through it; the graph receives the
// items with this replay's buffers bound (inputs and fresh buffers change between replays, so
// it updates those kernel arguments), and must run them as run_exec_items would. CUDA registers
// one (runtime/cuda_graph.cpp); elsewhere, and where a factory declines a list, replays go
// through run_exec_items.
class ExecGraph {
 public:
  virtual ~ExecGraph() = default;
  virtual void run(const std::vector<ExecItem>& bound_items) = 0;
};
using GraphFactory = std::function<std::unique_ptr<ExecGraph>(const std::vector<ExecItem>& items)>;
void register_graph_factory(const std::string& device_base, GraphFactory factory);

class TinyJit {
 public:
  using StepFn = std::function<Tensors(const Tensors& inputs)>;
  explicit TinyJit(StepFn fn, std::string name = "step");
  ~TinyJit();
  TinyJit(const TinyJit&) = delete;
  TinyJit& operator=(const TinyJit&) = delete;

  // Runs the step (normally, capturing, or replaying; see Note [what a captured step is]).
  // The inputs are realized first; the outputs come back realized.
  Tensors operator()(const Tensors& inputs);

  void reset();  // drops every capture and a disabled_reason (the next call runs normally)
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  // Bytes of the arenas that hold the captures' intermediates (Note [one arena for a captured
  // step's intermediates] in jit.cpp).
  size_t arena_bytes() const;
  const std::string& disabled_reason() const { return disabled_reason_; }  // empty while usable
  const std::string& name() const { return name_; }

  struct Capture;

 private:
  struct Entry;
  Tensors replay(Capture& c, const Tensors& in);
  Tensors capture(Entry& e, const Tensors& in, const std::string& sig);  // the second call of a signature
  StepFn fn_;
  std::string name_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;  // by input signature
  int64_t captures_ = 0, replays_ = 0;
  std::string disabled_reason_;
};

// Hooks for the code a step runs (no-ops unless this thread is capturing).
bool jit_capturing();
// Host work that every replay must repeat before the kernels (per-step scalars, host counters).
void jit_on_replay(std::function<void()> fn);
// Tensor::assign and host reads (Tensor::to_vector, item) reach the JIT through the engine's
// tensor observer hook (Note [tensor observers] in engine/observe.h), not through calls here.

}  // namespace tg
