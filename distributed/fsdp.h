// Fully sharded data parallelism (ZeRO-3, as PyTorch's FSDP2 `fully_shard`): every rank keeps
// only its dim-0 shard of each parameter (Note [fsdp shards]) and the optimizer state of that
// shard. Parameters are grouped into units, one per module that owns parameters (a Linear's
// weight and bias); each unit's shards are all-gathered with one ALLGATHER graph node, issued
// while the unit before it computes (Note [gathers layer by layer]), the model's parameters
// are views of it, and backward gathers the unit again. After backward each
// unit's gradients are reduce-scattered (one REDUCE_SCATTER node), so every rank holds the
// average of its shards, and an ordinary optimizer updates the shards. The whole step is one
// schedule of graph nodes and kernels (Note [an fsdp step on the graph]), so TinyJit replays it.
// Element-wise optimizers (SGD, Adam, AdamW) give the data-parallel result; LAMB is refused.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "distributed/coordinated_step.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "tinygrad/nn/module.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/state.h"

namespace tg::dist {

// One parameter's place in the sharded layout.
struct FsdpParam {
  std::string name;    // the model's dotted name
  Tensor* param;       // the model's tensor (a placeholder between steps: Note [fsdp placeholders])
  Shape shape;         // its global shape
  int64_t rows = 0;    // dim-0 rows of one shard (the global dim 0 rounded up to the world size, / world)
  int64_t offset = 0;  // where its shard starts in its unit's flat shard
  int64_t numel() const { return prod(shard_shape()); }
  Shape shard_shape() const;
};

// The dim-0 rows of each of `world` shards of a parameter of global `shape` (Note [fsdp shards]:
// its dim 0, or 1 for a 0-d one, rounded up to a multiple of world, over world).
int64_t fsdp_shard_rows(const Shape& shape, int64_t world);

// The parameters of one module, gathered and reduced together.
struct FsdpUnit {
  std::string module;             // dotted name of the module ("" for the root)
  std::vector<size_t> params;     // indices into Fsdp::params()
  int64_t shard_numel = 0;        // elements of this rank's flat shard of the unit
};

// Where a step gathers each unit's parameters (Note [gathers layer by layer] in fsdp.cpp).
enum class FsdpGathers {
  AllAtTop,         // every unit's ALLGATHER at the top of the step, kept to its end
  KeptForBackward,  // each unit's gather one unit ahead of its first kernel, kept for backward
  Resharded,        // as KeptForBackward, and gathered again for backward (FSDP's reshard_after_forward)
};

// "resharded", "kept" or "top" (the config's distributed.fsdp_gathers).
FsdpGathers fsdp_gathers(const std::string& name);

struct FsdpOptions {
  // The dtype gradients cross in (Note [bfloat16 gradients] in data_parallel.cpp).
  DType grad_dtype = DType::Float32;
  FsdpGathers gathers = FsdpGathers::Resharded;
};

class Fsdp {
 public:
  // Shards `model`'s parameters over pg: they must be float32 and equal on every rank (broadcast
  // them first). The model's parameters become placeholders; the optimizer that
  // `make_optimizer` builds holds the shards, in the model's parameter order. A CollectiveEngine
  // must serve pg.
  Fsdp(ProcessGroup& pg, nn::Module& model, const OptimizerFactory& make_optimizer, FsdpOptions opt = {});

  // Before the forward pass of a training step: every model parameter becomes a leaf (requiring
  // gradients) that views its unit's lazy ALLGATHER.
  void unshard();
  // After backward: reduce-scatter of the gradients, the decision (skip check, clipping), the
  // update of the shards, realized with `also_realize` (the loss: it marks the forward pass,
  // Note [gathers layer by layer]) in one schedule. The model's parameters are placeholders
  // again afterwards.
  LazyStepOutcome step_lazy(const Tensors& also_realize, const StepOptions& opt);
  StepOutcome step(const Tensors& also_realize, const StepOptions& opt);

  // Every rank calls these together: the model's parameters as realized full tensors (for an
  // evaluation or a state_dict), and back to placeholders.
  void materialize();
  void release();
  // Takes this rank's shards from the model's parameters again (after they were loaded), then
  // releases them.
  void reload_parameters();

  nn::Optimizer& shard_optimizer() { return *optim_; }
  const std::vector<FsdpParam>& params() const { return params_; }
  const std::vector<FsdpUnit>& units() const { return units_; }
  // This rank's shards, in the model's parameter order.
  std::vector<Tensor*> shards();

  // A sharded checkpoint (Note [fsdp checkpoints]): this rank's part (model shards under
  // "model.<name>", optimizer shard state under "optim.<key>"), and the layout that the
  // metadata file records.
  nn::StateDict shard_state_dict() const;
  nn::Metadata layout_metadata() const;
  // Loads this rank's part of a full (unsharded) optimizer state dict (the parameters come
  // through the model and reload_parameters()).
  void load_full_optimizer_state(const nn::StateDict& optim_sd);

 private:
  void add_parameter(const std::string& name, Tensor* p);
  // The ALLGATHER of these parameters' shards, flat, in this order ([world * their shard numel]).
  Tensor gathered(const std::vector<size_t>& params, bool again = false);
  std::vector<std::optional<Tensor>> backward_gradients(const Tensors& forward);  // Note [gathers layer by layer]
  std::unordered_map<const UOp*, UOpPtr> backward_leaves(const std::unordered_set<const UOp*>& read);
  Tensor reduced_unit(const FsdpUnit& u, const std::vector<std::optional<Tensor>>& grads);  // averaged gradient shard
  Tensor slice_shard(const FsdpParam& p, const Tensor& full) const;  // this rank's rows of a full tensor
  Tensor placeholder(const FsdpParam& p) const;
  Tensors shard_gradients(const Tensors& reduced) const;  // each shard's slice of its unit's reduced gradient
  LazyStepOutcome decide(Tensors& grads, const StepOptions& opt, Tensors& values);  // skip check, clipping
  void keep_gradients(const Tensors& reduced);      // the shards' gradients as views of plain buffers

  ProcessGroup& pg_;
  FsdpOptions opt_;
  std::vector<FsdpParam> params_;
  std::vector<FsdpUnit> units_;
  std::vector<std::unique_ptr<Tensor>> shards_;  // stable addresses: the optimizer holds pointers
  std::unique_ptr<nn::Optimizer> optim_;
  Tensors gathered_;                             // this step's ALLGATHER outputs, by unit
};

// Reassembles full tensors from the per-rank shard state dicts of an fsdp checkpoint (rank r's
// at index r) and its layout metadata: {model state dict, optimizer state dict}, unsharded.
std::pair<nn::StateDict, nn::StateDict> unshard_checkpoint(const std::vector<nn::StateDict>& ranks,
                                                            const nn::Metadata& layout);

}  // namespace tg::dist
