// Coordinated optimizer steps (see coordinated_step.h).
#include "distributed/coordinated_step.h"

#include <cmath>
#include <optional>

#include "tinygrad/error.h"

namespace tg::dist {

StepOutcome coordinated_step(ProcessGroup& pg, nn::Optimizer& optim, const Tensors& first, const StepOptions& opt) {
  StepOutcome out;
  if (opt.max_norm <= 0 && !opt.skip_nonfinite) {
    optim.step(first);
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
    sq = sq ? *sq + s : s;
  }
  Tensors values = first;
  if (sq) values.push_back(sq->sqrt());
  Tensor::realize_all(values);
  double norm = sq ? values.back().item<double>() : 0.0;
  double flags[2] = {std::isfinite(norm) ? 0.0 : 1.0, std::isfinite(norm) ? norm : 0.0};
  pg.all_reduce(flags, 2, DType::Float64, ReduceOp::Max)->wait();
  out.grad_norm = std::isfinite(norm) ? flags[1] : norm;
  if (flags[0] > 0) {
    out.skipped = true;
    return out;
  }
  double coef = opt.max_norm / (flags[1] + 1e-6);
  if (opt.max_norm > 0 && coef < 1) {
    for (Tensor* p : with_grad) {
      Tensor g = p->grad()->detach();
      Tensor c = Tensor::from_data(&coef, DType::Float64, {}, {.dtype = g.dtype(), .device = g.device()});
      p->set_grad(g * c);
    }
  }
  optim.step();
  return out;
}

}  // namespace tg::dist
