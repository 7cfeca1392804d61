// ZeRO-1 (see zero.h).
#include "distributed/zero.h"

#include <cmath>
#include <map>
#include <optional>
#include <sstream>

#include "distributed/collective_runner.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace {

std::vector<float> host_of(const Tensor& t) { return t.to_vector<float>(); }

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

std::pair<int64_t, std::string> split_state_key(const std::string& key) {
  auto dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || key.find_first_not_of("0123456789") != dot) return {-1, key};
  return {std::stoll(key.substr(0, dot)), key.substr(dot + 1)};
}

int64_t zero1_block_size(int64_t total, int64_t world) { return (total + world - 1) / world; }

std::string shape_csv(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) out += (i ? "," : "") + std::to_string(s[i]);
  return out;
}

Shape parse_shape_csv(const std::string& text, const std::string& what) {
  Shape out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    TG_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && part.size() < 19, what,
             ": '", text, "' is not a shape (comma-separated sizes)");
    out.push_back(std::stoll(part));
  }
  return out;
}

Zero1::Zero1(ProcessGroup& pg, std::vector<Tensor*> params, const OptimizerFactory& make_optimizer, DType grad_dtype)
    : pg_(pg), params_(std::move(params)), grad_dtype_(grad_dtype) {
  TG_CHECK(grad_dtype_ == DType::Float32 || grad_dtype_ == DType::BFloat16, "zero1: gradients travel in float32 or ",
           "bfloat16, not ", dtype_name(grad_dtype_));
  for (size_t i = 0; i < params_.size(); i++) {
    TG_CHECK(params_[i]->dtype() == DType::Float32, "zero1: parameter ", i, " is ", params_[i]->describe(),
             " (the sharded optimizer handles float32 parameters)");
    total_ += params_[i]->numel();
  }
  const int n = pg_.size();
  shard_ = zero1_block_size(total_, n);
  reload_parameters();
  optim_ = make_optimizer({&block_});
  TG_CHECK(optim_->type_name() != "LAMB", "zero1: LAMB needs per-parameter norms; use sgd, adam or adamw");
}

void Zero1::reload_parameters() {
  std::vector<float> flat(static_cast<size_t>(shard_ * pg_.size()), 0.0f);
  int64_t off = 0;
  for (Tensor* p : params_) {
    auto v = host_of(*p);
    std::copy(v.begin(), v.end(), flat.begin() + off);
    off += p->numel();
  }
  Tensor mine = Tensor::from_data(flat.data() + shard_ * pg_.rank(), DType::Float32, {shard_});
  if (optim_) block_.assign(mine);  // the optimizer holds a pointer to block_
  else block_ = mine;
}

// Note [a ZeRO-1 step on the graph]: the step is two schedules. The first holds the backward
// pass, the REDUCE_SCATTER of the flat gradient (each rank's block, scaled by 1/N so the average
// fuses into the update), the decision (an ALLREDUCE sum of [non-finite flag, this block's sum of
// squares]: ok when no block was non-finite, the global norm the root of the sum) and this
// rank's update through Optimizer::step_if, with the loss. The second ALLGATHERs the updated
// blocks and assigns every parameter its slice. Both are ordinary schedules, so a JIT capture
// records them and a replay runs the same collectives. A skipped step leaves the block (and so
// the gathered parameters) unchanged, the step count included once the shard optimizer has
// settled (Note [a step skipped on the device] in tinygrad/nn/optim.h); as in
// coordinated_step_lazy a non-finite gradient skips whenever the step checks or clips.
Tensor Zero1::averaged_block() {
  const int n = pg_.size();
  Tensors flat;
  for (Tensor* p : params_) {
    auto g = p->grad();
    flat.push_back((g ? g->detach().cast(DType::Float32) : p->detach().zeros_like()).reshape({p->numel()}));
  }
  if (shard_ * n > total_) flat.push_back(Tensor::zeros({shard_ * n - total_}, {.device = params_[0]->device()}));
  Tensor grad = flat.size() == 1 ? flat[0] : Tensor::cat(flat, 0);
  if (grad_dtype_ == DType::Float32) return reduce_scatter_node(pg_, grad) * (1.0 / n);
  return reduce_scatter_node(pg_, grad.cast(grad_dtype_)).cast(DType::Float32) * (1.0 / n);
}

void Zero1::gather_parameters(const Tensors& also_realize) {
  Tensor all = all_gather_node(pg_, block_.detach());
  Tensors values = also_realize;
  int64_t off = 0;
  for (Tensor* p : params_) {
    Tensor v = all.shrink({{off, off + p->numel()}}).reshape(p->shape());
    values.push_back(v.device() == p->device() ? v : v.to(p->device()));
    off += p->numel();
  }
  Tensor::realize_all(values);
  for (size_t i = 0; i < params_.size(); i++) params_[i]->assign(values[also_realize.size() + i]);
  if (jit_capturing())  // Note [a capture leaves no gradients] in tinygrad/nn/optim.cpp
    for (Tensor* p : params_) p->set_grad(std::nullopt);
}

