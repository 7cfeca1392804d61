// Optimizers for tg::nn: the shared step (collect updates, one realize_all, assign), state
// dicts, the SGD / Adam / AdamW / LAMB update rules, and clip_grad_norm.
#include "tinygrad/nn/optim.h"

#include <cmath>
#include <set>
#include <sstream>

#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"

namespace tg::nn {

namespace {

Tensor zeros_buffer(const Tensor& like) {
  std::vector<double> host(static_cast<size_t>(like.numel()), 0.0);
  return Tensor::from_data(host.data(), DType::Float64, like.shape(), {.dtype = like.dtype(), .device = like.device()});
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::vector<Tensor*> params, double lr_) : lr(lr_), params_(std::move(params)) {
  TG_CHECK(lr >= 0, "optimizer: lr must be non-negative, got ", lr);
  std::set<const Tensor*> seen;
  for (size_t i = 0; i < params_.size(); i++) {
    TG_CHECK(params_[i] != nullptr, "optimizer: parameter ", i, " is null");
    TG_CHECK(is_float(params_[i]->dtype()), "optimizer: parameter ", i, " must be floating point, got ",
             params_[i]->describe());
    TG_CHECK(seen.insert(params_[i]).second, "optimizer: parameter ", i, " appears twice in the list");
  }
  state_.resize(params_.size());
}

void Optimizer::add_state(const std::string& name) {
  state_names_.push_back(name);
  for (size_t i = 0; i < params_.size(); i++) state_[i].emplace(name, zeros_buffer(*params_[i]));
}

Tensor& Optimizer::state(size_t i, const std::string& name) {
  auto it = state_[i].find(name);
  TG_ASSERT(it != state_[i].end(), "optimizer state '", name, "' was not added for parameter ", i);
  return it->second;
}

void Optimizer::set_scalar(const std::string& name, double v) { scalar_values_[name] = v; }

void Optimizer::set_scalar(const std::string& name, double v, OfStep of_step) {
  TG_ASSERT(of_step.power == -1 || of_step.power == -0.5, type_name(), ": scalar '", name, "' has power ", of_step.power);
  set_scalar(name, v);
  of_step_[name] = of_step;
}

Tensor Optimizer::scalar_buffer(const std::string& name, const std::string& device, DType dtype) {
  auto v = scalar_values_.find(name);
  TG_ASSERT(v != scalar_values_.end(), type_name(), ": scalar '", name, "' was not set this step");
  auto key = std::make_tuple(name, device, dtype);
  auto it = scalar_bufs_.find(key);
  if (it != scalar_bufs_.end()) return it->second;
  Tensor t = Tensor::from_data(&v->second, DType::Float64, {}, {.dtype = dtype, .device = device});
  scalar_bufs_.emplace(key, t);
  return t;
}

Tensor Optimizer::scalar_input(const std::string& name, const Tensor& like) {
  Tensor host = scalar_buffer(name, like.device(), like.dtype());
  if (gates_.empty() || !of_step_.count(name)) return host;
  auto key = std::make_pair(like.device(), like.dtype());
  auto it = corrected_.find(key);
  if (it == corrected_.end()) it = corrected_.emplace(key, corrected_scalars(like.device(), like.dtype())).first;
  return it->second[static_cast<int64_t>(std::distance(of_step_.begin(), of_step_.find(name)))];
}

// Note [bias corrections after a skip]: every scalar of the step count, each where(skips == 0,
// host value, device formula), stacked into one buffer that one small kernel fills.
Tensor Optimizer::corrected_scalars(const std::string& device, DType dtype) {
  gate_on(device);
  Tensor skips = skips_on_.at(device);
  Tensor none_skipped = skips.eq(skips.zeros_like());
  Tensors values;
  for (auto& [name, f] : of_step_)
    values.push_back(none_skipped.where(scalar_buffer(name, device, dtype), scalar_after_skips(name, device).cast(dtype)));
  return Tensor::stack(values).contiguous();
}

// Note [bias corrections after a skip]: factor * (1 - base^n)^power at n = t - skipped steps.
Tensor Optimizer::scalar_after_skips(const std::string& name, const std::string& device) {
  const OfStep& f = of_step_.at(name);
  Tensor n = scalar_buffer("step", device, DType::Float32) - skips_on_.at(device).cast(DType::Float32);
  Tensor one_minus_pow = n.ones_like();  // 1 - base^n; base 0: 1 for every n >= 1
  if (f.base != 0) {
    Tensor x = n * std::log(f.base);
    Tensor u = x.exp();
    // expm1(x): u - 1 where u < 1/2 (no digits lost; u may underflow to 0), else Kahan's
    Tensor kahan = u.eq(u.ones_like()).where(x, (u - 1.0) * x / u.log());
    one_minus_pow = -((u < 0.5).where(u - 1.0, kahan));
  }
  Tensor root = f.power == -1 ? one_minus_pow : one_minus_pow.sqrt();
  return f.times_lr ? scalar_buffer("lr", device, DType::Float32) / root : root.reciprocal();
}

void Optimizer::host_step() {
  step_++;
  set_scalar("lr", lr);
  set_scalar("step", static_cast<double>(step_));  // Note [bias corrections after a skip]
  begin_step();
  for (auto& [key, t] : scalar_bufs_) {
    auto v = scalar_values_.find(std::get<0>(key));
    TG_ASSERT(v != scalar_values_.end(), type_name(), ": scalar '", std::get<0>(key), "' was not set this step");
    t.write_(&v->second, DType::Float64);
  }
}

void Optimizer::step(const Tensors& also_realize) { run_step(nullptr, also_realize); }

void Optimizer::step_if(const Tensor& ok, const Tensors& also_realize) {
  TG_CHECK(ok.ndim() == 0, type_name(), ".step_if: the condition must be 0-d, got ", ok.describe());
  run_step(&ok, also_realize);
}

int64_t Optimizer::unsettled_skips() const {
  if (!maybe_skipped_ || !skipped_steps_) return 0;
  return skipped_steps_->item<int64_t>();
}

int64_t Optimizer::settle() {
  const int64_t skipped = unsettled_skips();
  if (skipped != 0) {
    TG_ASSERT(skipped > 0 && skipped <= step_, type_name(), ": ", skipped, " skipped steps of ", step_);
    step_ -= skipped;
    clear_skip_count();
  }
  maybe_skipped_ = false;
  return skipped;
}

void Optimizer::clear_skip_count() {
  const int32_t zero = 0;
  skipped_steps_->write_(&zero, DType::Int32);  // in place: a captured step reads the same buffer
}

const Tensor& Optimizer::gate_on(const std::string& device) {
  auto gate = gates_.find(device);
  if (gate != gates_.end()) return gate->second;
  skips_on_.emplace(device, skips_on_.begin()->second.to(device));
  return gates_.emplace(device, gates_.begin()->second.to(device)).first->second;
}

// Note [a step skipped on the device]: the device counts the step if it skips it, and the
// step's gates read ok back from that count (Note [the skip count's kernel]).
void Optimizer::count_skip(const Tensor& ok, Updates& ups) {
  const int32_t zero = 0;
  if (!skipped_steps_) skipped_steps_ = Tensor::from_data(&zero, DType::Int32, {}, {.dtype = DType::Int32, .device = ok.device()});
  Tensor here = ok.device() == skipped_steps_->device() ? ok : ok.to(skipped_steps_->device());
  Tensor skips = skipped_steps_->detach();
  Tensor counted = skips + here.cast(DType::Bool).logical_not().cast(DType::Int32);
  ups.emplace_back(&*skipped_steps_, counted);
  gates_.emplace(skips.device(), counted.eq(skips));
  skips_on_.emplace(skips.device(), skips);
  maybe_skipped_ = true;
}

Tensor Optimizer::set_new(Updates& out, Tensor& target, const Tensor& value) {
  Tensor v = value;
  if (!gates_.empty()) v = gate_on(target.device()).where(value, target.detach());  // Note [a step skipped on the device]
  out.emplace_back(&target, v);
  return v;
}

void Optimizer::run_step(const Tensor* ok, const Tensors& also_realize) {
  NoGradGuard no_grad;
  if (!ok && maybe_skipped_) settle();  // a plain step after gated ones counts from the true step
  host_step();
  gates_.clear();
  skips_on_.clear();
  corrected_.clear();
  Updates ups;
  if (ok) count_skip(*ok, ups);
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = *params_[i];
    auto g = p.grad();
    if (!g) continue;
    TG_CHECK(g->shape() == p.shape() && g->device() == p.device(), type_name(), ": gradient ", g->describe(),
             " of parameter ", i, " does not match the parameter ", p.describe());
    Tensor gd = g->detach();
    if (gd.dtype() != p.dtype()) gd = gd.cast(p.dtype());
    update(i, p.detach(), gd, ups);
  }
  gates_.clear();
  skips_on_.clear();
  corrected_.clear();
  Tensors values = also_realize;
  for (auto& [t, v] : ups) values.push_back(v);
  Tensor::realize_all(values);  // parameters, state and the caller's tensors (the loss) in one schedule
  for (auto& [t, v] : ups) t->assign(v);
  // a replayed step counts itself and writes its scalars (and may have skipped on the device)
  jit_on_replay([this, gated = ok != nullptr] {
    host_step();
    maybe_skipped_ = maybe_skipped_ || gated;
  });
  // Note [a capture leaves no gradients]: replays do not update the gradient tensors, and a
  // captured step's lazy gradients hold its whole graph, with the convolution outputs kept in
  // it (Note [kept convolution outputs] in schedule/schedule.cpp): left in place, they would pin
  // that memory beside the replays' own for as long as the parameters live. So a step that is
  // being captured ends with no gradients, as after zero_grad.
  if (jit_capturing())
    for (Tensor* p : params_) p->set_grad(std::nullopt);
}

void Optimizer::zero_grad() {
  for (auto* p : params_) p->set_grad(std::nullopt);
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  sd.emplace("step", Tensor::from_vector(std::vector<int64_t>{step_ - unsettled_skips()}, {}));
  for (size_t i = 0; i < params_.size(); i++)
    for (auto& [name, t] : state_[i]) sd.emplace(std::to_string(i) + "." + name, t.detach());
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  std::ostringstream err;
  std::set<std::string> known{"step"};
  auto st = sd.find("step");
  if (st == sd.end()) err << "\n  missing key 'step'";
  else if (st->second.numel() != 1 || is_float(st->second.dtype()))
    err << "\n  'step' must be one integer, got " << st->second.describe();
  std::vector<std::pair<Tensor*, Tensor>> todo;
  for (size_t i = 0; i < params_.size(); i++) {
    for (auto& [name, t] : state_[i]) {
      std::string key = std::to_string(i) + "." + name;
      known.insert(key);
      auto it = sd.find(key);
      if (it == sd.end()) {
        err << "\n  missing key '" << key << "'";
      } else if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) {
        err << "\n  mismatch for '" << key << "': expected " << dtype_name(t.dtype()) << shape_str(t.shape())
            << ", got " << dtype_name(it->second.dtype()) << shape_str(it->second.shape());
      } else {
        Tensor v = it->second.detach();
        todo.emplace_back(&t, v.device() == t.device() ? v : v.to(t.device()));
      }
    }
  }
  for (auto& [key, v] : sd)
    if (!known.count(key)) err << "\n  unexpected key '" << key << "'";
  TG_CHECK(err.str().empty(), type_name(), ".load_state_dict: the state dict does not fit this optimizer (",
           params_.size(), " parameters):", err.str());
  Tensors values;
  for (auto& [t, v] : todo) values.push_back(v);
  Tensor::realize_all(values);
  for (size_t i = 0; i < todo.size(); i++) todo[i].first->assign(values[i]);
  step_ = st->second.reshape({}).item<int64_t>();
  if (maybe_skipped_) {  // the loaded count is settled: no skipped step is left to take back
    clear_skip_count();
    maybe_skipped_ = false;
  }
  after_load();
}

