// ZeRO-1: optimizer state sharded over the ranks. The parameters are seen as one flat vector
// (zero-padded to a multiple of the world size); rank r owns block r of it and keeps optimizer
// state for that block only. A step is built on the graph (Note [a ZeRO-1 step on the graph]):
// a REDUCE_SCATTER of the flat gradient gives each rank the sum of its block, an ALLREDUCE of
// [non-finite flag, sum of squares] decides the skip and the clipping norm on every rank alike,
// this rank's block is updated by an ordinary optimizer, and an ALLGATHER of the new blocks gives
// every rank the whole parameters. No host read, so TinyJit replays it. Element-wise optimizers
// (SGD, Adam, AdamW) give exactly the data-parallel result; LAMB (which needs per-parameter
// norms) is refused.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/coordinated_step.h"
#include "distributed/process_group.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/state.h"

namespace tg::dist {

using OptimizerFactory = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor*>)>;

class Zero1 {
 public:
  // The parameters must be float32 and equal on every rank (broadcast them first). A
  // CollectiveEngine must serve pg. The gradient travels in grad_dtype (float32 or bfloat16, Note
  // [bfloat16 gradients] in data_parallel.cpp).
  Zero1(ProcessGroup& pg, std::vector<Tensor*> params, const OptimizerFactory& make_optimizer,
        DType grad_dtype = DType::Float32);

  // After backward (gradients local to this rank): the whole step as graph collectives and
  // kernels, realized with `also_realize` (the loss) and, when the step checks or clips, the 0-d
  // outcome (ok, global norm) that settle_step(shard_optimizer(), ...) reads afterwards.
  LazyStepOutcome step_lazy(const Tensors& also_realize, const StepOptions& opt);
  // step_lazy, then settle_step.
  StepOutcome step(const Tensors& also_realize, const StepOptions& opt);

  // Takes this rank's block from the parameters again (after they were loaded from a file).
  void reload_parameters();

  nn::Optimizer& shard_optimizer() { return *optim_; }  // set lr here; its state is this rank's block
  int64_t shard_size() const { return shard_; }
  int64_t flat_size() const { return total_; }

  // A sharded checkpoint (Note [zero1 checkpoints]): the layout the metadata file records for
  // parameters of these names (in the order the constructor was given them).
  nn::Metadata layout_metadata(const std::vector<std::string>& names) const;
  // Loads this rank's block of a full optimizer state dict (per parameter: "<i>.<state>" of
  // parameter i's shape, and "step"), as a data-parallel optimizer of the same parameters holds it.
  void load_full_optimizer_state(const nn::StateDict& full);

 private:
  Tensor averaged_block();                                    // reduce-scatter of the flat gradient, / N
  void gather_parameters(const Tensors& also_realize);        // all-gather of the blocks into the parameters

  ProcessGroup& pg_;
  std::vector<Tensor*> params_;
  int64_t total_ = 0, shard_ = 0;
  DType grad_dtype_;
  Tensor block_;  // this rank's block of the flat parameters
  std::unique_ptr<nn::Optimizer> optim_;
};

// A shape as comma-separated sizes ("30,784"; "" for a 0-d shape), as checkpoint layouts write
// them, and back (an error names `what` and the text).
std::string shape_csv(const Shape& s);
Shape parse_shape_csv(const std::string& text, const std::string& what);

// A parameter of a sharded checkpoint's layout: its name and global shape.
struct ParamLayout {
  std::string name;
  Shape shape;
};

// The parameters a zero1 checkpoint's metadata records (zero1_layout), in their flat order.
std::vector<ParamLayout> zero1_layout(const nn::Metadata& meta);

// An optimizer state key "<i>.<state>" -> {i, state}; {-1, key} for other keys ("step").
std::pair<int64_t, std::string> split_state_key(const std::string& key);
// The elements of each rank's block of a flat vector of `total` elements over `world` ranks (the
// vector zero-padded to world blocks).
int64_t zero1_block_size(int64_t total, int64_t world);

}  // namespace tg::dist
