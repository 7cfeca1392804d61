// bfloat16 products on the CPU through AVX512-BF16 (Note [bf16 dot tiles] in
// tinygrad/codegen/cpu_dot.cpp): which kernels take the dot tiles, what they compute against a
// float32 reference of the same rounded operands, the IR they compile to, and a few training
// steps at bfloat16 against float32. On a host without AVX512-BF16 (or with CPU_ISA=avx2, or
// the C compiler) the products keep the optimizer's float32 kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "ops_util.h"
#include "tests/test_util.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/runtime/cpu_host.h"
#include "tinygrad/schedule/schedule.h"

using namespace tg;
using namespace tg::testutil;
using namespace tg::nn;

namespace {

constexpr DType BF16 = DType::BFloat16, F32 = DType::Float32;

// Whether this process's CPU device lays bfloat16 products out as dot tiles.
bool dot_tiles_here() { return get_device("CPU").policy().cpu.bf16_dot; }

std::string why_no_dot_tiles() {
  return "the CPU device takes no bf16 dot tiles here (" + cpu_host().str() + ", compiler " + cpu_compiler_kind() +
         ")";
}

// The product's kernels: the last is the product itself (the operands' copies come first).
std::vector<ScheduleItem> kernels_of(const Tensor& t) { return create_schedule({t.uop()}); }

// The sum over k of float32(a) * float32(b), a [n, k] and b [k, m] bfloat16: the product's own
// float32 kernel, without the rounding of its result to bfloat16 that matmul adds.
Tensor float32_sum_of_products(const Tensor& a, const Tensor& b) {
  return (a.cast(F32).unsqueeze(-2) * b.cast(F32).transpose(-1, -2).unsqueeze(-3)).sum(-1);
}

// Each result against the float64 sum of the same products, within the bound of float32
// accumulation in any order: (k + 2) units in the last place of 2^-24 of the sum of |products|.
void expect_within_float32_bound(const Tensor& a, const Tensor& b, const Tensor& got) {
  int64_t n = a.shape(0), k = a.shape(1), m = b.shape(1);
  auto av = a.cast(F32).to_vector<float>(), bv = b.cast(F32).to_vector<float>(), gv = got.to_vector<float>();
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) {
      double sum = 0, mag = 0;
      for (int64_t q = 0; q < k; q++) {
        double p = static_cast<double>(av[i * k + q]) * bv[q * m + j];
        sum += p, mag += std::fabs(p);
      }
      double bound = static_cast<double>(k + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
      double err = std::fabs(gv[i * m + j] - sum);
      worst = std::max(worst, err / bound);
      ASSERT_LE(err, bound) << "[" << i << ", " << j << "] of " << n << "x" << k << "x" << m << ": " << gv[i * m + j]
                            << " vs " << sum;
    }
  EXPECT_LE(worst, 1.0);
}

}  // namespace

// Products of several shapes, K odd and even, one row and several, a B larger than half an L2 of
// up to 2 MB (Note [column groups]), as the dot tiles compute them (where the host has them) and
// as the float32 kernels do.
TEST(Bf16Dot, ProductsAgreeWithFloat32OfTheRoundedOperands) {
  struct Shape3 {
    int64_t n, k, m;
  };
  for (Shape3 s : {Shape3{16, 64, 32}, Shape3{24, 37, 64}, Shape3{5, 130, 96}, Shape3{40, 3, 32}, Shape3{9, 1, 32},
                   Shape3{64, 200, 160}, Shape3{16, 600, 1024} /* B of 1.2 MB: column groups */}) {
    Tensor a = rnd({s.n, s.k}, 1, -2, 2, BF16).realize(), b = rnd({s.k, s.m}, 2, -2, 2, BF16).realize();
    Tensor r = float32_sum_of_products(a, b);
    if (dot_tiles_here() && s.k > 1) {
      ScheduleItem item = kernels_of(r).back();
      EXPECT_EQ(heuristic_choice(item, get_device("CPU")).str(), "bf16 dot") << s.n << "x" << s.k << "x" << s.m;
    }
    expect_within_float32_bound(a, b, r.realize());
    // matmul itself rounds the same sums once, to bfloat16
    auto rounded = a.matmul(b).to_vector<float>(), sums = r.to_vector<float>();
    for (size_t i = 0; i < sums.size(); i++) ASSERT_EQ(rounded[i], bfloat_to_float(float_to_bfloat(sums[i]))) << i;
  }
}

