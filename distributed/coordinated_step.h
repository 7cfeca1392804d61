// Optimizer steps that every rank takes together. After the buckets' all-reduces every rank
// holds the same averaged gradients; one more all-reduce (max over [non-finite flag, norm])
// makes the decisions identical on every rank even where float results could differ: a
// non-finite gradient on any rank makes all of them skip the step, and gradient-norm clipping
// uses the global norm.
#pragma once
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
};

// Realizes `first` (the buckets' all-reduce outputs, then the loss and metrics), decides as
// above, and runs optim.step() unless skipped. Without clipping and checks it is one schedule.
StepOutcome coordinated_step(ProcessGroup& pg, nn::Optimizer& optim, const Tensors& first, const StepOptions& opt);

}  // namespace tg::dist
