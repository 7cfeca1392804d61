// Optimizers for tg::nn as strategy objects: SGD (momentum, dampening, Nesterov, weight decay),
// Adam, AdamW (decoupled weight decay) and LAMB, all with PyTorch's (LAMB: tinygrad's and the
// paper's) update rules; plus clip_grad_norm. step() builds every parameter's and state
// tensor's new value lazily, realizes them all in one Tensor::realize_all, then assigns them.
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tinygrad/tensor.h"

namespace tg::nn {

using StateDict = std::map<std::string, Tensor>;

// Note [optimizer state names]: state tensors are created (zero) for every parameter when the
// optimizer is constructed and keep stable names, so a checkpoint restores them exactly:
//   "step"                 int64 scalar, the number of step() calls
//   "<i>.momentum_buffer"  SGD with momentum != 0
//   "<i>.exp_avg"          Adam, AdamW, LAMB: first moment
//   "<i>.exp_avg_sq"       Adam, AdamW, LAMB: second moment
// where <i> is the parameter's position in the list given to the constructor. The step count is
// global (not per parameter, unlike PyTorch): a parameter without a gradient in some step is
// left alone, but the bias corrections of later steps use the global count.
//
// Note [a step skipped on the device]: a data-parallel step that skips on a non-finite gradient
// decides on the device, so that TinyJit can replay it: step_if(ok) writes where(ok, new, old)
// into every parameter and state tensor. The gate is applied where each new value is made
// (set_new), so a parameter's update reads its gated moments: the step's kernels are those of
// step() with a select before each store, one kernel for p, m and v (Note [kernels with several
// outputs] in schedule.cpp), and a replica that never skips computes bit for bit what step()
// computes (gating the finished values instead left m and v in kernels of their own, whose
// float contractions differed in the last bit, and after 30 Adam steps parameters differed by
// up to 15% from a plain run's). As with PyTorch's GradScaler (which does not call
// optimizer.step() for a skipped step), a skipped step must leave everything as it was, the step
// count included (Adam's bias corrections use it). The host counts every step, skipped or not,
// and never waits to learn which: the step also adds 1 - ok to a 0-d int32 counter on the
// device (skipped_steps_, Note [the skip count's kernel]), and the scalars that
// depend on the step count read it (Note [bias corrections after a skip]). settle() reads the
// counter when the host needs the true count (a log step, a checkpoint, the end of a run),
// subtracts it from step_ and writes the counter back to zero in place, so a captured step
// keeps reading the same buffer. The one host decision that is not taken back is SGD's
// first-update rule with dampening != 0 (buf = g once per parameter): after a skipped first
// step the zero buffer is treated as initialised (with dampening 0, the only value tg train
// uses, both rules give the same buffer).
//
// Note [the skip count's kernel]: the count is a 0-d output of the step, counted = skips +
// !ok, and the gate every update reads is counted == skips rather than ok itself. A caller that
// realizes ok as an output of the step (coordinated_step_lazy, Zero1 and Fsdp do, for the
// trainer's log steps) then has ok read by the count alone, so ok and the count are stored by
// one kernel (Note [kernels with several outputs] in schedule.cpp): the count costs no kernel of
// its own. Nothing else the step outputs may read ok (the reported norm reads the all-reduced
// flag instead), or ok would need a kernel of its own again.
//
// Note [bias corrections after a skip]: a scalar of step count t (Adam's lr / (1 - b1^t) and
// 1 / sqrt(1 - b2^t), LAMB's 1 / (1 - b^t)) is written by the host for the t it counts, which
// is too large by the s steps skipped since the last settle(). Under step_if the kernels read
// where(s == 0, host value, the same formula at t - s computed on the device in float32): a run
// that never skips reads the host's value bit for bit (the select passes it through), and after
// a skip the value is the one the step would have had if the skipped steps had never run, within
// about 1e-6 relative (float32: 1 - b^n is computed as -expm1(n ln b), expm1 by Kahan's
// (u - 1) x / log(u), u = exp(x), which stays accurate where b^n is close to 1 and 1 - b^n would
// lose its digits). The corrected scalars of a device and dtype are computed once per step, all
// in one small kernel (stacked, contiguous), and the update kernels load them as they load the
// host's buffers: evaluated inside the update kernels instead, the formula cost an exp and a log
// per element and changed how the compiler contracted the moments' arithmetic, so a run that
// never skipped was no longer bit for bit the unchecked one.
//
// Note [scalars that change between steps]: kernels are cached by their graph, and a constant
// is part of it, so lr and the bias corrections (which change from step to step) enter the
// kernels as 0-d buffers written from the host. The update kernels compile once. Each scalar
// has a name ("lr", "step_size", ...) and one persistent buffer per (name, dtype, device),
// rewritten in place at the start of every step: the kernels of a step read the same buffers
// every time, so a step captured by TinyJit stays valid, and the host work that counts the step
// and rewrites the scalars (host_step) is registered with jit_on_replay to run on every replay.
class Optimizer {
 public:
  Optimizer(std::vector<Tensor*> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient (gradients are read, not cleared). Tensors in `also_realize` (the loss, metrics)
  // are computed in the same schedule, so the forward pass they share with the gradients runs once.
  virtual void step(const Tensors& also_realize = {});
  // The same step made conditional on the device (Note [a step skipped on the device]): `ok` is a
  // 0-d tensor, and every parameter and state tensor becomes where(ok, new, old), so where ok is
  // false nothing changes. The host counts the step as taken; the device counts it as skipped
  // until settle() takes it back. Nothing is read on the host.
  void step_if(const Tensor& ok, const Tensors& also_realize = {});
  // Reads the device's count of the steps step_if skipped since the last settle (waiting for the
  // device), takes them back from the step count and sets the device's count to zero; returns
  // how many there were. Reads nothing when no step_if ran since the last settle.
  int64_t settle();
  // Drops every parameter's gradient.
  void zero_grad();

  double lr;  // read at every step, so a schedule may set it between steps

  const std::vector<Tensor*>& params() const { return params_; }
  // The steps counted on the host: skipped ones included until settle() takes them back.
  int64_t step_count() const { return step_; }
  virtual std::string type_name() const = 0;

  // Detached snapshots of the state (see Note [optimizer state names]); "step" is the settled
  // count (the device's count of skipped steps is read and subtracted when there may be some).
  virtual StateDict state_dict() const;
  // Restores the state: the keys must be exactly this optimizer's keys, with matching shapes and
  // dtypes (errors name the missing, unexpected and mismatched keys). Assigns in place.
  virtual void load_state_dict(const StateDict& sd);

 protected:
  // New values computed in one step: (tensor to assign, its new lazy value).
  using Updates = std::vector<std::pair<Tensor*, Tensor>>;
  // Pushes the new value of parameter i (and of its state) given its gradient g, through
  // set_new. p and g are detached copies of the parameter and its gradient, g already in p's dtype.
  virtual void update(size_t i, const Tensor& p, const Tensor& g, Updates& out) = 0;
  // Pushes (target, value) and returns what the rest of the step reads as target's new value:
  // under step_if, where(ok, value, target) (Note [a step skipped on the device]), else value.
  Tensor set_new(Updates& out, Tensor& target, const Tensor& value);
  // Called once per step before the updates (step_ already counts this step, lr is set), to
  // set host scalars such as bias corrections with set_scalar. Also runs on TinyJit replays.
  virtual void begin_step() {}
  // Registers state `name` for every parameter, zero-initialised with the parameter's shape and dtype.
  void add_state(const std::string& name);
  Tensor& state(size_t i, const std::string& name);
  // This step's value of the host scalar `name` (call in begin_step; "lr" is set by the base).
  void set_scalar(const std::string& name, double v);
  // A scalar of the step count t, factor * (1 - base^t)^power with power -1 or -0.5 (factor: the
  // scalar "lr", or 1), whose host value `v` the subclass computes for step_: under step_if the
  // kernels read it corrected for skipped steps (Note [bias corrections after a skip]).
  struct OfStep {
    double base = 0, power = -1;
    bool times_lr = false;
  };
  void set_scalar(const std::string& name, double v, OfStep of_step);
  // The scalar `name` as a 0-d buffer of like's dtype and device, holding this step's value
  // (see Note [scalars that change between steps]).
  Tensor scalar_input(const std::string& name, const Tensor& like);
  // Called after load_state_dict assigned the state.
  virtual void after_load() {}

  std::vector<Tensor*> params_;
  int64_t step_ = 0;

 private:
  std::vector<std::string> state_names_;
  std::vector<std::map<std::string, Tensor>> state_;  // per parameter
  // The host side of a step: counts it, sets the scalars and writes them into their buffers.
  void host_step();
  void run_step(const Tensor* ok, const Tensors& also_realize);
  // The buffer of scalar `name` on `device` as `dtype` (Note [scalars that change between steps]).
  Tensor scalar_buffer(const std::string& name, const std::string& device, DType dtype);
  // Under step_if: adds the update of the skip count to `ups` and sets the gate it gives.
  void count_skip(const Tensor& ok, Updates& ups);
  // The gate ok on `device` (copied there, with the skip counter, the first time a step needs it).
  const Tensor& gate_on(const std::string& device);
  // The scalars of of_step_ as the step reads them under step_if, stacked in of_step_'s order.
  Tensor corrected_scalars(const std::string& device, DType dtype);
  // The scalar of_step_[name] at step t - skipped steps, in float32 on `device`.
  Tensor scalar_after_skips(const std::string& name, const std::string& device);
  // The skipped steps not yet settled, read from the device (0 when there can be none).
  int64_t unsettled_skips() const;
  void clear_skip_count();  // writes 0 into skipped_steps_
  std::map<std::string, Tensor> gates_;  // during step_if: ok on each device the update touches
  std::map<std::string, Tensor> skips_on_;  // during step_if: skipped_steps_ on each device the update touches
  std::map<std::pair<std::string, DType>, Tensor> corrected_;  // during step_if: corrected_scalars by (device, dtype)
  std::optional<Tensor> skipped_steps_;  // int32 0-d: steps step_if skipped since the last settle (Note [a step skipped on the device])
  bool maybe_skipped_ = false;           // a step_if ran since the last settle
  std::map<std::string, double> scalar_values_;                             // this step's, by name
  std::map<std::string, OfStep> of_step_;                                   // the scalars of the step count
  std::map<std::tuple<std::string, std::string, DType>, Tensor> scalar_bufs_;  // (name, device, dtype)
};

// PyTorch's SGD: g += weight_decay * p; with momentum, buf = momentum * buf + (1 - dampening) * g
// (buf = g on a parameter's first update), then g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor*> params, double lr, double momentum = 0, double dampening = 0, double weight_decay = 0,
      bool nesterov = false);
  std::string type_name() const override { return "SGD"; }
  double momentum, dampening, weight_decay;
  bool nesterov;

