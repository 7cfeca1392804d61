// Optimizer steps that every rank takes together. After the buckets' all-reduces every rank
// holds the same averaged gradients, bit for bit (Note [one decision from the reduced
// gradients]), so the decisions taken from them are the same on every rank: a non-finite
// gradient on any rank makes all of them skip the step, and gradient-norm clipping uses the
// global norm. The decision is taken on the device (Note [the decision on the device]), so a
// step built with coordinated_step_lazy can be captured and replayed by TinyJit.
#pragma once
#include <optional>

#include "distributed/process_group.h"
#include "tinygrad/nn/optim.h"

namespace tg::dist {

struct StepOutcome {
  bool skipped = false;  // a non-finite gradient somewhere: no parameter or state changed
  double grad_norm = 0;  // global L2 norm of the averaged gradients before clipping (0 when not computed)
};

struct StepOptions {
  double max_norm = 0;         // clip the global gradient norm to this (0: no clipping)
  bool skip_nonfinite = true;  // check the gradients and skip the step on inf/NaN
  bool report_norm = false;    // without the two above: still compute the global norm (LazyStepOutcome::grad_norm, no ok)
  // the gradients' global norm for the skip check and the report, where the caller has it for
  // less than a reduce per parameter (DataParallel::grad_norm_lazy: one per bucket); by default
  // nn::grad_norm_lazy. Clipping ignores it (Note [the norm from the buckets] in data_parallel.cpp)
  std::optional<Tensor> grad_norm;
};

// The outcome of a step as realized 0-d device tensors (empty when the step checked nothing; only
// grad_norm when it checked nothing but StepOptions::report_norm asked for the norm).
struct LazyStepOutcome {
  std::optional<Tensor> ok;         // bool: the update was applied (false: skipped on every rank)
  std::optional<Tensor> grad_norm;  // float32: the global norm before clipping (this rank's inf/NaN when skipped)
};

// Note [one decision from the reduced gradients]: an all-reduce leaves the same bits on every
// rank (NCCL reduces each element once and sends the sum on unchanged, whether by ring or tree;
// the MPI, gloo and local backends likewise hand every rank one result), and a non-finite
// gradient on one rank makes the sum non-finite on all of them (inf and NaN survive addition).
// So the norm of the reduced gradients, computed by the same kernels on every rank, is the same
// everywhere, and so are the skip and the clipping scale taken from it: no second collective
// is needed to agree, as PyTorch's DDP relies on for clip_grad_norm_ and GradScaler. (Zero1
// and Fsdp hold only a shard of the reduced gradients, so they all-reduce their sum of squares.)
//
// Note [the decision on the device]: with clipping or the skip check, the step computes the
// global gradient norm (nn::clip_grad_norm_lazy when clipping, whose scale min(1, max_norm /
// (norm + 1e-6)) is a device value that fuses into the update kernels) and builds the update with
// Optimizer::step_if(ok), ok = (the norm is finite). Everything (the buckets in `first`, the
// loss, the norm, the flag, the update) is one schedule with no host read, so TinyJit can replay
// it. A non-finite gradient skips the step whenever the check runs (clipping alone included: a
// clipped non-finite gradient would still be non-finite). The optimizer counts a skipped step
// on the device (Note [a step skipped on the device]), so a caller need not read ok after every
// step: settle_step reads it, or Optimizer::settle alone takes back the skipped steps where the
// host needs the count (the trainer: Note [skipped steps are read at log steps] in
// launcher/trainer.cpp).
LazyStepOutcome coordinated_step_lazy(nn::Optimizer& optim, const Tensors& first, const StepOptions& opt);
// Reads a lazy outcome on the host (waiting for the step) and settles the optimizer's count of
// skipped steps (Optimizer::settle).
StepOutcome settle_step(nn::Optimizer& optim, const LazyStepOutcome& lazy);

// coordinated_step_lazy, then settle_step: realizes `first` (the buckets' all-reduce outputs,
// then the loss and metrics), decides as above and updates unless skipped, in one schedule.
StepOutcome coordinated_step(nn::Optimizer& optim, const Tensors& first, const StepOptions& opt);

}  // namespace tg::dist
