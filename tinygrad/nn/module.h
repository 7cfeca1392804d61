// tg::nn::Module: the base of every layer and model. A module owns named parameters (trainable
// tensors), buffers (state such as BatchNorm's running statistics) and child modules; it lists
// them recursively with dotted names ("layers.0.weight"), snapshots them as a state dict and
// loads one back, and carries the train/eval flag and the compute dtype down to its children.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tinygrad/tensor.h"

namespace tg::nn {

using StateDict = std::map<std::string, Tensor>;

// Note [modules hold pointers to their own members]: a module registers pointers to Tensor
// members and to child modules (members or std::unique_ptr), so it must stay at one address
// after construction: Module is neither copyable nor movable. Tensor is a handle, and
// Tensor::assign replaces a tensor's value in place, so an optimizer or load_state_dict that
// holds a registered Tensor* updates the module's own tensor.
class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // The computation. The default throws: a module that is only a container need not have one.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // The type's name for messages ("Linear", "BatchNorm2d").
  virtual std::string type_name() const { return "Module"; }

  // Recursive listings, in registration order, children after this module's own tensors.
  std::vector<std::pair<std::string, Tensor*>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor*>> named_buffers() const;
  std::vector<Tensor*> parameters() const;
  std::vector<Tensor*> buffers() const;
  // This module ("") and every descendant, depth first, with dotted names.
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }

  // Parameters and buffers by dotted name. The tensors are detached snapshots of the current
  // values (buffers are written once, so a snapshot costs nothing and later steps don't change it).
  StateDict state_dict() const;
  // Assigns every value into the module's own tensors (their identity is kept, so optimizers
  // holding pointers see the new values). Checks everything before assigning anything: missing
  // and unexpected keys (only when strict), shape and dtype mismatches (always). A value on
  // another device is copied to the tensor's device.
  void load_state_dict(const StateDict& sd, bool strict = true);

  // Train/eval mode for this module and all descendants (Dropout and BatchNorm read it).
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  // Mixed precision (Note [compute dtype] in layers.h) for this module and all descendants:
  // Linear and Conv2d cast their input and weight to `t` (bfloat16, float16) for the matmul or
  // convolution and return the result in the input's dtype; parameters keep their own dtype
  // (float32 master weights), so gradients and optimizer state stay in it too. nullopt (the
  // default): compute in the parameters' dtype.
  Module& set_compute_dtype(std::optional<DType> t);
  std::optional<DType> compute_dtype() const { return compute_dtype_; }

  int64_t num_parameters() const;  // total element count of all parameters

  // Tensor parallel over `devices` (Note [tensor parallel] in module.cpp): a module that knows its
  // layout (a Sequential's Linear pairs, GPT's attention and MLP) splits its layers with shard
  // annotations; this default replicates the module's own parameters and buffers over the devices
  // and asks each child. Call it before an optimizer is made, as its state follows the parameters.
  virtual void tensor_parallel(const std::vector<std::string>& devices);

 protected:
  // Registration, called from constructors. Names are non-empty, contain no '.', and are unique
  // within this module. register_parameter marks the tensor requires_grad.
  Tensor& register_parameter(const std::string& name, Tensor& t);
  Tensor& register_buffer(const std::string& name, Tensor& t);
  Module& register_module(const std::string& name, Module& m);

 private:
  void check_name(const char* what, const std::string& name) const;
  void collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, Tensor*>>& out) const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
  std::optional<DType> compute_dtype_;
};

}  // namespace tg::nn