// A Linear's product (x @ W^T, W^T copied contiguous) with its bias and activation after it, and
// the tile's other side: B the operand on the left (its columns the product's rows).
TEST(Bf16Dot, LinearLayersAndBatchedProducts) {
  Tensor x = rnd({48, 72}, 3, -1, 1), w = rnd({64, 72}, 4, -1, 1), bias = rnd({64}, 5, -1, 1);
  Tensor y = (x.cast(BF16).matmul(w.cast(BF16).T()).cast(F32) + bias).relu();
  EXPECT_TRUE(match(y, Tol{1.0 / 128, 1e-5}));  // one bfloat16 ulp: the product is rounded to it
  Tensor p = rnd({3, 16, 40}, 6, -1, 1, BF16).realize(), q = rnd({3, 40, 64}, 7, -1, 1, BF16).realize();
  Tensor batched = (p.cast(F32).unsqueeze(-2) * q.cast(F32).transpose(-1, -2).unsqueeze(-3)).sum(-1);
  EXPECT_TRUE(match(batched, Tol{1e-5, 1e-5}));
}

// A Linear layer's three products (forward, input gradient, weight gradient) all take the dot
// tiles: the scheduler gives them their bfloat16 operands in buffers (Note [bfloat16 operands in
// buffers] in schedule/padded_rows.cpp), W for the input gradient included.
TEST(Bf16Dot, LinearGradientsTakeTheTiles) {
  if (!dot_tiles_here()) GTEST_SKIP() << why_no_dot_tiles();
  Tensor x = rnd({64, 96}, 12, -1, 1).realize();
  x.requires_grad_();
  Linear layer(96, 64);
  layer.set_compute_dtype(BF16);
  Tensor y = layer(x);
  (y * y).sum().backward();
  Device& cpu = get_device("CPU");
  int dots = 0;
  for (auto& item : create_schedule({y.uop(), x.grad()->uop(), layer.weight.grad()->uop()}))
    if (item.kind == ScheduleItem::Kind::Kernel && heuristic_choice(item, cpu).kind == KernelChoice::Kind::Bf16Dot)
      dots++;
  EXPECT_EQ(dots, 3);
  // against the float64 reference of the same roundings; a bfloat16 ulp of y moves g = 2y
  EXPECT_TRUE(match_all({y, *x.grad(), *layer.weight.grad()}, Tol{1.0 / 32, 1e-2}));
}

#ifdef TG_WITH_LLVM
// The product's IR calls vdpbf16ps where the host has AVX512-BF16, and not under CPU_ISA=avx2,
// whose kernel is the optimizer's float32 one.
TEST(Bf16Dot, IrHasDotProductsOnlyWithAvx512Bf16) {
  if (!dot_tiles_here()) GTEST_SKIP() << why_no_dot_tiles();
  Tensor a = rnd({32, 64}, 8, -1, 1, BF16).realize(), b = rnd({64, 64}, 9, -1, 1, BF16).realize();
  ScheduleItem item = kernels_of(float32_sum_of_products(a, b)).back();
  Device& cpu = get_device("CPU");
  LoweredKernel dot = lower_kernel_item(item, cpu);
  EXPECT_EQ(dot.choice.str(), "bf16 dot");
  EXPECT_NE(dot.source.find("@llvm.x86.avx512bf16.dpbf16ps.512"), std::string::npos);
  KnobScope isa(knobs::CPU_ISA, "avx2");
  EXPECT_FALSE(cpu.policy().cpu.bf16_dot);
  LoweredKernel plain = lower_kernel_item(item, cpu);
  EXPECT_EQ(plain.choice.kind, KernelChoice::Kind::Generated);
  EXPECT_EQ(plain.source.find("dpbf16ps"), std::string::npos);
}
#endif

// Under CPU_ISA=avx2 nothing changes: the same kernels as before, and results bit for bit those
// of a host without AVX512-BF16.
TEST(Bf16Dot, Avx2KeepsTheFloat32Kernels) {
  if (cpu_host().native_isa != "avx512") GTEST_SKIP() << "needs an AVX-512 host, this is " << cpu_host().str();
  KnobScope isa(knobs::CPU_ISA, "avx2");
  Tensor x = rnd({32, 48}, 10, -1, 1), w = rnd({64, 48}, 11, -1, 1);
  Tensor y = x.cast(BF16).matmul(w.cast(BF16).T());
  auto items = kernels_of(y);
  ASSERT_EQ(items.size(), 2u);  // W^T's copy, the product (x's rounding inside it)
  Device& cpu = get_device("CPU");
  EXPECT_EQ(heuristic_choice(items.back(), cpu).str(), opts_str(hand_coded_opts(items.back().ast, cpu.policy().cpu)));
}