// ---- SGD ----

SGD::SGD(std::vector<Tensor*> params, double lr, double momentum_, double dampening_, double weight_decay_,
         bool nesterov_)
    : Optimizer(std::move(params), lr), momentum(momentum_), dampening(dampening_), weight_decay(weight_decay_),
      nesterov(nesterov_) {
  TG_CHECK(momentum >= 0, "SGD: momentum must be non-negative, got ", momentum);
  TG_CHECK(weight_decay >= 0, "SGD: weight_decay must be non-negative, got ", weight_decay);
  TG_CHECK(!nesterov || (momentum > 0 && dampening == 0), "SGD: nesterov needs momentum > 0 and dampening = 0, got momentum=",
           momentum, " dampening=", dampening);
  if (momentum != 0) add_state("momentum_buffer");
  has_buffer_.assign(params_.size(), false);
}

void SGD::update(size_t i, const Tensor& p, const Tensor& g_in, Updates& out) {
  Tensor g = weight_decay != 0 ? g_in + p * weight_decay : g_in;
  if (momentum != 0) {
    Tensor& buf = state(i, "momentum_buffer");
    // With dampening 0 a zero buffer gives buf = g on the first update anyway (same kernel every step).
    Tensor nb = set_new(out, buf, (!has_buffer_[i] && dampening != 0) ? g : buf * momentum + g * (1.0 - dampening));
    has_buffer_[i] = true;
    g = nesterov ? g + nb * momentum : nb;
  }
  set_new(out, *params_[i], p - g * scalar_input("lr", p));
}

