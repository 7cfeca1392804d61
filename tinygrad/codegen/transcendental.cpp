// Note [exp2 by arithmetic]: 2^x = 2^q * 2^r with q = round(x) and r = x - q in [-1/2, 1/2].
// 2^r = e^(r ln 2) is its Taylor polynomial of degree 7 (the remainder is below 6e-9 relative,
// under float32's rounding), and 2^q is built from exponent bits as 2^(q>>1) * 2^(q - (q>>1)),
// two factors that stay normal numbers, so results that underflow to denormals or overflow to
// infinity come out of the multiplications as IEEE rounding gives them. x is clamped to
// [-150, 129] first (beyond, the result is 0 or inf anyway) and NaN passes through.
#include "tinygrad/codegen/transcendental.h"

#include <cmath>

#include "tinygrad/rewrite.h"

namespace tg {

namespace {

UOpPtr f32(double v) { return kconst(DType::Float32, v); }
UOpPtr i32(int64_t v) { return kconst(DType::Int32, static_cast<double>(v)); }

// 2^e for an int32 e in [-126, 127], from its exponent bits.
UOpPtr pow2_bits(const UOpPtr& e) {
  UOpPtr bits = kalu(Op::SHL, kalu(Op::ADD, e, i32(127)), i32(23));
  return make_uop(Op::BITCAST, DType::Float32, {bits});
}

UOpPtr exp2_f32(const UOpPtr& x) {
  auto neg = [](const UOpPtr& v) { return kalu(Op::NEG, v); };
  UOpPtr hi = neg(kalu(Op::MAX, neg(x), f32(-129)));  // min(x, 129)
  UOpPtr xc = kalu(Op::MAX, hi, f32(-150));
  UOpPtr y = kalu(Op::ADD, xc, f32(0.5));
  UOpPtr t = kalu(Op::TRUNC, y);
  UOpPtr q = kwhere(kalu(Op::CMPLT, y, t), kalu(Op::ADD, t, f32(-1)), t);  // floor(x + 1/2)
  UOpPtr u = kalu(Op::MUL, kalu(Op::ADD, xc, neg(q)), f32(M_LN2));
  static const double coeff[] = {1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1.0, 1.0};
  UOpPtr p = f32(coeff[0]);
  for (size_t i = 1; i < std::size(coeff); i++) p = kalu(Op::ADD, kalu(Op::MUL, p, u), f32(coeff[i]));
  UOpPtr qi = kcast(q, DType::Int32);
  UOpPtr qa = kalu(Op::SHR, qi, i32(1));
  UOpPtr qb = kalu(Op::ADD, qi, neg(qa));
  UOpPtr r = kalu(Op::MUL, kalu(Op::MUL, p, pow2_bits(qa)), pow2_bits(qb));
  return kwhere(kalu(Op::CMPNE, x, x), x, r);
}

}  // namespace

UOpPtr decompose_transcendentals(const UOpPtr& ast) {
  static const PatternMatcher pm({{{Op::EXP2}, "exp2 by arithmetic", [](const UOpPtr& u) -> UOpPtr {
                                     if (u->dtype != DType::Float32) return nullptr;
                                     return exp2_f32(u->src[0]);
                                   }}});
  return graph_rewrite(ast, pm);
}

}  // namespace tg
