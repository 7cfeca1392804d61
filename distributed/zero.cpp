// ZeRO-1 (see zero.h).
#include "distributed/zero.h"

#include <cmath>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

std::vector<float> host_of(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

Zero1::Zero1(ProcessGroup& pg, std::vector<Tensor*> params, const OptimizerFactory& make_optimizer)
    : pg_(pg), params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); i++) {
    TG_CHECK(params_[i]->dtype() == DType::Float32, "zero1: parameter ", i, " is ", params_[i]->describe(),
             " (the sharded optimizer handles float32 parameters)");
    total_ += params_[i]->numel();
  }
  const int n = pg_.size();
  shard_ = (total_ + n - 1) / n;
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

StepOutcome Zero1::step(const Tensors& also_realize, const StepOptions& opt) {
  NoGradGuard no_grad;
  const int n = pg_.size();
  Tensors flat;
  for (Tensor* p : params_) {
    auto g = p->grad();
    flat.push_back((g ? g->detach().cast(DType::Float32) : p->detach().zeros_like()).reshape({p->numel()}));
  }
  if (shard_ * n > total_) flat.push_back(Tensor::zeros({shard_ * n - total_}));
  Tensor grad = Tensor::cat(flat, 0);
  Tensors values = also_realize;
  values.push_back(grad);
  Tensor::realize_all(values);
  std::vector<float> g = host_of(grad), mine(static_cast<size_t>(shard_));
  pg_.reduce_scatter(g.data(), mine.data(), static_cast<size_t>(shard_), DType::Float32, ReduceOp::Avg)->wait();
  // one all-reduce: the global sum of squares and whether any block is non-finite
  double sq = 0;
  for (float v : mine) sq += double(v) * v;
  double stats[2] = {std::isfinite(sq) ? sq : 0.0, std::isfinite(sq) ? 0.0 : 1.0};
  pg_.all_reduce(stats, 2, DType::Float64, ReduceOp::Sum)->wait();
  StepOutcome out;
  out.grad_norm = stats[1] > 0 ? INFINITY : std::sqrt(stats[0]);
  if (opt.skip_nonfinite && stats[1] > 0) {
    out.skipped = true;
    return out;
  }
  double coef = opt.max_norm > 0 ? opt.max_norm / (out.grad_norm + 1e-6) : 1.0;
  if (coef < 1)
    for (float& v : mine) v = static_cast<float>(v * coef);
  block_.set_grad(Tensor::from_data(mine.data(), DType::Float32, {shard_}));
  optim_->step();
  std::vector<float> updated = host_of(block_), all(static_cast<size_t>(shard_ * n));
  pg_.all_gather(updated.data(), all.data(), static_cast<size_t>(shard_), DType::Float32)->wait();
  int64_t off = 0;
  for (Tensor* p : params_) {
    p->assign(Tensor::from_data(all.data() + off, DType::Float32, p->shape(), {.device = p->device()}));
    off += p->numel();
  }
  return out;
}

}  // namespace tg::dist