 protected:
  void update(size_t i, const Tensor& p, const Tensor& g, Updates& out) override;
  void after_load() override;

 private:
  std::vector<bool> has_buffer_;  // a parameter's first momentum update sets buf = g
};

// PyTorch's Adam (weight_decay is L2, added to the gradient):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Parameters that share a weight decay (PyTorch's parameter groups, for the options that differ
// between groups in practice).
struct ParamGroup {
  std::vector<Tensor*> params;
  double weight_decay = 0;
};
// nanoGPT's rule as groups: `weight_decay` for matrices (ndim >= 2: Linear and embedding
// weights), none for vectors (biases, LayerNorm weights). Consecutive parameters with the same
// decay share a group, so the optimizer sees them in the given order (its state keys, Note
// [optimizer state names], follow the model's parameters).
std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor*>& params, double weight_decay);

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor*> params, double lr = 1e-3, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8,
       double weight_decay = 0);
  std::string type_name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  double b1, b2, eps, weight_decay;

 protected:
  Adam(std::vector<ParamGroup> groups, double lr, double b1, double b2, double eps);
  void begin_step() override;
  void update(size_t i, const Tensor& p, const Tensor& g, Updates& out) override;
  bool decoupled_ = false;

 private:
  std::vector<double> decay_of_;  // per parameter
  void check_and_add_state();
};

