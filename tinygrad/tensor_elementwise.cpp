// Elementwise Tensor methods: casts, unary math, binary arithmetic with broadcasting and dtype
// promotion, comparisons, logic. Transcendentals are compositions of EXP2, LOG2, SIN, SQRT.
#include <cmath>

#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

// Floats keep their dtype; integers and bool compute in float32.
Tensor as_float(const Tensor& x) { return is_float(x.dtype()) ? x : x.cast(DType::Float32); }

Tensor unary(const Tensor& x, Op op) {
  Tensor f = as_float(x);
  return result(lazy::alu(op, f.uop()), {&f});
}

Tensor binary(const char* name, Op op, const Tensor& a, const Tensor& b) {
  auto [x, y] = align(name, a, b);
  return result(lazy::alu(op, x.uop(), y.uop()), {&x, &y});
}

constexpr double LN2 = 0.69314718055994530942;

}  // namespace

Tensor Tensor::cast(DType t) const {
  if (t == dtype()) return *this;
  return result(lazy::cast(uop(), t), {this});
}

Tensor Tensor::bitcast(DType t) const {
  TG_CHECK(itemsize(t) == itemsize(dtype()), "bitcast: ", dtype_name(dtype()), " and ", dtype_name(t),
           " differ in size (", describe(), ")");
  return Tensor(lazy::bitcast(uop(), t));
}

Tensor Tensor::scalar_like(double v) const {
  DType t = dtype();
  bool integral = v == std::trunc(v) && std::isfinite(v);
  if (!is_float(t)) {
    if (!integral) t = DType::Float32;
    else if (t == DType::Bool) t = DType::Int32;  // as in NumPy and PyTorch: mask + 1 counts
  }
  return Tensor(lazy::constant(v, t, device(), {}));
}

Tensor Tensor::neg() const {
  if (dtype() == DType::Bool) return logical_not();
  return result(lazy::alu(Op::NEG, uop()), {this});
}
Tensor Tensor::exp2() const { return unary(*this, Op::EXP2); }
Tensor Tensor::log2() const { return unary(*this, Op::LOG2); }
Tensor Tensor::exp() const { return (as_float(*this) * (1.0 / LN2)).exp2(); }
Tensor Tensor::log() const { return log2() * LN2; }
Tensor Tensor::sqrt() const { return unary(*this, Op::SQRT); }
Tensor Tensor::reciprocal() const { return unary(*this, Op::RECIP); }
Tensor Tensor::rsqrt() const { return sqrt().reciprocal(); }
Tensor Tensor::sin() const { return unary(*this, Op::SIN); }
Tensor Tensor::cos() const { return (M_PI / 2 - as_float(*this)).sin(); }
Tensor Tensor::tan() const { return sin() / cos(); }
Tensor Tensor::sigmoid() const { return (1.0 + (-as_float(*this)).exp()).reciprocal(); }
Tensor Tensor::tanh() const { return 2.0 * (2.0 * as_float(*this)).sigmoid() - 1.0; }
Tensor Tensor::relu() const { return maximum(zeros_like()); }
Tensor Tensor::leaky_relu(double slope) const { return (*this > 0).where(*this, *this * slope); }
// Note [gelu as a sigmoid]: the tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x +
// 0.044715 x^3), is x sigmoid(2u), since 1 + tanh(u) = 2 sigmoid(2u); 2u is x (a + b x^2) with
// a = 2 sqrt(2/pi) and b = 0.044715 a. Written so, it is about half the operations of the tanh
// form forward and backward: GPT-2's GELU kernels on a GPU are bound by instructions (the
// bfloat16 [16, 1024, 3072] activations moved at 1.6 TB/s of an H100's 3). With the one-instruction
// bfloat16 rounding (Note [bfloat16 rounding instruction] in codegen/render_cuda.cpp) they went
// from 0.126 to 0.094 ms a launch on an H100.
Tensor Tensor::gelu() const {
  Tensor x = as_float(*this);
  return x * (x * (1.5957691216057308 + 0.07135481627260025 * (x * x))).sigmoid();
}
Tensor Tensor::silu() const { return *this * sigmoid(); }
Tensor Tensor::abs() const {
  if (dtype() == DType::Bool || is_unsigned(dtype())) return *this;
  return (*this < 0).where(-*this, *this);
}
Tensor Tensor::sign() const { return (*this > 0).cast(dtype()) - (*this < 0).cast(dtype()); }
Tensor Tensor::square() const { return *this * *this; }
Tensor Tensor::trunc() const {
  if (!is_float(dtype())) return *this;
  return result(lazy::alu(Op::TRUNC, uop()), {this});
}
Tensor Tensor::floor() const {
  Tensor t = trunc();
  return (*this < t).where(t - 1.0, t);
}
Tensor Tensor::ceil() const {
  Tensor t = trunc();
  return (*this > t).where(t + 1.0, t);
}
Tensor Tensor::round() const {
  // half to even: round(x) = floor(x + 0.5), minus one where x + 0.5 is an odd integer tie
  Tensor f = (*this + 0.5).floor();
  Tensor tie = (f - *this).eq(scalar_like(0.5));
  Tensor odd = (f - (f * 0.5).floor() * 2.0).ne(scalar_like(0));
  return tie.logical_and(odd).where(f - 1.0, f);
}
Tensor Tensor::clip(double lo, double hi) const {
  TG_CHECK(lo <= hi, "clip: min ", lo, " is above max ", hi);
  return maximum(scalar_like(lo)).minimum(scalar_like(hi));
}

