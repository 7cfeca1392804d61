// Fused attention on CUDA (label gpu). Two halves: the template kernels rendered for CUDA compile
// with NVRTC for sm_90 (no GPU needed; skipped without NVRTC), and, on a GPU (skipped without
// one), the fused forward and gradients against the composition on the same device in float32
// and bfloat16, the tensor-core kernels against it, the peak memory of a T=4096 step, which holds
// no [B, H, T, T] tensor, and the step times at GPT-2's size.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cuda_test.h"
#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cuda.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {
namespace {

// Every template, for every dtype it takes and head dims 64 (causal) and 128 (not), compiles.
TEST(AttentionNvrtc, TemplateKernelsCompileForSm90) {
  if (nvrtc_description().rfind("NVRTC ", 0) != 0) GTEST_SKIP() << "NVRTC is not available: " << nvrtc_description();
  int compiled = 0;
  for (auto kernel : {TemplateKernel::AttentionForward, TemplateKernel::AttentionBackwardQ, TemplateKernel::AttentionBackwardKV})
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
      for (int64_t e : {64, 128}) {
        AttentionSpec spec{kernel, 24, 1000, 1000, e, e, dt, e == 64, 0.125};
        ASSERT_TRUE(attention_kernel_takes(spec, KernelDialect::CUDA));
        TemplateSource t = render_attention(spec, KernelDialect::CUDA);
        EXPECT_EQ(t.source.find("#include"), std::string::npos) << t.source;
        EXPECT_EQ(t.kernel.local_size, (std::vector<int64_t>{64, 1}));
        EXPECT_EQ(t.kernel.global_size, (std::vector<int64_t>{1024, 24}));
        CudaBinary b = cuda_compile(t.kernel.name, t.source, 90);
        EXPECT_EQ(b.image.substr(0, 4), "\x7f" "ELF") << t.kernel.name;
        compiled++;
      }
  EXPECT_EQ(compiled, 18);
  AttentionSpec wide{TemplateKernel::AttentionForward, 24, 1000, 1000, 256, 256, DType::Float32, true, 0.0625};
  EXPECT_FALSE(attention_kernel_takes(wide, KernelDialect::CUDA));
}

// The tensor-core kernels (Note [tensor-core attention]): 4 warps a block of 64 rows (128 in the
// forward pass with two row tiles a warp: Note [m-tiles a warp]), mma.sync m16n8k16 on the input
// type; they compile for bfloat16 and float16, and take neither float32,
// nor OpenCL, nor a head dim of 40.
TEST(AttentionNvrtc, TensorCoreKernelsCompileForSm90) {
  if (nvrtc_description().rfind("NVRTC ", 0) != 0) GTEST_SKIP() << "NVRTC is not available: " << nvrtc_description();
  for (auto kernel : {TemplateKernel::AttentionForward, TemplateKernel::AttentionBackwardQ, TemplateKernel::AttentionBackwardKV})
    for (DType dt : {DType::BFloat16, DType::Float16})
      for (int64_t e : {64, 128}) {
        AttentionSpec spec{kernel, 24, 1000, 1000, e, e, dt, e == 64, 0.125, true};
        ASSERT_TRUE(attention_tensor_cores_take(spec, KernelDialect::CUDA));
        TemplateSource t = render_attention(spec, KernelDialect::CUDA);
        EXPECT_EQ(t.kernel.local_size, (std::vector<int64_t>{128, 1}));
        const int64_t blocks = kernel == TemplateKernel::AttentionForward ? 8 : 16;  // of 128 or 64 rows
        EXPECT_EQ(t.kernel.global_size, (std::vector<int64_t>{blocks * 128, 24}));
        EXPECT_NE(t.source.find("mma.sync.aligned.m16n8k16.row.col.f32."), std::string::npos) << t.source;
        std::string type = std::string("#define TG_MMA_T \"") + (dt == DType::BFloat16 ? "bf16" : "f16") + "\"";
        EXPECT_NE(t.source.find(type), std::string::npos) << t.source;
        CudaBinary b = cuda_compile(t.kernel.name, t.source, 90);
        EXPECT_EQ(b.image.substr(0, 4), "\x7f" "ELF") << t.kernel.name;
      }
  {
    testutil::KnobScope tiles(knobs::ATTENTION_FORWARD_TILES, 1);
    AttentionSpec one{
        TemplateKernel::AttentionForward, 24, 1000, 1000, 64, 64, DType::BFloat16, true, 0.125, true};
    TemplateSource t = render_attention(one, KernelDialect::CUDA);
    EXPECT_EQ(t.kernel.global_size, (std::vector<int64_t>{16 * 128, 24}));  // 16 blocks of 64 rows
    EXPECT_EQ(cuda_compile(t.kernel.name, t.source, 90).image.substr(0, 4),
              "\x7f"
              "ELF");
  }
  AttentionSpec f32{TemplateKernel::AttentionForward, 24, 1000, 1000, 64, 64, DType::Float32, true, 0.125};
  EXPECT_FALSE(attention_tensor_cores_take(f32, KernelDialect::CUDA));
  f32.dtype = DType::BFloat16;
  EXPECT_FALSE(attention_tensor_cores_take(f32, KernelDialect::OpenCL));
  f32.e = f32.ev = 40;
  EXPECT_FALSE(attention_tensor_cores_take(f32, KernelDialect::CUDA));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto x = a.cast(DType::Float32).to("CPU").to_vector<float>(), y = b.cast(DType::Float32).to("CPU").to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); i++) m = std::max(m, std::abs(double(x[i]) - double(y[i])));
  return m;
}