// A checkpoint taken after a step has every buffer initialised (parameters that never had a
// gradient by then are the exception; their zero buffer then acts as initialised).
void SGD::after_load() { has_buffer_.assign(params_.size(), step_ > 0); }

// ---- Adam, AdamW ----

std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor*>& params, double weight_decay) {
  std::vector<ParamGroup> groups;
  for (Tensor* p : params) {
    double wd = p->ndim() >= 2 ? weight_decay : 0.0;
    if (groups.empty() || groups.back().weight_decay != wd) groups.push_back({{}, wd});
    groups.back().params.push_back(p);
  }
  return groups;
}

namespace {
std::vector<Tensor*> flatten(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor*> all;
  for (auto& g : groups) all.insert(all.end(), g.params.begin(), g.params.end());
  return all;
}
}  // namespace

Adam::Adam(std::vector<Tensor*> params, double lr, double b1_, double b2_, double eps_, double weight_decay_)
    : Optimizer(std::move(params), lr), b1(b1_), b2(b2_), eps(eps_), weight_decay(weight_decay_) {
  decay_of_.assign(params_.size(), weight_decay);
  check_and_add_state();
}

Adam::Adam(std::vector<ParamGroup> groups, double lr, double b1_, double b2_, double eps_)
    : Optimizer(flatten(groups), lr), b1(b1_), b2(b2_), eps(eps_), weight_decay(0) {
  for (auto& g : groups) {
    decay_of_.insert(decay_of_.end(), g.params.size(), g.weight_decay);
    weight_decay = std::max(weight_decay, g.weight_decay);
  }
  check_and_add_state();
}

