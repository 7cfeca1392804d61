// Coordinated optimizer steps decided on the device (see coordinated_step.h).
#include "distributed/coordinated_step.h"

#include <cmath>

#include "distributed/collective_runner.h"
#include "tinygrad/error.h"

namespace tg::dist {

LazyStepOutcome coordinated_step_lazy(ProcessGroup& pg, nn::Optimizer& optim, const Tensors& first,
                                      const StepOptions& opt) {
  LazyStepOutcome out;
  TG_CHECK(opt.max_norm >= 0, "coordinated step: max_norm must be non-negative, got ", opt.max_norm);
  if (opt.max_norm <= 0 && !opt.skip_nonfinite) {
    Tensors values = first;
    if (opt.report_norm) {  // the gradients are already reduced: their norm is the global one
      NoGradGuard no_grad;
      out.grad_norm = nn::grad_norm_lazy(optim.params());
      values.push_back(*out.grad_norm);
    }
    optim.step(values);
    return out;
  }
  NoGradGuard no_grad;
  std::vector<Tensor*> with_grad;
  std::optional<Tensor> sq;
  for (Tensor* p : optim.params()) {
    auto g = p->grad();
    if (!g) continue;
    with_grad.push_back(p);
    Tensor s = g->detach().cast(DType::Float32).square().sum();
    sq = sq ? *sq + s.to(with_grad[0]->device()) : s;
  }
  if (!sq) {  // nothing to check or clip
    optim.step(first);
    return out;
  }
  Tensor norm = sq->sqrt();
  Tensor finite = norm.isnan().logical_or(norm.isinf()).logical_not();
  Tensor zero = norm.zeros_like();
  Tensor flag = finite.where(zero, norm.ones_like());
  Tensor stats = all_reduce_node(pg, Tensor::stack({flag, finite.where(norm, zero)}), ReduceOp::Max);
  Tensor ok = stats[0].eq(zero);
  Tensor global_norm = stats[1];
  if (opt.max_norm > 0) {
    Tensor coef = (Tensor::scalar(opt.max_norm, {.device = norm.device()}) / (global_norm + 1e-6)).minimum(norm.ones_like());
    for (Tensor* p : with_grad) {
      Tensor g = p->grad()->detach();
      p->set_grad(g * coef.cast(g.dtype()).to(g.device()));
    }
  }
  out.ok = ok;
  out.grad_norm = finite.where(global_norm, norm);
  Tensors values = first;
  values.push_back(*out.ok);
  values.push_back(*out.grad_norm);
  optim.step_if(ok, values);
  return out;
}

StepOutcome settle_step(nn::Optimizer& optim, const LazyStepOutcome& lazy) {
  StepOutcome out;
  if (!lazy.ok) return out;
  out.skipped = lazy.ok->item<int32_t>() == 0;
  if (lazy.grad_norm) out.grad_norm = lazy.grad_norm->item<double>();
  optim.settle();
  return out;
}

StepOutcome coordinated_step(ProcessGroup& pg, nn::Optimizer& optim, const Tensors& first, const StepOptions& opt) {
  TG_CHECK(pg.size() >= 1, "coordinated step: an empty process group");
  return settle_step(optim, coordinated_step_lazy(pg, optim, first, opt));
}

}  // namespace tg::dist