class FusedAttentionCuda : public testutil::CudaTest {
 protected:
  static Tensor random(const Shape& s, uint32_t seed, DType dt) {
    return Tensor::from_vector(testutil::rnd_values(prod(s), seed, -1, 1), s, {.device = "CPU"}).cast(dt).to("CUDA");
  }
  // The output and the gradients of q, k and v for a weighted sum of it, fused or composed.
  // flash: FLASH_ATTENTION (0 the composition, 1 the fused kernels, 2 the tensor-core forward).
  static Tensors run(int64_t b, int64_t h, int64_t t, int64_t e, bool causal, DType dt, int flash) {
    testutil::KnobScope knob(knobs::FLASH_ATTENTION, flash);
    Tensor q = random({b, h, t, e}, 1, dt).realize().requires_grad_();
    Tensor k = random({b, h, t, e}, 2, dt).realize().requires_grad_();
    Tensor v = random({b, h, t, e}, 3, dt).realize().requires_grad_();
    Tensor w = random({b, h, t, e}, 4, dt);
    Tensor out = q.scaled_dot_product_attention(k, v, causal);
    Tensors g = (out * w).cast(DType::Float32).sum().gradients({q, k, v});
    return {out.realize(), g[0].realize(), g[1].realize(), g[2].realize()};
  }
};

TEST_F(FusedAttentionCuda, Float32MatchesComposition) {
  for (bool causal : {true, false}) {
    Tensors fused = run(2, 4, 300, 64, causal, DType::Float32, 1);
    Tensors composed = run(2, 4, 300, 64, causal, DType::Float32, 0);
    for (size_t i = 0; i < 4; i++) EXPECT_LT(max_abs_diff(fused[i], composed[i]), 1e-4) << "causal " << causal << " result " << i;
  }
}

TEST_F(FusedAttentionCuda, BFloat16MatchesComposition) {
  Tensors fused = run(2, 4, 300, 64, true, DType::BFloat16, 1);
  Tensors composed = run(2, 4, 300, 64, true, DType::BFloat16, 0);
  EXPECT_LT(max_abs_diff(fused[0], composed[0]), 2e-2);
  for (size_t i = 1; i < 4; i++) EXPECT_LT(max_abs_diff(fused[i], composed[i]), 5e-2) << "result " << i;
}

