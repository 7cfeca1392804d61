// ZeRO-1: optimizer state sharded over the ranks. The parameters are seen as one flat vector
// (zero-padded to a multiple of the world size); rank r owns block r of it and keeps optimizer
// state for that block only. A step reduce-scatters the flat gradient (each rank gets the
// average of its block), checks and clips with one all-reduce of [sum of squares, non-finite],
// updates its block with an ordinary optimizer, and all-gathers the new parameter blocks.
// Element-wise optimizers (SGD, Adam, AdamW) give exactly the data-parallel result; LAMB (which
// needs per-parameter norms) is refused.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "distributed/coordinated_step.h"
#include "distributed/process_group.h"
#include "tinygrad/nn/optim.h"

namespace tg::dist {

using OptimizerFactory = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor*>)>;

class Zero1 {
 public:
  // The parameters must be float32 and equal on every rank (broadcast them first).
  Zero1(ProcessGroup& pg, std::vector<Tensor*> params, const OptimizerFactory& make_optimizer);

  // After backward (gradients local to this rank): realizes the gradients and `also_realize`
  // (the loss) in one schedule, then reduce-scatter, decision, local update, all-gather.
  StepOutcome step(const Tensors& also_realize, const StepOptions& opt);

  // Takes this rank's block from the parameters again (after they were loaded from a file).
  void reload_parameters();

  nn::Optimizer& shard_optimizer() { return *optim_; }  // set lr here; its state is this rank's block
  int64_t shard_size() const { return shard_; }
  int64_t flat_size() const { return total_; }

 private:
  ProcessGroup& pg_;
  std::vector<Tensor*> params_;
  int64_t total_ = 0, shard_ = 0;
  Tensor block_;  // this rank's block of the flat parameters
  std::unique_ptr<nn::Optimizer> optim_;
};

}  // namespace tg::dist