Tensor Tensor::pow(double e) const {
  if (e == 0) return ones_like();
  if (e == 1) return *this;
  if (e == 2) return *this * *this;
  if (e == 3) return *this * *this * *this;
  if (e == -1) return reciprocal();
  if (e == 0.5) return sqrt();
  return pow(scalar_like(e));
}

Tensor Tensor::pow(const Tensor& e) const {
  auto [x0, y0] = align("pow", *this, e);
  Tensor x = as_float(x0), y = as_float(y0);
  // |x|^y through exp2(y * log2|x|); the base 0 is handled apart (with a safe base in the
  // formula) so that neither the value nor the gradient there becomes NaN.
  Tensor zero = x.eq(x.zeros_like());
  Tensor safe = zero.where(x.ones_like(), x);
  Tensor mag = (y * safe.abs().log2()).exp2();
  Tensor y_int = y.eq(y.trunc());
  Tensor y_odd = (y * 0.5).trunc().mul(y.scalar_like(2)).ne(y);
  Tensor signed_mag = (safe < 0).where(y_int.where(y_odd.where(-mag, mag), x.full_like(NAN)), mag);
  Tensor at_zero = (y > 0).where(x.zeros_like(), y.eq(y.zeros_like()).where(x.ones_like(), x.full_like(INFINITY)));
  return zero.where(at_zero, signed_mag);
}

Tensor Tensor::maximum(const Tensor& o) const {
  if (dtype() == DType::Bool && o.dtype() == DType::Bool) return logical_or(o);
  return binary("maximum", Op::MAX, *this, o);
}
Tensor Tensor::minimum(const Tensor& o) const {
  if (dtype() == DType::Bool && o.dtype() == DType::Bool) return logical_and(o);
  if (is_unsigned(promote(dtype(), o.dtype()))) {
    DType t = promote(dtype(), o.dtype());
    return cast(DType::Int32).minimum(o.cast(DType::Int32)).cast(t);
  }
  return -((-*this).maximum(-o));
}

Tensor Tensor::where(const Tensor& a, const Tensor& b) const {
  check_same_device("where", *this, a);
  check_same_device("where", *this, b);
  Tensor c = cast(DType::Bool);
  auto [x, y] = align("where", a, b);
  Shape s = broadcast_shape("where", c, x);
  Tensor cc = c.broadcast_to(s), xx = x.broadcast_to(s), yy = y.broadcast_to(s);
  return result(lazy::where(cc.uop(), xx.uop(), yy.uop()), {&xx, &yy});
}
Tensor Tensor::where(double a, double b) const {
  return where(Tensor::full({}, a, {.dtype = DType::Float32, .device = device()}),
               Tensor::full({}, b, {.dtype = DType::Float32, .device = device()}));
}

Tensor Tensor::logical_not() const { return cast(DType::Bool).ne(Tensor(lazy::constant(1, DType::Bool, device(), {}))); }
Tensor Tensor::logical_and(const Tensor& o) const { return binary("logical_and", Op::AND, cast(DType::Bool), o.cast(DType::Bool)); }
Tensor Tensor::logical_or(const Tensor& o) const { return binary("logical_or", Op::OR, cast(DType::Bool), o.cast(DType::Bool)); }
Tensor Tensor::logical_xor(const Tensor& o) const { return binary("logical_xor", Op::XOR, cast(DType::Bool), o.cast(DType::Bool)); }

namespace {
Tensor bitwise(const char* name, Op op, const Tensor& a, const Tensor& b) {
  auto [x, y] = align(name, a, b);
  TG_CHECK(is_int(x.dtype()), name, ": needs integer tensors (a: ", a.describe(), ", b: ", b.describe(), ")");
  return result(lazy::alu(op, x.uop(), y.uop()), {});
}
Tensor shift(const char* name, Op op, const Tensor& x, int64_t bits) {
  TG_CHECK(is_int(x.dtype()), name, ": needs an integer tensor, got ", x.describe());
  TG_CHECK(bits >= 0 && bits < static_cast<int64_t>(8 * itemsize(x.dtype())), name, ": shift by ", bits,
           " bits is outside ", x.describe());
  return bitwise(name, op, x, x.scalar_like(static_cast<double>(bits)));
}
}  // namespace

