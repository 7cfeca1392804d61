// tg::nn::Module: registration, recursive listings, state dicts, the train/eval flag and the default
// tensor-parallel layout (replicated).
#include "tinygrad/nn/module.h"

#include <set>
#include <sstream>

#include "tinygrad/error.h"

namespace tg::nn {

Tensor Module::forward(const Tensor& x) {
  TG_FAIL(type_name(), ": this module has no forward(Tensor) (called with ", x.describe(), ")");
}

void Module::check_name(const char* what, const std::string& name) const {
  TG_CHECK(!name.empty(), type_name(), ": ", what, " name must not be empty");
  TG_CHECK(name.find('.') == std::string::npos, type_name(), ": ", what, " name '", name,
           "' must not contain '.' (dots separate module levels)");
  auto taken = [&](const auto& v) {
    for (auto& [n, p] : v)
      if (n == name) return true;
    return false;
  };
  TG_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name(), ": ", what, " name '", name,
           "' is already registered in this module");
}

Tensor& Module::register_parameter(const std::string& name, Tensor& t) {
  check_name("parameter", name);
  t.requires_grad_(true);
  params_.emplace_back(name, &t);
  return t;
}

Tensor& Module::register_buffer(const std::string& name, Tensor& t) {
  check_name("buffer", name);
  buffers_.emplace_back(name, &t);
  return t;
}

Module& Module::register_module(const std::string& name, Module& m) {
  check_name("module", name);
  TG_CHECK(&m != this, type_name(), ": cannot register a module as its own child ('", name, "')");
  children_.emplace_back(name, &m);
  return m;
}

void Module::collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, Tensor*>>& out) const {
  for (auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", params, out);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", true, out);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", false, out);
  return out;
}

std::vector<Tensor*> Module::parameters() const {
  std::vector<Tensor*> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor*> Module::buffers() const {
  std::vector<Tensor*> out;
  for (auto& [n, t] : named_buffers()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [n, m] : children_)
    for (auto& [cn, cm] : m->named_modules()) out.emplace_back(cn.empty() ? n : n + "." + cn, cm);
  return out;
}

// Note [tensor parallel]: Megatron-LM's layout, written as shard annotations on the parameters
// only; the forward passes are the single-device code, and the multi-device rewrite (Note
// [multi-device tensors] in multi.cpp) places every op and inserts every collective:
//  - a column-parallel Linear (weight [out, in] and bias split along out) reads a replicated input
//    and gives each device its slice of the outputs; elementwise activations run on the slices;
//  - a row-parallel Linear (weight split along in) reads those slices: its product sums over the
//    split axis, so each device holds a partial sum, which the rewrite all-reduces; its bias is
//    replicated and added after the sum;
//  - so a column-parallel Linear, activations and a row-parallel Linear cost one all-reduce in the
//    forward pass. Backward, the column-parallel layer's input gradient sums over its split
//    outputs and is all-reduced (only where the input needs a gradient: not for data), while
//    every weight gradient is computed on its own device's slice, with no collective;
//  - everything else is replicated: each device computes it whole and equal; the optimizer's
//    update is elementwise, so its state takes each parameter's layout.
// Splits must be even: a width the device count does not divide is refused, naming the sizes.
void Module::tensor_parallel(const std::vector<std::string>& devices) {
  if (devices.size() < 2) return;
  for (auto* group : {&params_, &buffers_})
    for (auto& [n, t] : *group) t->shard_(devices);
  for (auto& [n, m] : children_) m->tensor_parallel(devices);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto* t : parameters()) n += t->numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict sd;
  for (auto& [n, t] : named_parameters()) sd.emplace(n, t->detach());
  for (auto& [n, t] : named_buffers()) sd.emplace(n, t->detach());
  return sd;
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
  return s;
}
}  // namespace

void Module::load_state_dict(const StateDict& sd, bool strict) {
  auto targets = named_parameters();
  for (auto& b : named_buffers()) targets.push_back(b);

  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  std::vector<std::pair<Tensor*, Tensor>> todo;
  for (auto& [name, t] : targets) {
    known.insert(name);
    auto it = sd.find(name);
    if (it == sd.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& v = it->second;
    if (v.shape() != t->shape() || v.dtype() != t->dtype()) {
      mismatched.push_back("'" + name + "': expected " + dtype_name(t->dtype()) + shape_str(t->shape()) + ", got " +
                           dtype_name(v.dtype()) + shape_str(v.shape()));
      continue;
    }
    todo.emplace_back(t, v.detach().shard_like(*t));  // a sharded parameter keeps its layout
  }
  for (auto& [name, v] : sd)
    if (!known.count(name)) unexpected.push_back(name);

  std::ostringstream err;
  if (strict && !missing.empty()) err << "\n  missing keys: " << join(missing);
  if (strict && !unexpected.empty()) err << "\n  unexpected keys: " << join(unexpected);
  for (auto& m : mismatched) err << "\n  mismatch for " << m;
  TG_CHECK(err.str().empty(), "load_state_dict: cannot load into ", type_name(), ":", err.str());

  Tensors values;
  for (auto& [t, v] : todo) values.push_back(v);
  Tensor::realize_all(values);  // one schedule for every value that still needs computing
  for (size_t i = 0; i < todo.size(); i++) todo[i].first->assign(values[i]);
}

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
  return *this;
}

Module& Module::set_compute_dtype(std::optional<DType> t) {
  TG_CHECK(!t || is_float(*t), type_name(), ": the compute dtype must be a float dtype, got ", dtype_name(*t));
  compute_dtype_ = t;
  for (auto& [n, m] : children_) m->set_compute_dtype(t);
  return *this;
}

}  // namespace tg::nn
