// Reductions: sum, max and prod are primitives (REDUCE_AXIS); mean, min, var, std, argmax,
// softmax and friends are compositions.
#include <cmath>

#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

Tensor reduce_op(const char* name, const Tensor& x, Op op, const std::vector<int64_t>& axes_in, bool keepdim) {
  auto axes = norm_axes(name, x, axes_in);
  Tensor r = result(lazy::reduce(x.uop(), op, axes), {&x});
  if (keepdim) return r;
  Shape out;
  for (int64_t i = 0; i < x.ndim(); i++)
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) out.push_back(x.shape()[i]);
  return r.reshape(out);
}

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& axes) {
  int64_t n = 1;
  for (auto a : norm_axes("reduce", x, axes)) n *= x.shape()[a];
  return n;
}

DType sum_dtype(DType t) { return is_float(t) || t == DType::Int64 ? t : DType::Int64; }

}  // namespace

Tensor Tensor::sum(std::vector<int64_t> axes, bool keepdim) const {
  return reduce_op("sum", cast(sum_dtype(dtype())), Op::ADD, axes, keepdim);
}

Tensor Tensor::prod(std::vector<int64_t> axes, bool keepdim) const {
  return reduce_op("prod", cast(sum_dtype(dtype())), Op::MUL, axes, keepdim);
}

Tensor Tensor::max(std::vector<int64_t> axes, bool keepdim) const {
  if (dtype() == DType::Bool) return cast(DType::UInt8).max(axes, keepdim).cast(DType::Bool);
  return reduce_op("max", *this, Op::MAX, axes, keepdim);
}

Tensor Tensor::min(std::vector<int64_t> axes, bool keepdim) const {
  if (dtype() == DType::Bool || is_unsigned(dtype())) return cast(DType::Int32).min(axes, keepdim).cast(dtype());
  return -((-*this).max(axes, keepdim));
}

Tensor Tensor::mean(std::vector<int64_t> axes, bool keepdim) const {
  Tensor s = (is_float(dtype()) ? *this : float_()).sum(axes, keepdim);
  int64_t n = reduced_count(*this, axes);
  return n == 0 ? s * NAN : s * (1.0 / static_cast<double>(n));
}

Tensor Tensor::var(std::vector<int64_t> axes, bool keepdim, double correction) const {
  Tensor x = is_float(dtype()) ? *this : float_();
  Tensor d = x - x.mean(axes, true);
  double n = static_cast<double>(reduced_count(*this, axes));
  return (d * d).sum(axes, keepdim) / std::max(0.0, n - correction);
}

Tensor Tensor::std(std::vector<int64_t> axes, bool keepdim, double correction) const {
  return var(axes, keepdim, correction).sqrt();
}

Tensor Tensor::argmax(std::optional<int64_t> axis, bool keepdim) const {
  if (!axis) {
    Tensor r = flatten().argmax(0);
    return keepdim ? r.reshape(Shape(ndim(), 1)) : r;
  }
  int64_t a = norm_axis("argmax", *this, *axis);
  int64_t n = shape()[a];
  TG_CHECK(n > 0, "argmax: cannot take argmax of an empty dimension (", describe(), ", axis ", a, ")");
  Shape bshape(ndim(), 1);
  bshape[a] = n;
  // the first maximum wins: weight the positions n, n-1, ..., 1 and take the largest weight
  Tensor rev = Tensor::arange(static_cast<double>(n), 0, -1, {.dtype = DType::Int32, .device = device()}).reshape(bshape);
  Tensor is_max = eq(max(*axis, true));
  Tensor r = (is_max.where(rev, rev.zeros_like())).max(a, keepdim);
  return (r.scalar_like(static_cast<double>(n)) - r).cast(DType::Int32);
}

Tensor Tensor::argmin(std::optional<int64_t> axis, bool keepdim) const {
  if (dtype() == DType::Bool || is_unsigned(dtype())) return cast(DType::Int32).argmin(axis, keepdim);
  return (-*this).argmax(axis, keepdim);
}

Tensor Tensor::logsumexp(int64_t axis, bool keepdim) const {
  Tensor m = max(axis, true).detach();
  m = m.isinf().where(m.zeros_like(), m);
  Tensor r = (*this - m).exp().sum(axis, true).log() + m;
  return keepdim ? r : r.squeeze(axis);
}

Tensor Tensor::softmax(int64_t axis) const {
  Tensor x = is_float(dtype()) ? *this : float_();
  Tensor e = (x - x.max(axis, true).detach()).exp();
  return e / e.sum(axis, true);
}

Tensor Tensor::log_softmax(int64_t axis) const {
  Tensor x = is_float(dtype()) ? *this : float_();
  Tensor shifted = x - x.max(axis, true).detach();
  return shifted - shifted.exp().sum(axis, true).log();
}

Tensor Tensor::cumsum(int64_t axis) const {
  int64_t a = norm_axis("cumsum", *this, axis);
  int64_t n = shape()[a];
  if (n == 0) return *this;
  Tensor x = transpose(a, -1);
  std::vector<std::pair<int64_t, int64_t>> p(ndim(), {0, 0});
  p.back() = {n - 1, 0};
  Tensor windows = x.pad(p).pool_windows({n}, {1}, {1});
  return windows.sum(-1).transpose(a, -1);
}

}  // namespace tg