Tensor Tensor::bitwise_and(const Tensor& o) const { return bitwise("bitwise_and", Op::AND, *this, o); }
Tensor Tensor::bitwise_or(const Tensor& o) const { return bitwise("bitwise_or", Op::OR, *this, o); }
Tensor Tensor::bitwise_xor(const Tensor& o) const { return bitwise("bitwise_xor", Op::XOR, *this, o); }
Tensor Tensor::shift_left(int64_t bits) const { return shift("shift_left", Op::SHL, *this, bits); }
Tensor Tensor::shift_right(int64_t bits) const { return shift("shift_right", Op::SHR, *this, bits); }
Tensor Tensor::isnan() const { return ne(*this); }
Tensor Tensor::isinf() const { return abs().eq(scalar_like(INFINITY)); }

Tensor Tensor::add(const Tensor& o) const {
  if (dtype() == DType::Bool && o.dtype() == DType::Bool) return logical_or(o);
  return binary("add", Op::ADD, *this, o);
}
Tensor Tensor::sub(const Tensor& o) const {
  TG_CHECK(dtype() != DType::Bool || o.dtype() != DType::Bool, "sub: subtracting bool tensors is not supported (",
           describe(), ")");
  auto [x, y] = align("sub", *this, o);
  return x.add(-y);
}
Tensor Tensor::mul(const Tensor& o) const {
  if (dtype() == DType::Bool && o.dtype() == DType::Bool) return logical_and(o);
  return binary("mul", Op::MUL, *this, o);
}
Tensor Tensor::div(const Tensor& o) const {
  auto [x, y] = align("div", *this, o);
  if (!is_float(x.dtype())) x = x.float_(), y = y.float_();
  return x.mul(y.reciprocal());
}
Tensor Tensor::idiv(const Tensor& o) const {
  auto [x, y] = align("idiv", *this, o);
  TG_CHECK(!is_float(x.dtype()), "idiv: integer division needs integer tensors (a: ", describe(), ", b: ", o.describe(), ")");
  return result(lazy::alu(Op::IDIV, x.uop(), y.uop()), {});
}
Tensor Tensor::mod(const Tensor& o) const {
  auto [x, y] = align("mod", *this, o);
  if (is_float(x.dtype())) return x - (x / y).floor() * y;
  return result(lazy::alu(Op::MOD, x.uop(), y.uop()), {});
}
Tensor Tensor::lt(const Tensor& o) const {
  auto [x, y] = align("lt", *this, o);
  if (x.dtype() == DType::Bool) x = x.cast(DType::UInt8), y = y.cast(DType::UInt8);
  return result(lazy::alu(Op::CMPLT, x.uop(), y.uop()), {});
}
Tensor Tensor::gt(const Tensor& o) const { return o.lt(*this); }
Tensor Tensor::le(const Tensor& o) const { return gt(o).logical_not(); }
Tensor Tensor::ge(const Tensor& o) const { return lt(o).logical_not(); }
Tensor Tensor::ne(const Tensor& o) const {
  auto [x, y] = align("ne", *this, o);
  return result(lazy::alu(Op::CMPNE, x.uop(), y.uop()), {});
}
Tensor Tensor::eq(const Tensor& o) const { return ne(o).logical_not(); }

Tensor operator+(const Tensor& a, const Tensor& b) { return a.add(b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return a.sub(b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return a.mul(b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return a.div(b); }
Tensor operator-(const Tensor& a) { return a.neg(); }
Tensor operator+(const Tensor& a, double b) { return a.add(a.scalar_like(b)); }
Tensor operator-(const Tensor& a, double b) { return a.sub(a.scalar_like(b)); }
Tensor operator*(const Tensor& a, double b) { return a.mul(a.scalar_like(b)); }
Tensor operator/(const Tensor& a, double b) { return a.div(a.scalar_like(b)); }
Tensor operator+(double a, const Tensor& b) { return b.scalar_like(a).add(b); }
Tensor operator-(double a, const Tensor& b) { return b.scalar_like(a).sub(b); }
Tensor operator*(double a, const Tensor& b) { return b.scalar_like(a).mul(b); }
Tensor operator/(double a, const Tensor& b) { return b.scalar_like(a).div(b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return a.lt(b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return a.gt(b); }
Tensor operator<(const Tensor& a, double b) { return a.lt(a.scalar_like(b)); }
Tensor operator>(const Tensor& a, double b) { return a.gt(a.scalar_like(b)); }
Tensor operator==(const Tensor& a, const Tensor& b) { return a.eq(b); }

}  // namespace tg