// Without the tiles (CPU_ISA=avx2 on an AVX-512 host) a bfloat16 product large enough for cache
// blocks gets them without K blocks, whose float32 partial sums a bfloat16 output cannot carry
// (the heuristics' opts used to be refused there).
TEST(Bf16Dot, LargeProductsWithoutTilesKeepWholeKLoops) {
  std::optional<KnobScope<decltype(knobs::CPU_ISA)>> isa;
  if (cpu_host().native_isa == "avx512") isa.emplace(knobs::CPU_ISA, "avx2");
  Tensor a = rnd({64, 512}, 13, -1, 1, BF16).realize(), b = rnd({512, 512}, 14, -1, 1, BF16).realize();
  Tensor r = a.matmul(b);
  ScheduleItem item = kernels_of(r).back();
  std::string opts = heuristic_choice(item, get_device("CPU")).str();
  if (!get_device("CPU").policy().cpu.bf16_dot) {
    EXPECT_HAS(opts, "BLOCK");
    EXPECT_EQ(opts.find("KBLOCK"), std::string::npos) << opts;
  }
  EXPECT_TRUE(match(r, Tol{1.0 / 128, 1e-5}));  // one bfloat16 ulp: the sums' order differs from the reference's
}

namespace {

// Losses of a few SGD steps of `model` on fixed data, at float32 or with bfloat16 products.
template <class Model>
std::vector<float> losses(Model& model, const Tensor& x, const Tensor& y, bool bf16, int steps) {
  if (bf16) model.set_compute_dtype(BF16);
  SGD opt(model.parameters(), 0.05);
  std::vector<float> out;
  for (int i = 0; i < steps; i++) {
    Tensor loss = model.forward(x).sparse_categorical_crossentropy(y);
    loss.backward();
    opt.step();
    out.push_back(loss.item<float>());
  }
  return out;
}

struct Mlp : Module {
  Linear l1{64, 128}, l2{128, 64}, l3{64, 10};
  Mlp() {
    register_module("l1", l1);
    register_module("l2", l2);
    register_module("l3", l3);
  }
  Tensor forward(const Tensor& x) override { return l3(l2(l1(x).relu()).relu()); }
};

struct Cnn : Module {
  Conv2d c1{1, 32, {3}}, c2{32, 32, {3}};
  Linear head{32 * 8 * 8, 10};
  Cnn() {
    register_module("c1", c1);
    register_module("c2", c2);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override { return head(c2(c1(x).relu()).relu().flatten(1)); }
};

void expect_near_losses(const std::vector<float>& bf16, const std::vector<float>& f32, double tol) {
  ASSERT_EQ(bf16.size(), f32.size());
  for (size_t i = 0; i < f32.size(); i++) EXPECT_NEAR(bf16[i], f32[i], tol * std::fabs(f32[i])) << "step " << i + 1;
  EXPECT_LT(f32.back(), f32.front());
  EXPECT_LT(bf16.back(), bf16.front());
}

}  // namespace

// A few training steps with bfloat16 products (in dot tiles) end near the float32 run: losses
// within 2%.
TEST(Bf16Dot, MlpAndCnnStepsNearFloat32) {
  if (!dot_tiles_here()) GTEST_SKIP() << why_no_dot_tiles() << " (the float32 kernels' steps: test_nn)";
  Tensor::manual_seed(12);
  Tensor x = Tensor::uniform({64, 64}, -1, 1).realize(), y = Tensor::randint({64}, 0, 10).realize();
  std::vector<float> mlp[2];
  for (int bf16 = 0; bf16 < 2; bf16++) {
    Tensor::manual_seed(13);
    Mlp m;
    mlp[bf16] = losses(m, x, y, bf16, 3);
  }
  expect_near_losses(mlp[1], mlp[0], 0.02);
  Tensor img = Tensor::uniform({8, 1, 12, 12}, -1, 1).realize(), label = Tensor::randint({8}, 0, 10).realize();
  std::vector<float> cnn[2];
  for (int bf16 = 0; bf16 < 2; bf16++) {
    Tensor::manual_seed(14);
    Cnn c;
    cnn[bf16] = losses(c, img, label, bf16, 2);
  }
  expect_near_losses(cnn[1], cnn[0], 0.02);
}