// PyTorch's AdamW: p *= 1 - lr * weight_decay, then the Adam update without L2.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor*> params, double lr = 1e-3, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01);
  // Each group with its own weight decay (e.g. decay_matrices_only(model.parameters(), 0.1)).
  AdamW(std::vector<ParamGroup> groups, double lr = 1e-3, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8);
};

// LAMB (You et al. 2019, as tinygrad): m, v as Adam; up = m_hat / (sqrt(v_hat) + eps) + wd * p;
// trust ratio r = |p| / |up| (1 where either norm is 0; r = 1 when adam=true); p -= lr * r * up.
class LAMB : public Optimizer {
 public:
  LAMB(std::vector<Tensor*> params, double lr = 1e-3, double b1 = 0.9, double b2 = 0.999, double eps = 1e-6,
       double weight_decay = 0, bool adam = false);
  std::string type_name() const override { return "LAMB"; }
  double b1, b2, eps, weight_decay;
  bool adam;

 protected:
  void begin_step() override;
  void update(size_t i, const Tensor& p, const Tensor& g, Updates& out) override;
};

// Scales the gradients so that their global L2 norm is at most max_norm (by
// max_norm / (norm + 1e-6), only when that is below 1) and returns the norm before clipping.
// Parameters without a gradient are skipped; with none at all the norm is 0. Realizes the
// gradients (once) to compute the norm.
double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm);
// The same scaling built lazily, on the device: each gradient becomes g * min(1, max_norm /
// (norm + 1e-6)) and the norm comes back as a 0-d float32 tensor. Nothing is realized or read on
// the host, so the scaling fuses into the optimizer's update kernels and a step that uses it can
// be captured by TinyJit. With no gradients the norm is a zero constant.
Tensor clip_grad_norm_lazy(const std::vector<Tensor*>& params, double max_norm);
// The global L2 norm of the gradients, lazily, as a 0-d float32 tensor (a zero constant with
// none); parameters without a gradient are skipped. Nothing is realized.
Tensor grad_norm_lazy(const std::vector<Tensor*>& params);

}  // namespace tg::nn
