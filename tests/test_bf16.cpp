// bfloat16 end to end on the default device (every CPU compiler, CUDA, OpenCL): casts from and to
// float32 round to nearest even, elementwise ops compute in float32 and round after each op,
// sums accumulate in float32, and matmuls and convolutions multiply and sum in float32 and round
// only their result (Note [half products in float32] in tinygrad/tensor_nn.cpp).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "ops_util.h"

using namespace tg;
using namespace tg::testutil;

namespace {

constexpr DType BF16 = DType::BFloat16;

float bf16_round(float v) { return bfloat_to_float(float_to_bfloat(v)); }

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;  // -0 is not 0
}

// One bf16 ulp of slack relative to the value (the reference and the device may sum in
// different orders, which can move a result across a rounding boundary).
constexpr Tol ONE_ULP{1.0 / 128, 1e-6};

}  // namespace

TEST(BFloat16, CastsRoundToNearestEven) {
  const float tie_down = 1.0f + std::ldexp(1.0f, -8);                               // halfway: stays 1
  const float tie_up = 1.0f + 3 * std::ldexp(1.0f, -8);                             // halfway: to the even 1+2^-6
  const float above_tie = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20);      // rounds up
  std::vector<float> v = {1.0f,  tie_down, tie_up,   above_tie, -tie_up, 0.0f,     -0.0f,   INFINITY, -INFINITY,
                          NAN,   FLT_MAX,  3.38e38f, 1e-40f,    1e-45f,  1.0f / 3, 65504.f, -2.5e-3f, 123456.f};
  Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  Tensor b = x.cast(BF16);
  Tensor back = b.cast(DType::Float32);
  Tensor::realize_all({b, back});  // b in its own bf16 buffer, back converted from it on the device
  auto stored = b.to_vector<float>(), converted = back.to_vector<float>();
  for (size_t i = 0; i < v.size(); i++) {
    EXPECT_TRUE(same_float(stored[i], bf16_round(v[i]))) << v[i] << " -> " << stored[i];
    EXPECT_TRUE(same_float(converted[i], stored[i])) << v[i] << " -> " << converted[i];
  }
  EXPECT_EQ(bf16_round(tie_down), 1.0f);
  EXPECT_EQ(bf16_round(tie_up), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16_round(above_tie), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(bf16_round(FLT_MAX), INFINITY);
}

TEST(BFloat16, ElementwiseRoundsAfterEachOp) {
  Tensor a = rnd({257}, 1, -3, 3, BF16), b = rnd({257}, 2, -3, 3, BF16), c = rnd({257}, 3, -3, 3, BF16);
  auto av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = c.to_vector<float>();
  auto got = (a * b + c).to_vector<float>();  // one fused kernel
  for (size_t i = 0; i < got.size(); i++)
    EXPECT_EQ(got[i], bf16_round(bf16_round(av[i] * bv[i]) + cv[i])) << i;
  // against the float64 reference, which rounds only at casts
  EXPECT_TRUE(match((a * b).relu() - c.exp() / (c * c + 1)));
  // mixed with float32: promoted to float32, so nothing is rounded after the cast
  Tensor f = rnd({257}, 4, -3, 3);
  EXPECT_EQ((a * f).dtype(), DType::Float32);
  EXPECT_TRUE(match(a * f + 1, tol_for(DType::Float32)));
}

TEST(BFloat16, SumsAccumulateInFloat32) {
  // Accumulated in bfloat16, 256 + 1 would round back to 256 and these sums would stop there.
  auto ones = Tensor::ones({4096}, {.dtype = BF16});
  EXPECT_EQ(ones.sum().dtype(), BF16);
  EXPECT_EQ(ones.sum().item<float>(), 4096.f);
  auto rows = Tensor::full({3, 1024}, 1.0078125, {.dtype = BF16});  // 1 + 2^-7
  for (float s : rows.sum(1).to_vector<float>()) EXPECT_EQ(s, 1032.f);
  Tensor x = rnd({6, 300}, 5, -1, 1, BF16);
  EXPECT_TRUE(match(x.sum(1), ONE_ULP));
  EXPECT_TRUE(match(x.max(0), tol_for(BF16)));
  EXPECT_TRUE(match(x.cast(DType::Float32).softmax(-1).cast(BF16), ONE_ULP));
}

TEST(BFloat16, MatmulMultipliesInFloat32) {
  // (1+2^-7)(1+2^-6) - (1+2^-6+2^-7) = 2^-13, exact in float32; rounding the product to
  // bfloat16 first would give 0.
  const float p = 1.0f + std::ldexp(1.0f, -7), q = 1.0f + std::ldexp(1.0f, -6);
  Tensor a = Tensor::from_vector(std::vector<float>{p, -(1.0f + std::ldexp(1.0f, -6) + std::ldexp(1.0f, -7))}, {1, 2},
                                 {.dtype = BF16});
  Tensor b = Tensor::from_vector(std::vector<float>{q, 1.0f}, {2, 1}, {.dtype = BF16});
  Tensor r = a.matmul(b);
  EXPECT_EQ(r.dtype(), BF16);
  EXPECT_EQ(r.item<float>(), std::ldexp(1.0f, -13));

  // against float32 on the same (rounded) operands: the result rounded once
  Tensor x = rnd({33, 70}, 6, -1, 1, BF16), w = rnd({70, 17}, 7, -1, 1, BF16);
  auto dev = x.matmul(w).to_vector<float>();
  auto ref = x.cast(DType::Float32).matmul(w.cast(DType::Float32)).to_vector<float>();
  for (size_t i = 0; i < ref.size(); i++) EXPECT_TRUE(close(dev[i], ref[i], ONE_ULP)) << i << ": " << dev[i] << " vs " << ref[i];
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].matmul(in[1]); },
                            {rnd({9, 40}, 8, -1, 1, BF16), rnd({40, 5}, 9, -1, 1, BF16)}));
}

TEST(BFloat16, Conv2dForwardAndBackward) {
  Tensor x = rnd({2, 3, 9, 9}, 10, -1, 1, BF16), w = rnd({4, 3, 3, 3}, 11, -1, 1, BF16);
  auto conv = [](const Tensors& in) { return in[0].conv2d(in[1], std::nullopt, {2}, {1}); };
  Tensor y = conv({x, w});
  EXPECT_EQ(y.dtype(), BF16);
  auto dev = y.to_vector<float>();
  auto ref = conv({x.cast(DType::Float32), w.cast(DType::Float32)}).to_vector<float>();
  for (size_t i = 0; i < ref.size(); i++) EXPECT_TRUE(close(dev[i], ref[i], ONE_ULP)) << i << ": " << dev[i] << " vs " << ref[i];
  EXPECT_TRUE(check_fwd_bwd(conv, {x, w}));
}
