// Coordinated optimizer steps decided on the device (see coordinated_step.h).
#include "distributed/coordinated_step.h"

#include <algorithm>

#include "tinygrad/error.h"

namespace tg::dist {

LazyStepOutcome coordinated_step_lazy(nn::Optimizer& optim, const Tensors& first, const StepOptions& opt) {
  TG_CHECK(opt.max_norm >= 0, "coordinated step: max_norm must be non-negative, got ", opt.max_norm);
  NoGradGuard no_grad;
  LazyStepOutcome out;
  const std::vector<Tensor*>& params = optim.params();
  const bool decides = (opt.max_norm > 0 || opt.skip_nonfinite) &&
                       std::any_of(params.begin(), params.end(), [](Tensor* p) { return p->grad().has_value(); });
  if (decides || opt.report_norm)  // the reduced gradients' norm: the same on every rank
    out.grad_norm = opt.max_norm > 0    ? nn::clip_grad_norm_lazy(params, opt.max_norm)
                    : opt.grad_norm ? *opt.grad_norm
                                    : nn::grad_norm_lazy(params);
  Tensors values = first;
  if (!decides) {
    if (out.grad_norm) values.push_back(*out.grad_norm);
    optim.step(values);
    return out;
  }
  out.ok = out.grad_norm->isnan().logical_or(out.grad_norm->isinf()).logical_not();
  values.push_back(*out.ok);
  values.push_back(*out.grad_norm);
  optim.step_if(*out.ok, values);
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

StepOutcome coordinated_step(nn::Optimizer& optim, const Tensors& first, const StepOptions& opt) {
  return settle_step(optim, coordinated_step_lazy(optim, first, opt));
}

}  // namespace tg::dist