void Adam::check_and_add_state() {
  TG_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "Adam: betas must be in [0, 1), got b1=", b1, " b2=", b2);
  TG_CHECK(eps >= 0, "Adam: eps must be non-negative, got ", eps);
  for (double wd : decay_of_) TG_CHECK(wd >= 0, "Adam: weight_decay must be non-negative, got ", wd);
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

AdamW::AdamW(std::vector<Tensor*> params, double lr, double b1, double b2, double eps, double weight_decay)
    : Adam(std::move(params), lr, b1, b2, eps, weight_decay) {
  decoupled_ = true;
}

AdamW::AdamW(std::vector<ParamGroup> groups, double lr, double b1, double b2, double eps)
    : Adam(std::move(groups), lr, b1, b2, eps) {
  decoupled_ = true;
}

namespace {
// Note [scalars that change between steps]: one decay scalar per distinct weight decay.
std::string decay_scalar(double wd) { return "decay " + std::to_string(wd); }
}  // namespace

void Adam::begin_step() {
  auto t = static_cast<double>(step_);
  set_scalar("step_size", lr / (1.0 - std::pow(b1, t)), {.base = b1, .power = -1, .times_lr = true});
  set_scalar("inv_sqrt_bc2", 1.0 / std::sqrt(1.0 - std::pow(b2, t)), {.base = b2, .power = -0.5});
  for (double wd : decay_of_)
    if (wd != 0) set_scalar(decay_scalar(wd), 1.0 - lr * wd);
}

void Adam::update(size_t i, const Tensor& p, const Tensor& g_in, Updates& out) {
  double wd = decay_of_[i];
  Tensor g = (!decoupled_ && wd != 0) ? g_in + p * wd : g_in;
  Tensor &m = state(i, "exp_avg"), &v = state(i, "exp_avg_sq");
  Tensor nm = set_new(out, m, m * b1 + g * (1.0 - b1));
  Tensor nv = set_new(out, v, v * b2 + g * g * (1.0 - b2));
  Tensor base = (decoupled_ && wd != 0) ? p * scalar_input(decay_scalar(wd), p) : p;
  set_new(out, *params_[i], base - nm * scalar_input("step_size", p) / (nv.sqrt() * scalar_input("inv_sqrt_bc2", p) + eps));
}

