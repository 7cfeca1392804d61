// The OpenCL device (label gpu; skipped with a message where no OpenCL device exists): device
// selection, error decoding, build failures naming the kernel with the build log, loops mapped
// onto work-items, and the grouped reduction through local memory and barriers.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/codegen/opt_gpu.h"
#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/opencl.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {
namespace {

using testutil::match;
using testutil::rnd;

class OpenCL : public ::testing::Test {
 protected:
  void SetUp() override {
    if (opencl_device_count() == 0) GTEST_SKIP() << "no OpenCL device (install pocl-opencl-icd)";
    device_.emplace(knobs::DEVICE, "CL");
  }
  std::optional<testutil::KnobScope<StringKnob>> device_;  // Note [knobs in tests]
  // Realizes t at DEBUG=4 and returns the generated source that was printed.
  static std::string source_of(Tensor& t) {
    testutil::KnobScope debug(knobs::DEBUG, 4);
    ::testing::internal::CaptureStderr();
    t.realize();
    return ::testing::internal::GetCapturedStderr();
  }
};

TEST(OpenCLErrors, DecodesErrorNames) {
  EXPECT_EQ(cl_error_name(-5), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(cl_error_name(-11), "CL_BUILD_PROGRAM_FAILURE");
  EXPECT_EQ(cl_error_name(-54), "CL_INVALID_WORK_GROUP_SIZE");
}

TEST_F(OpenCL, DeviceSelection) {
  EXPECT_EQ(&get_device("CL:0"), &get_device("CL"));
  EXPECT_NE(get_device("cl").description().find("CL ("), std::string::npos);
  testutil::expect_error([] { get_device("CL:" + std::to_string(opencl_device_count())); },
                         {"OpenCL device(s) found"});
  testutil::expect_error([] { get_device("CL:x"); }, {"expected CL or CL:<index>"});
}

TEST_F(OpenCL, BuildFailureReportsLogAndKernelName) {
  testutil::expect_error(
      [] { get_device("CL").compiler().compile("tg_broken", "__kernel void tg_broken(__global float* a) { a[0] = not_declared; }"); },
      {"OpenCL kernel 'tg_broken' failed to build", "CL_BUILD_PROGRAM_FAILURE", "not_declared"});
}

TEST_F(OpenCL, ElementwiseLoopsBecomeGlobalIds) {
  Tensor a = rnd({2, 3, 4, 5}, 1), b = rnd({2, 3, 4, 5}, 2);
  Tensor c = a * b + 1;
  std::string src = source_of(c);
  EXPECT_NE(src.find("get_global_id(2)"), std::string::npos) << src;  // 4 loops in 3 dimensions
  EXPECT_EQ(src.find("for ("), std::string::npos) << src;
  EXPECT_TRUE(match(c));
  Tensor t = rnd({3, 5}, 3).permute({1, 0}).contiguous();
  EXPECT_TRUE(match(t));
}

TEST_F(OpenCL, GroupedReductionUsesLocalMemoryAndBarriers) {
  for (Op op : {Op::ADD, Op::MAX}) {
    Tensor x = rnd({6, 4096}, 4);
    Tensor r = op == Op::ADD ? x.sum(1) : x.max(1);
    std::string src = source_of(r);
    EXPECT_NE(src.find("__local float tg_red0[512];"), std::string::npos) << src;  // 4096 / 8 elements each
    EXPECT_NE(src.find("barrier(CLK_LOCAL_MEM_FENCE);"), std::string::npos) << src;
    EXPECT_NE(src.find("get_local_id(0)"), std::string::npos) << src;
    EXPECT_NE(src.find("get_group_id(0)"), std::string::npos) << src;
    EXPECT_TRUE(match(r, testutil::Tol{1e-4, 1e-4}));
  }
  Tensor m = rnd({8192}, 5).mean();  // one output: one group
  EXPECT_NE(source_of(m).find("tg_red0"), std::string::npos);
  EXPECT_TRUE(match(m, testutil::Tol{1e-4, 1e-4}));
  Tensor i = testutil::rnd_int({1024}, 6, -50, 50).sum();  // integers are exact
  EXPECT_TRUE(match(i));
}

// Note [grouped reduction] and Note [elementwise lanes] (codegen/gpu_dims.cpp): many rows,
// groups of 16, strided reductions, lanes.
TEST_F(OpenCL, RowReductionsAndLanesMatch) {
  Tensor x = rnd({2048, 256}, 7);
  Tensor s = x.sum(1);
  std::string src = source_of(s);
  EXPECT_NE(src.find("tg_red0[32]"), std::string::npos) << src;  // 32 threads, 8 elements each
  EXPECT_TRUE(match(s, testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(x.softmax(-1), testutil::Tol{1e-5, 1e-4}));
  EXPECT_TRUE(match(x.sum(0), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(rnd({4096, 128}, 8).max(1)));
  Tensor a = rnd({1 << 20}, 11), b = rnd({1 << 20}, 12);
  Tensor e = (a * b + 1).relu();
  std::string esrc = source_of(e);
  EXPECT_NE(esrc.find("get_local_id(0)"), std::string::npos) << esrc;
  EXPECT_TRUE(match(e));
  // images merged into dimension 0 with lanes (Note [merged inner loops]), a padded one gated
  Tensor img = rnd({128, 32, 20, 20}, 13), bias = rnd({1, 32, 1, 1}, 14);
  EXPECT_TRUE(match((img + bias).relu()));
  EXPECT_TRUE(match(img.pad({{0, 0}, {0, 0}, {4, 4}, {4, 4}})));
}

// The kernels of the CNN's second convolution (batch 512, 5x5, 32 -> 32 channels) in a training
// step, laid out for this device (NCHW) without running them: the forward pass gets 5 x 8 and the
// input gradient 6 x 8 register tiles (Note [gpu register tiles], Note [tile lengths]); BatchNorm's statistics are
// partial sums in 1024 groups, each over one flat loop, then a short reduce of those, and the
// weight gradient a grouped reduction with the 25 taps of 4 output channels as lanes (Note
// [grouped reduction]), its group small enough for 100 combines in local memory.
TEST_F(OpenCL, ConvolutionStepLayouts) {
  Tensor x = rnd({512, 32, 24, 24}, 1), w = rnd({32, 32, 5, 5}, 2);
  x.requires_grad_(true);
  w.requires_grad_(true);
  Tensor y = x.conv2d(w);
  Tensor stats = y.sum({0, 2, 3});
  Tensors g = (y * rnd(y.shape(), 3)).sum().gradients({x, w});
  std::map<std::string, LinearKernel> kernels;
  for (auto& item : create_schedule({y.uop(), stats.uop(), g[0].uop(), g[1].uop()})) {
    if (item.kind != ScheduleItem::Kind::Kernel) continue;
    std::vector<DType> dtypes;
    for (auto& b : item.buffers) dtypes.push_back(b->dtype());
    auto choice = KernelChoice::generated(gpu_hand_coded_opts(item.ast));
    LinearKernel k = lower_with_choice(item.ast, dtypes, CodegenTarget::of(get_device("CL")), choice).kernel;
    kernels[k.name] = k;
  }
  std::string names;
  for (auto& [n, k] : kernels) names += n + " ";
  // 5 (of 20) or 6 (of 24) rows x 8 output channels per thread (Note [row tiles])
  for (const char* n : {"r_512_4_4_20__32_5_5_x40", "r_512_4_4_24__32_5_5_x48"}) {
    ASSERT_TRUE(kernels.count(n)) << n << " not in " << names;
    EXPECT_TRUE(kernels[n].group_reduces.empty());
  }
  // the forward pass's 20 columns, 4 row tiles and 2 images or channel tiles per work-group: a
  // warp's threads share one channel tile and load neighbouring columns (Note [local sizes])
  EXPECT_EQ(kernels["r_512_4_4_20__32_5_5_x40"].local_size, (std::vector<int64_t>{20, 4, 2}));
  // BatchNorm's statistics in two stages (Note [split reductions]): 32 partials per channel over
  // 16 images each, 1024 groups of 256 threads, then 32 outputs of 32 partials, one thread each
  ASSERT_TRUE(kernels.count("r_32_32__16_20_20")) << names;
  EXPECT_EQ(kernels["r_32_32__16_20_20"].global_size, (std::vector<int64_t>{1024 * 256}));
  ASSERT_TRUE(kernels.count("r_32__32")) << names;
  EXPECT_TRUE(kernels["r_32__32"].group_reduces.empty());
  // the weight gradient in two stages (Note [split long reductions]): 8 partials over 64 images
  // each, 25 taps x 4 output channels per group, then 25600 outputs of 8 partials
  ASSERT_TRUE(kernels.count("r_8_8_32__64_20_20_x100")) << names;
  const LinearKernel& dw = kernels["r_8_8_32__64_20_20_x100"];
  EXPECT_EQ(dw.group_reduces.size(), 100u);
  EXPECT_EQ(dw.local_size, (std::vector<int64_t>{32}));  // 100 float combines of 32 slots: 12.5 KiB
  EXPECT_EQ(dw.global_size, (std::vector<int64_t>{8 * 8 * 32 * 32}));
  ASSERT_TRUE(kernels.count("r_32_32_5_5__8")) << names;
  EXPECT_TRUE(kernels["r_32_32_5_5__8"].group_reduces.empty());
}

// Column sums of row-major tensors (a bias gradient, LayerNorm's weight gradient) laid out for
// this device without running them (Note [split column sums] in schedule/split_reduce.cpp, Note
// [column sums] in codegen/opt_gpu.cpp): [16384, 768] in 128 parts of 128 rows, 98304 threads
// in 384 work-groups, neighbouring threads on neighbouring columns, each with 8 partial sums of
// rows (the kernel's name counts the 16 trips left), then 768 threads over the 128 partials.
// [16, 1024, 768] over its first two axes splits along the 1024; a weight gradient's contraction
// and small or short sums stay one kernel without partial sums.
TEST_F(OpenCL, ColumnSumLayouts) {
  const CodegenTarget cl = CodegenTarget::of(get_device("CL"));
  struct Lowered {
    LinearKernel kernel;
    std::string opts;
  };
  auto layouts = [&](const Tensor& t) {
    std::map<std::string, Lowered> out;
    for (auto& item : create_schedule({t.uop()})) {
      if (item.kind != ScheduleItem::Kind::Kernel) continue;
      std::vector<DType> dtypes;
      for (auto& b : item.buffers) dtypes.push_back(b->dtype());
      auto choice = KernelChoice::generated(gpu_hand_coded_opts(item.ast, *cl.policy.gpu));
      LinearKernel k = lower_with_choice(item.ast, dtypes, cl, choice).kernel;
      out[k.name] = {k, choice.str()};
    }
    return out;
  };
  auto names = [](const std::map<std::string, Lowered>& ks) {
    std::string s;
    for (auto& [n, k] : ks) s += n + " (" + k.opts + ") ";
    return s;
  };
  Tensor x = Tensor::empty({16384, 768});
  auto ks = layouts(x.sum(0));
  ASSERT_EQ(ks.size(), 2u) << names(ks);
  ASSERT_TRUE(ks.count("r_128_768__16")) << names(ks);
  const Lowered& parts = ks["r_128_768__16"];
  EXPECT_EQ(parts.opts, "UNROLL(2,8)");
  EXPECT_TRUE(parts.kernel.group_reduces.empty());
  EXPECT_EQ(parts.kernel.global_size, (std::vector<int64_t>{768, 128}));  // columns on dimension 0
  EXPECT_EQ(parts.kernel.local_size, (std::vector<int64_t>{256, 1}));
  ASSERT_TRUE(ks.count("r_768__16")) << names(ks);
  EXPECT_EQ(ks["r_768__16"].opts, "UNROLL(1,8)");
  EXPECT_EQ(ks["r_768__16"].kernel.global_size, (std::vector<int64_t>{768}));
  // LayerNorm's weight gradient: the row statistics broadcast along the columns
  Tensor g = Tensor::empty({16, 1024, 768}), mean = Tensor::empty({16, 1024, 1}), rstd = Tensor::empty({16, 1024, 1});
  auto ln = layouts((g * ((g - mean) * rstd)).sum({0, 1}));
  EXPECT_EQ(ln.size(), 2u) << names(ln);
  ASSERT_TRUE(ln.count("r_128_768__16")) << names(ln);
  EXPECT_EQ(ln["r_128_768__16"].opts, "UNROLL(3,8)");  // the 8 rows of a part, whole
  EXPECT_EQ(ln["r_128_768__16"].kernel.global_size, (std::vector<int64_t>{768, 128}));
  // a weight gradient [16384, 64] x [16384, 64]: no column sum
  Tensor a = Tensor::empty({16384, 64}), b = Tensor::empty({16384, 64});
  auto wgrad = layouts((a.reshape({16384, 64, 1}) * b.reshape({16384, 1, 64})).sum(0));
  ASSERT_EQ(wgrad.size(), 1u) << names(wgrad);
  EXPECT_EQ(wgrad.begin()->second.opts.find("UNROLL"), std::string::npos) << names(wgrad);
  EXPECT_EQ(layouts(Tensor::empty({1000, 77}).sum(0)).size(), 1u);
  EXPECT_EQ(layouts(Tensor::empty({3, 5000}).sum(0)).size(), 1u);
}

TEST_F(OpenCL, ShortReductionsStayInOneThread) {
  Tensor x = rnd({64, 20}, 7);
  Tensor r = x.sum(1);
  std::string src = source_of(r);
  EXPECT_EQ(src.find("tg_red0"), std::string::npos) << src;
  EXPECT_TRUE(match(r));
}

TEST_F(OpenCL, HalfTypesAsStorage) {
  Tensor h = rnd({300}, 8).cast(DType::Float16);
  Tensor y = (h * h + h).sum();
  EXPECT_TRUE(match(y, testutil::Tol{2e-2, 2e-2}));
  Tensor b = (rnd({33}, 9).cast(DType::BFloat16) * 3).cast(DType::Float32);
  EXPECT_TRUE(match(b, testutil::tol_for(DType::BFloat16)));
}

}  // namespace
}  // namespace tg