// The tensor-core kernels (FLASH_ATTENTION=2) against the composition: bfloat16 and float16,
// causal and not, 300 rows (no multiple of a block), head dims 64 and 128.
TEST_F(FusedAttentionCuda, TensorCoresMatchComposition) {
  for (DType dt : {DType::BFloat16, DType::Float16})
    for (int64_t e : {64, 128})
      for (bool causal : {true, false}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " head dim " << e << " causal " << causal);
        {
          testutil::KnobScope knob(knobs::FLASH_ATTENTION, 2);
          Tensor q = random({1, 1, 64, e}, 1, dt).requires_grad_();
          Tensor grad = q.scaled_dot_product_attention(q, q, causal).cast(DType::Float32).sum().gradients({q})[0];
          int tensor_core_kernels = 0;
          for (auto& item : create_schedule({grad.uop()}))
            if (item.ast->op == Op::TEMPLATE_KERNEL) tensor_core_kernels += AttentionSpec::decode(item.ast->arg_ints()).tensor_cores;
          EXPECT_EQ(tensor_core_kernels, 3);  // the forward pass, dQ and dK/dV
        }
        Tensors tc = run(2, 3, 300, e, causal, dt, 2), composed = run(2, 3, 300, e, causal, dt, 0);
        EXPECT_LT(max_abs_diff(tc[0], composed[0]), 2e-2);
        for (size_t i = 1; i < 4; i++) EXPECT_LT(max_abs_diff(tc[i], composed[i]), 5e-2) << "gradient " << i;
      }
}

// A causal step at T=4096 (B=1, H=8, head dim 64, bfloat16): one float32 [1, 8, 4096, 4096]
// tensor is 512 MiB; the fused step's peak stays far below it, the composition's reaches it.
TEST_F(FusedAttentionCuda, PeakMemoryAtT4096HoldsNoScores) {
  const int64_t b = 1, h = 8, t = 4096, e = 64;
  const double scores_bytes = double(b * h * t * t) * 4;
  auto peak_of = [&](bool fused) {
    MemoryPool& pool = get_device("CUDA").pool();
    pool.reset_peak();
    size_t before = pool.stats().bytes_in_use;
    run(b, h, t, e, true, DType::BFloat16, fused ? 1 : 0);
    return double(pool.stats().peak_bytes - before);
  };
  double fused = peak_of(true), composed = peak_of(false);
  std::printf("peak memory above the start, T=4096: fused %.1f MiB, composition %.1f MiB, one score tensor %.1f MiB\n",
              fused / (1 << 20), composed / (1 << 20), scores_bytes / (1 << 20));
  // a bfloat16 score tensor alone is half of scores_bytes; q, k, v, the output, the gradients
  // and their float32 copies take about 74 MiB (H200)
  EXPECT_LT(fused, scores_bytes / 4);
  EXPECT_GE(composed, scores_bytes / 2);  // bfloat16 weights at least
}

// GPT-2's attention (B=16, H=12, T=1024, head dim 64, causal, bfloat16), forward and backward,
// for each FLASH_ATTENTION setting: the median of 5 timed steps is printed, and each setting's
// output must agree with the composition's.
TEST_F(FusedAttentionCuda, Gpt2SizeStepTimes) {
  Tensors reference;
  for (int flash : {0, 1, 2}) {
    std::vector<double> ms;
    Tensors last;
    for (int rep = 0; rep < 7; rep++) {
      get_device("CUDA").synchronize();
      auto t0 = std::chrono::steady_clock::now();
      last = run(16, 12, 1024, 64, true, DType::BFloat16, flash);
      get_device("CUDA").synchronize();
      if (rep >= 2) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("FLASH_ATTENTION=%d: attention forward+backward at B=16 H=12 T=1024 E=64 bf16: %.2f ms (with input setup)\n",
                flash, ms[ms.size() / 2]);
    if (flash == 0) reference = last;
    else EXPECT_LT(max_abs_diff(last[0], reference[0]), 2e-2) << "FLASH_ATTENTION=" << flash;
  }
}

}  // namespace
}  // namespace tg