LazyStepOutcome Zero1::step_lazy(const Tensors& also_realize, const StepOptions& opt) {
  TG_CHECK(opt.max_norm >= 0, "zero1: max_norm must be non-negative, got ", opt.max_norm);
  NoGradGuard no_grad;
  Tensor mine = averaged_block();
  LazyStepOutcome out;
  Tensors values = also_realize;
  if (opt.max_norm > 0 || opt.skip_nonfinite) {
    Tensor sq = mine.square().sum();
    Tensor zero = sq.zeros_like(), one = sq.ones_like();
    Tensor finite = sq.isnan().logical_or(sq.isinf()).logical_not();
    Tensor stats = all_reduce_node(pg_, Tensor::stack({finite.where(zero, one), finite.where(sq, zero)}));
    Tensor ok = stats[0].eq(zero);
    Tensor norm = stats[1].sqrt();
    if (opt.max_norm > 0) mine = mine * (Tensor::scalar(opt.max_norm, {.device = norm.device()}) / (norm + 1e-6)).minimum(one);
    out.ok = ok;
    out.grad_norm = stats[0].ne(zero).where(one * INFINITY, norm);  // not from ok: Note [the skip count's kernel] in nn/optim.h
    values.push_back(*out.ok);
    values.push_back(*out.grad_norm);
  } else if (opt.report_norm) {
    out.grad_norm = all_reduce_node(pg_, mine.square().sum()).sqrt();
    values.push_back(*out.grad_norm);
  }
  block_.set_grad(mine);
  if (out.ok) optim_->step_if(*out.ok, values);
  else optim_->step(values);
  gather_parameters({});
  return out;
}

StepOutcome Zero1::step(const Tensors& also_realize, const StepOptions& opt) {
  return settle_step(*optim_, step_lazy(also_realize, opt));
}

// Note [zero1 checkpoints]: every rank writes its block's optimizer state (keys "0.<state>" of
// shape [block], and "step") to a file of its own, and the metadata file records the layout:
// zero1_ranks (the world size) and zero1_layout, one line per parameter in the flat order,
// "<name> <offset in the flat vector> <global shape, comma-separated>". A reader of any world size
// or strategy stacks the ranks' blocks into the flat vector, drops the padding and cuts each
// parameter's state out at its offset with its shape (launcher/checkpoint.cpp, reading only the
// parts it needs): the per-parameter state "<i>.<state>" that a data-parallel optimizer of the
// same parameters holds. A zero1 run
// takes its own block of such a full state (load_full_optimizer_state: the parameters' states
// flattened in order, zero-padded, block r), so a state moves between world sizes and
// strategies by copies alone, bit for bit. Checkpoints written before the layout was recorded
// have no zero1_layout; their reader passes the loading model's parameters as the layout, which
// the blocks' size must fit.
nn::Metadata Zero1::layout_metadata(const std::vector<std::string>& names) const {
  TG_ASSERT(names.size() == params_.size());
  std::string layout;
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); i++) {
    layout += names[i] + " " + std::to_string(offset) + " " + shape_csv(params_[i]->shape()) + "\n";
    offset += params_[i]->numel();
  }
  return {{"zero1_ranks", std::to_string(pg_.size())}, {"zero1_layout", layout}};
}

void Zero1::load_full_optimizer_state(const nn::StateDict& full) {
  NoGradGuard no_grad;
  std::map<std::string, std::vector<std::optional<Tensor>>> states;  // state name -> per parameter
  nn::StateDict mine;
  for (auto& [k, v] : full) {
    auto [i, name] = split_state_key(k);
    if (i < 0) {
      mine.emplace(k, v);  // the step count (anything else load_state_dict names as unexpected)
      continue;
    }
    TG_CHECK(i < static_cast<int64_t>(params_.size()), "zero1: optimizer state '", k, "' names parameter ", i, " of ",
             params_.size());
    const Tensor& p = *params_[static_cast<size_t>(i)];
    TG_CHECK(v.shape() == p.shape(), "zero1: optimizer state '", k, "' is ", v.describe(), ", its parameter ",
             p.describe());
    auto& slots = states[name];
    slots.resize(params_.size());
    slots[static_cast<size_t>(i)] = v;
  }
  const int64_t n = pg_.size();
  for (auto& [name, slots] : states) {
    Tensors flat;
    for (size_t i = 0; i < params_.size(); i++) {
      TG_CHECK(slots[i].has_value(), "zero1: the optimizer state has '", name, "' without parameter ", i, "'s ('", i,
               ".", name, "')");
      flat.push_back(slots[i]->detach().cast(DType::Float32).reshape({params_[i]->numel()}));
    }
    if (shard_ * n > total_) flat.push_back(Tensor::zeros({shard_ * n - total_}, {.device = flat[0].device()}));
    Tensor all = flat.size() == 1 ? flat[0] : Tensor::cat(flat, 0);
    mine.emplace("0." + name, all.shrink({{shard_ * pg_.rank(), shard_ * (pg_.rank() + 1)}}).contiguous());
  }
  optim_->load_state_dict(mine);
}

std::vector<ParamLayout> zero1_layout(const nn::Metadata& meta) {
  std::vector<ParamLayout> out;
  auto it = meta.find("zero1_layout");
  if (it == meta.end()) return out;
  std::stringstream lines(it->second);
  std::string line;
  int64_t offset = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::stringstream ls(line);
    ParamLayout p;
    int64_t at = -1;
    std::string shape;
    ls >> p.name >> at >> shape;
    TG_CHECK(!p.name.empty() && at == offset, "zero1 checkpoint: layout line '", line, "' does not follow the one before (",
             "offset ", offset, " expected)");
    p.shape = parse_shape_csv(shape, "zero1 checkpoint: layout of '" + p.name + "'");
    offset += numel_of(p.shape);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace tg::dist