// ---- LAMB ----

LAMB::LAMB(std::vector<Tensor*> params, double lr, double b1_, double b2_, double eps_, double weight_decay_, bool adam_)
    : Optimizer(std::move(params), lr), b1(b1_), b2(b2_), eps(eps_), weight_decay(weight_decay_), adam(adam_) {
  TG_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "LAMB: betas must be in [0, 1), got b1=", b1, " b2=", b2);
  TG_CHECK(eps >= 0, "LAMB: eps must be non-negative, got ", eps);
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

void LAMB::begin_step() {
  auto t = static_cast<double>(step_);
  set_scalar("inv_bc1", 1.0 / (1.0 - std::pow(b1, t)), {.base = b1, .power = -1});
  set_scalar("inv_bc2", 1.0 / (1.0 - std::pow(b2, t)), {.base = b2, .power = -1});
}

void LAMB::update(size_t i, const Tensor& p, const Tensor& g, Updates& out) {
  Tensor &m = state(i, "exp_avg"), &v = state(i, "exp_avg_sq");
  Tensor nm = set_new(out, m, m * b1 + g * (1.0 - b1));
  Tensor nv = set_new(out, v, v * b2 + g * g * (1.0 - b2));
  Tensor up = nm * scalar_input("inv_bc1", p) / ((nv * scalar_input("inv_bc2", p)).sqrt() + eps);
  if (weight_decay != 0) up = up + p * weight_decay;
  Tensor scale = scalar_input("lr", p);
  if (!adam) {
    Tensor r1 = p.square().sum().sqrt(), r2 = up.square().sum().sqrt();
    Tensor one = r1.ones_like();
    Tensor r = (r1 > 0.0).where((r2 > 0.0).where(r1 / r2, one), one);
    scale = scale * r;
  }
  set_new(out, *params_[i], p - up * scale);
}

// ---- clip_grad_norm ----

Tensor grad_norm_lazy(const std::vector<Tensor*>& params) {
  NoGradGuard no_grad;
  std::optional<Tensor> sq;
  for (auto* p : params) {
    TG_CHECK(p != nullptr, "grad_norm_lazy: a parameter is null");
    auto g = p->grad();
    if (!g) continue;
    Tensor s = g->detach().cast(DType::Float32).square().sum();
    sq = sq ? *sq + s.to(sq->device()) : s;
  }
  return sq ? sq->sqrt() : Tensor::scalar(0.0);
}

Tensor clip_grad_norm_lazy(const std::vector<Tensor*>& params, double max_norm) {
  TG_CHECK(max_norm >= 0, "clip_grad_norm_lazy: max_norm must be non-negative, got ", max_norm);
  NoGradGuard no_grad;
  Tensor norm = grad_norm_lazy(params);
  Tensor coef = (Tensor::scalar(max_norm, {.device = norm.device()}) / (norm + 1e-6)).minimum(norm.ones_like());
  for (Tensor* p : params) {
    if (!p->grad()) continue;
    Tensor g = p->grad()->detach();
    p->set_grad(g * coef.cast(g.dtype()).to(g.device()));
  }
  return norm;
}

double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm) {
  TG_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be non-negative, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor*> with_grad;
  Tensors grads;
  for (auto* p : params) {
    TG_CHECK(p != nullptr, "clip_grad_norm: a parameter is null");
    if (auto g = p->grad()) {
      with_grad.push_back(p);
      grads.push_back(g->detach());
    }
  }
  if (grads.empty()) return 0.0;
  std::optional<Tensor> sq;
  for (auto& g : grads) {
    Tensor s = g.cast(DType::Float32).square().sum();
    sq = sq ? *sq + s.to(grads[0].device()) : s;
  }
  Tensor total = sq->sqrt();
  Tensors outs = grads;
  outs.push_back(total);
  Tensor::realize_all(outs);  // the gradients are realized once, for the norm and for the step after
  double norm = total.item<double>();
  double coef = max_norm / (norm + 1e-6);
  for (size_t i = 0; i < grads.size(); i++) {
    Tensor& g = grads[i];
    if (coef < 1) {
      Tensor c = Tensor::from_data(&coef, DType::Float64, {}, {.dtype = g.dtype(), .device = g.device()});
      with_grad[i]->set_grad(g * c);
    } else {
      with_grad[i]->set_grad(g);
    }
  }
  return norm;
}

}  // namespace tg::nn
