// The CUDA device (label gpu). Two halves: NVRTC and the renderer, which need the toolkit's
// libnvrtc but no GPU (they run wherever the build has CUDA; skipped when NVRTC is missing), and
// the device itself (skipped with the reason where there is no GPU or driver): device selection,
// decoded errors, build failures naming the kernel with the NVRTC log, loops on threads, the
// grouped reduction through shared memory, timing, half types.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "cuda_test.h"
#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/codegen/gpu_dims.h"
#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/codegen/opt_gpu.h"
#include "tinygrad/codegen/render_cuda.h"
#include "tinygrad/codegen/tensor_core.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cuda.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/schedule/split_reduce.h"

namespace tg {
namespace {

using testutil::match;
using testutil::rnd;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) n++;
  return n;
}

// The kernels of t's schedule on the CPU device, laid out and rendered as CUDA for sm_90.
struct RenderedKernel {
  std::string name, source;
  LinearKernel kernel;
};
std::vector<RenderedKernel> render_cuda(const Tensors& ts) {
  std::vector<UOpPtr> outs;
  for (auto& t : ts) outs.push_back(t.uop());
  CUDARenderer r;
  GpuLimits limits;  // CUDA's defaults
  limits.group_threads_per_slot = CUDARenderer::WARP;
  limits.vector_bytes = CUDARenderer::VECTOR_BYTES;
  DevicePolicy policy{.gpu = limits};
  CodegenTarget cuda{r, policy, /*native_transcendentals=*/true, /*tensor_cores=*/false};
  std::vector<RenderedKernel> out;
  for (auto& item : create_schedule(outs)) {
    if (item.kind != ScheduleItem::Kind::Kernel) continue;
    std::vector<DType> dtypes;
    for (auto& b : item.buffers) dtypes.push_back(b->dtype());
    auto k = lower_with_choice(item.ast, dtypes, cuda, KernelChoice::generated(gpu_hand_coded_opts(item.ast)));
    out.push_back({k.kernel.name, k.source, k.kernel});
  }
  return out;
}

class Nvrtc : public ::testing::Test {
 protected:
  void SetUp() override {
    if (nvrtc_description().rfind("NVRTC ", 0) != 0) GTEST_SKIP() << "NVRTC is not available: " << nvrtc_description();
  }
};

TEST(CudaErrors, DecodesErrorNames) {
  EXPECT_EQ(cuda_error_name(0), "CUDA_SUCCESS");
  EXPECT_EQ(cuda_error_name(2), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(cuda_error_name(100), "CUDA_ERROR_NO_DEVICE");
  EXPECT_EQ(cuda_error_name(700), "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(cuda_error_name(123456), "CUDA error 123456");
}

// Without a usable driver, opening the device fails with the reason (the one `tg info` prints).
TEST(CudaAvailability, UnavailableDeviceSaysWhy) {
  std::string why = cuda_unavailable_reason();
  if (cuda_device_count() > 0 && nvrtc_description().rfind("NVRTC ", 0) == 0) {
    EXPECT_EQ(why, "");
    EXPECT_NE(get_device("CUDA").description().find("sm_"), std::string::npos);
    return;
  }
  ASSERT_NE(why, "");
  bool known = why.find("libcuda.so.1 not found") != std::string::npos || why.find("no CUDA device") != std::string::npos ||
               why.find("cuInit failed") != std::string::npos || why.find("NVRTC not found") != std::string::npos;
  EXPECT_TRUE(known) << why;
  testutil::expect_error([] { get_device("CUDA"); }, {"device 'CUDA': ", why});
}

TEST_F(Nvrtc, BuildFailureReportsLogAndKernelName) {
  testutil::expect_error(
      [] { cuda_compile("tg_broken", "extern \"C\" __global__ void tg_broken(float* a) { a[0] = not_declared; }", 90); },
      {"CUDA kernel 'tg_broken' failed to build for sm_90", "NVRTC_ERROR_COMPILATION", "not_declared", "tg_broken(float* a)"});
}

TEST_F(Nvrtc, CubinForTheCardAndPtxBeyondNvrtc) {
  auto dir = std::filesystem::temp_directory_path() / ("tg_test_cuda_cache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  testutil::KnobScope cachedir(knobs::CACHEDIR, dir.string());
  std::string src = "extern \"C\" __global__ void tg_scale(float* a) { a[threadIdx.x] *= 2.0f; }";
  CudaBinary first = cuda_compile("tg_scale", src, 90);
  EXPECT_EQ(first.target, "sm_90");
  EXPECT_FALSE(first.from_cache);
  ASSERT_GT(first.image.size(), 4u);
  EXPECT_EQ(first.image.substr(0, 4), "\x7f" "ELF");  // a cubin is an ELF image
  CudaBinary second = cuda_compile("tg_scale", src, 90);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.image, first.image);
  EXPECT_FALSE(cuda_compile("tg_scale", src + "\n", 90).from_cache);  // the key is the exact source
  // a card newer than this NVRTC gets PTX for the newest architecture NVRTC knows
  CudaBinary ptx = cuda_compile("tg_scale", src, 9990);
  EXPECT_EQ(ptx.target.rfind("compute_", 0), 0u) << ptx.target;
  EXPECT_NE(ptx.image.find(".entry tg_scale"), std::string::npos);
  testutil::expect_error([&] { cuda_compile("tg_scale", src, 10); }, {"cannot compile for sm_10"});
  std::filesystem::remove_all(dir);
}

// Every kernel of these graphs, rendered for CUDA, is valid CUDA C++ for NVRTC (no GPU needed):
// float16/bfloat16 storage, bool, int64, float64, infinities, bitcasts, grouped reductions,
// gathers, atomic adds of every dtype a scatter-add accumulates in, a kernel with two outputs.
TEST_F(Nvrtc, RenderedKernelsCompile) {
  TensorOptions cpu{.device = "CPU"};
  auto r = [&](const Shape& s, uint32_t seed) { return Tensor::from_vector(testutil::rnd_values(prod(s), seed), s, cpu); };
  Tensor x = r({64, 300}, 1), y = r({300, 32}, 2), big = r({4096}, 3), rows = r({1024, 1024}, 4);
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{5, 0, 63, 5, 2, 2, 9, 1}, {8}, cpu);
  Tensor moment = x * 0.9 + y.sum() * 0.1;
  Tensors graphs = {
      x.matmul(y).relu().softmax(1),
      (x.exp() + x.abs().log() + x.sin() + x.abs().sqrt()).max(1),
      big.sum(),
      (x < 0.5f).logical_and(x > -0.5f),
      x.cast(DType::Float16) * 3 + 1,
      (x.cast(DType::BFloat16) * 3).cast(DType::Float32).sum(0),
      x.cast(DType::Float64).exp().sum(1),
      x.cast(DType::Int64) * 7 + 3,
      (x * 100).cast(DType::UInt8),
      x.bitcast(DType::Int32),
      x.cast(DType::Float16).bitcast(DType::BFloat16),
      x.argmax(1),
      x.cast(DType::Int32).min(1),
      rows.softmax(1),                           // grouped rows, several warps
      rows.cast(DType::Float64).sum(1),          // float64 shuffles
      (rows * 10).cast(DType::Int32).max(1),     // integer max through shuffles
      rows.shrink({{0, 512}, {0, 128}}).sum(1),  // 16 threads a row: less than a warp
      rows * 2 + 1,                              // elementwise lanes
      x.index_select(0, idx),                    // gathers
      x.zeros_like().scatter_add(0, idx.reshape({8, 1}).expand({8, 300}), x.shrink({{0, 8}, {0, 300}})),  // atomic adds
      x.cast(DType::Float64).zeros_like().scatter_add(1, idx.reshape({1, 8}).expand({64, 8}), x.cast(DType::Float64).shrink({{0, 64}, {0, 8}})),
      (x * 9).cast(DType::Int64).scatter_add(1, idx.reshape({1, 8}).expand({64, 8}), (x * 9).cast(DType::Int64).shrink({{0, 64}, {0, 8}})),
      (x * 9).cast(DType::Int32).scatter_add(1, idx.reshape({1, 8}).expand({64, 8}), (x * 9).cast(DType::Int32).shrink({{0, 64}, {0, 8}})),
      moment, moment.sqrt() + x,                 // one kernel, two outputs
  };
  int kernels = 0, atomic = 0, two_outputs = 0;
  bool grouped = false;
  for (auto& k : render_cuda(graphs)) {
    kernels++;
    grouped |= !k.kernel.group_reduces.empty();
    atomic += k.source.find("atomicAdd(") != std::string::npos;
    two_outputs += k.kernel.params.size() > 1 && k.kernel.params[0].written && k.kernel.params[1].written;
    EXPECT_NE(k.source.find("extern \"C\" __global__ void __launch_bounds__("), std::string::npos) << k.source;
    EXPECT_EQ(k.source.find("#include"), std::string::npos) << k.source;
    if (k.source.find("int acc0 = (-2147483648)") != std::string::npos) {  // an int32 max reduction
      EXPECT_NE(k.source.find("= tg_max_i32(acc0, "), std::string::npos) << k.source;
    }
    CudaBinary b = cuda_compile(k.name, k.source, 90);
    EXPECT_EQ(b.image.substr(0, 4), "\x7f" "ELF") << k.name;
  }
  EXPECT_GE(kernels, static_cast<int>(graphs.size()));
  EXPECT_TRUE(grouped);  // big.sum() is a grouped reduction
  EXPECT_EQ(atomic, 4);
  EXPECT_EQ(two_outputs, 1);
}

// A convolution's filter loops (3 trips) are unrolled whole, its input-channel loop (16) is not
// (Note [unrolled short loops] in codegen/render_cuda.cpp).
TEST(CudaRenderer, ShortLoopsAreUnrolled) {
  TensorOptions cpu{.device = "CPU"};
  Tensor x = Tensor::from_vector(testutil::rnd_values(2 * 16 * 12 * 12, 1), {2, 16, 12, 12}, cpu);
  Tensor w = Tensor::from_vector(testutil::rnd_values(4 * 16 * 3 * 3, 2), {4, 16, 3, 3}, cpu);
  int convolutions = 0;
  for (auto& k : render_cuda({x.conv2d(w)})) {
    if (k.source.find("< (16ll)") == std::string::npos) continue;
    convolutions++;
    size_t pragmas = 0;
    const std::string unroll = "#pragma unroll";
    for (size_t at = k.source.find(unroll); at != std::string::npos; at = k.source.find(unroll, at + 1)) pragmas++;
    EXPECT_EQ(pragmas, 2u) << k.source;
    size_t channel_loop = k.source.find("for (long long");
    EXPECT_EQ(k.source.rfind("#pragma unroll", channel_loop), std::string::npos) << k.source;
  }
  EXPECT_EQ(convolutions, 1);
}

// The CNN's 5x5 32->32 convolution at batch 512 (Note [tensor-core contractions] in
// codegen/tensor_core.cpp): its forward pass is a 204800 x 32 x 800 contraction in warp tiles of
// 4 x 4 mma blocks (16 mmas per step of 8 along K), 4 warps a block, and compiles for sm_90; a
// sum (no product) and a convolution with 25 taps (no multiple of 8 along K) are not taken.
TEST(CudaRenderer, ConvolutionsBecomeTensorCoreKernels) {
  TensorOptions cpu{.device = "CPU"};
  auto r = [&](const Shape& s, uint32_t seed) {
    return Tensor::from_vector(testutil::rnd_values(prod(s), seed), s, cpu);
  };
  auto tensor_core_kernels = [](const Tensor& t) {
    std::vector<LinearKernel> out;
    for (auto& item : create_schedule({t.uop()})) {
      if (item.kind != ScheduleItem::Kind::Kernel) continue;
      std::vector<DType> dtypes;
      for (auto& b : item.buffers) dtypes.push_back(b->dtype());
      if (auto k = tensor_core_kernel(item.ast, dtypes)) out.push_back(*k);
    }
    return out;
  };
  auto ks = tensor_core_kernels(r({512, 32, 24, 24}, 1).conv2d(r({32, 32, 5, 5}, 2)));
  ASSERT_EQ(ks.size(), 1u);
  std::string src = CUDARenderer{}.render(ks[0]);
  EXPECT_EQ(ks[0].name, "r_tc_1_204800_32__800");
  EXPECT_EQ(ks[0].local_size, (std::vector<int64_t>{128})) << src;
  EXPECT_EQ(ks[0].global_size, (std::vector<int64_t>{204800 / 64 * 32})) << src;
  EXPECT_EQ(count_of(src, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"), 16u) << src;
  EXPECT_EQ(count_of(src, "< (100ll)"), 1u) << src;  // 800 along K in steps of 8
  if (nvrtc_description().rfind("NVRTC ", 0) == 0) {
    EXPECT_EQ(cuda_compile(ks[0].name, src, 90).image.substr(0, 4),
              "\x7f"
              "ELF");
  }
  EXPECT_TRUE(tensor_core_kernels(r({4096, 1024}, 3).sum(1)).empty());
  EXPECT_TRUE(tensor_core_kernels(r({512, 1, 28, 28}, 4).conv2d(r({32, 1, 5, 5}, 5))).empty());
}

// gridDim.y and gridDim.z are limited to 65535 blocks: such kernels move to dimension 0.
TEST(CudaRenderer, GridBeyondLimitsUsesDimensionZero) {
  TensorOptions cpu{.device = "CPU"};
  Tensor a = Tensor::from_vector(testutil::rnd_values(131071 * 4, 1), {131071, 2, 2}, cpu);  // 131071 is prime
  auto ks = render_cuda({a * 2 + 1});
  ASSERT_EQ(ks.size(), 1u);
  EXPECT_EQ(ks[0].kernel.global_size, std::vector<int64_t>{131071 * 4});
  EXPECT_EQ(ks[0].source.find("blockIdx.y"), std::string::npos) << ks[0].source;
  // blockDim.z is at most 64: a larger local size becomes its largest divisor within that; the
  // inner dimensions, odd and longer than a warp, keep power-of-two local sizes (1 here)
  Tensor deep = Tensor::from_vector(testutil::rnd_values(256 * 37 * 41, 1), {256, 37, 41}, cpu);
  auto ks3 = render_cuda({deep * 2});
  ASSERT_EQ(ks3.size(), 1u);
  EXPECT_EQ(ks3[0].kernel.local_size, (std::vector<int64_t>{1, 1, 64}));
  // a short dimension gets all its threads, not only a power of two of them (Note [local sizes])
  Tensor conv_like = Tensor::from_vector(testutil::rnd_values(64 * 20 * 5, 1), {64, 20, 5}, cpu);
  auto ks4 = render_cuda({conv_like * 2});
  ASSERT_EQ(ks4.size(), 1u);
  EXPECT_EQ(ks4[0].kernel.local_size, (std::vector<int64_t>{5, 20, 2}));
  Tensor wide = Tensor::from_vector(testutil::rnd_values(512 * 196, 1), {512, 196}, cpu);
  auto ks5 = render_cuda({wide * 2});
  ASSERT_EQ(ks5.size(), 1u);
  EXPECT_EQ(ks5[0].kernel.local_size, (std::vector<int64_t>{4, 64}));
  Tensor small = Tensor::from_vector(testutil::rnd_values(60, 1), {3, 4, 5}, cpu);
  auto ks2 = render_cuda({small * 2});
  ASSERT_EQ(ks2.size(), 1u);
  EXPECT_EQ(ks2[0].kernel.global_size.size(), 3u);
}

// GPT-2's bias gradient, a column sum of [16, 1024, 768], as the scheduler splits it on CUDA (Note
// [split column sums] in schedule/split_reduce.cpp: 2^18 partials): 256 parts of 16 x 4 rows,
// then the 768 sums of 256 partials. The first stage runs one thread per output with 8 partial
// sums of rows (Note [column sums] in codegen/opt_gpu.cpp), its loops short enough to unroll
// whole; the columns are dimension 0, so the 32 threads of a warp read 32 neighbouring elements
// of a row, and its 196608 threads fill 768 blocks of 256 for the 132 SMs of an H100 or H200. The
// second stage runs a group of 32 threads per column. NVRTC compiles both for sm_90.
TEST(CudaRenderer, ColumnSumsReadRowsCoalesced) {
  TensorOptions cpu{.device = "CPU"};
  auto parts = render_cuda({Tensor::empty({16, 256, 4, 768}, cpu).sum({0, 2})});
  auto partials = render_cuda({Tensor::empty({256, 768}, cpu).sum(0)});
  ASSERT_EQ(parts.size(), 1u);
  ASSERT_EQ(partials.size(), 1u);
  const LinearKernel& k = parts[0].kernel;
  EXPECT_EQ(k.name, "r_256_768__2_4");  // 2 trips of 8 batches by 4 rows
  EXPECT_TRUE(k.group_reduces.empty());
  EXPECT_EQ(k.global_size, (std::vector<int64_t>{768, 256}));
  EXPECT_EQ(k.local_size, (std::vector<int64_t>{256, 1}));
  EXPECT_EQ(k.global_size[0] / k.local_size[0] * k.global_size[1], 768);
  EXPECT_NE(parts[0].source.find("threadIdx.x"), std::string::npos) << parts[0].source;
  for (int lane = 0; lane < 8; lane++)  // 8 accumulators
    EXPECT_NE(parts[0].source.find("acc" + std::to_string(lane) + " = "), std::string::npos) << parts[0].source;
  EXPECT_EQ(count_of(parts[0].source, "#pragma unroll"), 2u) << parts[0].source;
  EXPECT_EQ(partials[0].kernel.name, "r_768__256");
  EXPECT_EQ(partials[0].kernel.local_size, (std::vector<int64_t>{32}));
  EXPECT_EQ(partials[0].kernel.global_size, (std::vector<int64_t>{768 * 32}));
  if (nvrtc_description().rfind("NVRTC ", 0) != 0) return;
  for (auto* r : {&parts[0], &partials[0]}) {
    EXPECT_EQ(cuda_compile(r->name, r->source, 90).image.substr(0, 4), "\x7f" "ELF") << r->source;
  }
}

// Note [thread mapping on the graph]: the mapped graph has no output loop left, a grouped
// reduction's REDUCE runs over the loop each thread walks and carries the group's thread index,
// and the launch comes back beside the graph.
TEST(CudaRenderer, ThreadMappingRewritesTheGraph) {
  TensorOptions cpu{.device = "CPU"};
  Tensor x = Tensor::from_vector(testutil::rnd_values(4096 * 1024, 1), {4096, 1024}, cpu);
  std::vector<ScheduleItem> items = create_schedule({x.sum(1).uop()});
  ASSERT_EQ(items.size(), 1u);
  GpuLimits limits;
  limits.group_threads_per_slot = CUDARenderer::WARP;
  ThreadMappedKernel m = map_threads(apply_opts(items[0].ast, gpu_hand_coded_opts(items[0].ast)), limits);
  EXPECT_EQ(m.launch.name, "r_4096__1024");
  EXPECT_EQ(m.launch.global_size, std::vector<int64_t>{4096 * 128});
  EXPECT_EQ(m.launch.local_size, std::vector<int64_t>{128});
  std::set<const UOp*> walked, ranges;
  int reduces = 0;
  for (auto& n : toposort({m.ast})) {
    if (n->op == Op::RANGE) ranges.insert(n.get());
    if (n->op != Op::REDUCE) continue;
    reduces++;
    ASSERT_EQ(n->src.size(), 3u);
    walked.insert(n->src[1].get());
    ASSERT_EQ(n->src[2]->op, Op::SPECIAL);
    EXPECT_EQ(special_kind(n->src[2]->arg_int()), SpecialKind::LocalId);
    EXPECT_EQ(n->src[2]->src[0]->const_value(), 128);
  }
  EXPECT_GE(reduces, 1);
  EXPECT_EQ(ranges, walked);  // no output loop left
}

// Note [grouped reduction]: rows are grouped however many there are, all on dimension 0;
// strided reductions with many outputs and matmuls stay one thread per output. Note [elementwise lanes].
TEST(CudaRenderer, RowsAreGroupedAndLargeElementwiseKernelsGetLanes) {
  TensorOptions cpu{.device = "CPU"};
  Tensor x = Tensor::from_vector(testutil::rnd_values(4096 * 1024, 1), {4096, 1024}, cpu);
  auto rows = render_cuda({x.sum(1)});
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0].kernel.group_reduces.size(), 1u);
  EXPECT_EQ(rows[0].kernel.global_size, std::vector<int64_t>{4096 * 128});  // 128 threads, 8 elements each
  EXPECT_EQ(rows[0].kernel.local_size, std::vector<int64_t>{128});
  EXPECT_NE(rows[0].source.find("__shfl_xor_sync"), std::string::npos) << rows[0].source;
  auto cols = render_cuda({x.reshape({1024, 4096}).sum(0)});  // 4096 strided outputs
  ASSERT_EQ(cols.size(), 1u);
  EXPECT_TRUE(cols[0].kernel.group_reduces.empty()) << cols[0].source;
  Tensor w = Tensor::from_vector(testutil::rnd_values(256 * 1024, 3), {256, 1024}, cpu);
  // rows shared by outputs (16 rows of A: the CPU's scheduler would copy a transposed B for more,
  // Note [transposed B])
  auto mm = render_cuda({x.shrink({{0, 16}, {0, 1024}}).matmul(w.permute({1, 0}))});
  ASSERT_EQ(mm.size(), 1u);
  EXPECT_TRUE(mm[0].kernel.group_reduces.empty()) << mm[0].source;
  auto ew = render_cuda({x * 2 + 1});
  ASSERT_EQ(ew.size(), 1u);
  EXPECT_EQ(ew[0].kernel.global_size.size(), 2u);
  EXPECT_EQ(ew[0].kernel.global_size[0], 1024 / 4);  // 4 lanes along the row
  int stores = 0;
  size_t last_load = 0, first_store = ew[0].kernel.uops.size();
  for (size_t i = 0; i < ew[0].kernel.uops.size(); i++) {
    Op op = ew[0].kernel.uops[i]->op;
    stores += op == Op::STORE;
    if (op == Op::LOAD) last_load = i;
    if (op == Op::STORE) first_store = std::min(first_store, i);
  }
  EXPECT_EQ(stores, 4);
  EXPECT_LT(last_load, first_store) << ew[0].source;  // Note [lanes in lockstep]: every lane's load in flight
  Tensor small = Tensor::from_vector(testutil::rnd_values(64 * 64, 2), {64, 64}, cpu);
  auto one = render_cuda({small * 2});  // too few elements for lanes
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].kernel.global_size[0], 64);
}

// Note [exact half results] in codegen/linearize.cpp: a concatenation of two bfloat16 pieces
// selects each piece's value under its PAD's gate and adds them; the selections are values the
// type holds, so each element is rounded three times (the two casts and the sum), not five.
TEST(CudaRenderer, SelectedHalfValuesAreNotRoundedAgain) {
  TensorOptions cpu{.device = "CPU"};
  Tensor a = Tensor::from_vector(testutil::rnd_values(64, 5), {64}, cpu);
  Tensor b = Tensor::from_vector(testutil::rnd_values(64, 6), {64}, cpu);
  auto k = render_cuda({Tensor::cat({a.cast(DType::BFloat16), b.cast(DType::BFloat16)}, 0)});
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(count_of(k[0].source, "tg_f32_to_bf16((float)"), 3u) << k[0].source;
}

// Note [grouped reduction]: a reduction with a single output is grouped from 128 elements, even
// strided (a column's sum; the CNN's loss over 128 rows); two outputs of as many stay one thread
// each.
TEST(CudaRenderer, ALoneOutputIsGroupedFromAShorterLength) {
  TensorOptions cpu{.device = "CPU"};
  Tensor x = Tensor::from_vector(testutil::rnd_values(128 * 8, 4), {128, 8}, cpu);
  auto lone = render_cuda({x.shrink({{0, 128}, {0, 1}}).sum()});
  ASSERT_EQ(lone.size(), 1u);
  EXPECT_FALSE(lone[0].kernel.group_reduces.empty()) << lone[0].source;
  EXPECT_EQ(lone[0].kernel.local_size, std::vector<int64_t>{16});  // 8 elements a thread
  auto two = render_cuda({x.shrink({{0, 128}, {0, 2}}).sum(0)});
  ASSERT_EQ(two.size(), 1u);
  EXPECT_TRUE(two[0].kernel.group_reduces.empty()) << two[0].source;
}

// Note [rows with a shared operand] in codegen/gpu_dims.cpp: rows that also read a vector every
// row shares (GPT-2's LayerNorm statistics of token plus position embeddings over 16 x 1024 rows
// of 768, a matrix times a vector) are grouped; a matmul, whose operands each miss an output
// loop, is not (RowsAreGroupedAndLargeElementwiseKernelsGetLanes).
TEST(CudaRenderer, RowsThatShareAVectorAreGrouped) {
  TensorOptions cpu{.device = "CPU"};
  Tensor tokens = Tensor::from_vector(testutil::rnd_values(16 * 1024 * 768, 1), {16, 1024, 768}, cpu);
  Tensor positions = Tensor::from_vector(testutil::rnd_values(1024 * 768, 2), {1024, 768}, cpu);
  auto mean = render_cuda({(tokens + positions).mean(-1)});
  ASSERT_EQ(mean.size(), 1u);
  EXPECT_EQ(mean[0].name, "r_16_1024__768");
  EXPECT_EQ(mean[0].kernel.local_size, std::vector<int64_t>{64}) << mean[0].source;  // 12 elements a thread
  ASSERT_EQ(mean[0].kernel.group_reduces.size(), 1u) << mean[0].source;
  Tensor v = Tensor::from_vector(testutil::rnd_values(768, 3), {768}, cpu);
  auto matvec = render_cuda({positions.matmul(v)});
  ASSERT_EQ(matvec.size(), 1u);
  EXPECT_EQ(matvec[0].kernel.group_reduces.size(), 1u) << matvec[0].source;
}

// Note [short rows] in codegen/gpu_dims.cpp: attention's rowsum(dO * O) over rows of 64 (O's rows
// 65 floats apart: the output and its logsumexp) runs 16 threads a row, not one, four rows to a
// work-group (Note [packed groups]).
TEST(CudaRenderer, ShortRowsAreGrouped) {
  TensorOptions cpu{.device = "CPU"}, bf16{.dtype = DType::BFloat16, .device = "CPU"};
  Tensor o = Tensor::empty({192, 1024, 65}, cpu), dout = Tensor::empty({192, 1024, 64}, bf16);
  auto delta = render_cuda({(dout.cast(DType::Float32) * o.shrink({{0, 192}, {0, 1024}, {0, 64}})).sum(2)});
  ASSERT_EQ(delta.size(), 1u);
  EXPECT_EQ(delta[0].name, "r_192_1024__64");
  EXPECT_EQ(delta[0].kernel.local_size, std::vector<int64_t>{64}) << delta[0].source;  // 4 rows a block
  ASSERT_EQ(delta[0].kernel.group_reduces.size(), 1u) << delta[0].source;
  EXPECT_EQ(delta[0].kernel.group_reduces[0].size, 16);
  EXPECT_EQ(delta[0].kernel.group_reduces[0].per_block, 4);  // Note [packed groups]: a whole warp shuffles
  EXPECT_NE(delta[0].source.find("for (int s = 8; s > 0; s >>= 1) { float o = __shfl_xor_sync(0xffffffffu,"),
            std::string::npos) << delta[0].source;
  auto shorter = render_cuda({Tensor::empty({4096, 32}, cpu).sum(1)});  // below row_min_length
  ASSERT_EQ(shorter.size(), 1u);
  EXPECT_TRUE(shorter[0].kernel.group_reduces.empty()) << shorter[0].source;
}

// Note [contiguous lanes] and Note [vector accesses]: a large bfloat16 elementwise kernel gives
// each thread 8 neighbouring elements, loaded and stored as one 16-byte access each where the
// buffer's address allows (an element-by-element path beside it); its float32 operand (a bias
// along the row) as two 16-byte loads. Lanes of a head's 64 elements merged with the heads into
// dimension 0 are vectors too; a transposed read is not, and stays element by element.
TEST_F(Nvrtc, ElementwiseLanesAreVectors) {
  TensorOptions cpu{.device = "CPU"}, bf16{.dtype = DType::BFloat16, .device = "CPU"};
  Tensor x = Tensor::empty({16, 1024, 3072}, bf16), bias = Tensor::empty({3072}, cpu);
  auto gelu = render_cuda({((x.cast(DType::Float32) + bias).gelu()).cast(DType::BFloat16)});
  ASSERT_EQ(gelu.size(), 1u);
  const std::string& src = gelu[0].source;
  EXPECT_EQ(gelu[0].kernel.global_size[0], 3072 / 8) << src;
  EXPECT_EQ(count_of(src, "uint4 w; "), 4u) << src;  // x, the bias twice, the result
  EXPECT_EQ(count_of(src, "*(const uint4*)(data1 + "), 1u) << src;
  EXPECT_EQ(count_of(src, "*(const uint4*)(data2 + "), 2u) << src;
  EXPECT_EQ(count_of(src, "*(uint4*)(data0 + "), 1u) << src;
  EXPECT_EQ(count_of(src, "& 15ull) == 0"), 4u) << src;
  EXPECT_EQ(cuda_compile(gelu[0].name, src, 90).image.substr(0, 4), "\x7f" "ELF");
  Tensor qkv = Tensor::empty({16, 1024, 3, 12, 64}, bf16);
  auto heads = render_cuda({qkv.permute({2, 0, 3, 1, 4}).contiguous()});  // [3, B, H, T, 64]
  ASSERT_EQ(heads.size(), 1u);
  EXPECT_EQ(count_of(heads[0].source, "*(const uint4*)(data1 + "), 1u) << heads[0].source;
  EXPECT_EQ(count_of(heads[0].source, "*(uint4*)(data0 + "), 1u) << heads[0].source;
  Tensor t = Tensor::empty({4096, 4096}, cpu);
  auto transposed = render_cuda({t.permute({1, 0}) * 2});
  ASSERT_EQ(transposed.size(), 1u);
  EXPECT_EQ(count_of(transposed[0].source, "*(const uint4*)"), 0u) << transposed[0].source;
  EXPECT_EQ(count_of(transposed[0].source, "*(uint4*)(data0 + "), 1u) << transposed[0].source;
  EXPECT_EQ(cuda_compile(transposed[0].name, transposed[0].source, 90).image.substr(0, 4), "\x7f" "ELF");
}

// Note [reduce lanes]: a grouped reduction's thread takes a vector of neighbouring elements a
// trip: GPT-2's LayerNorm statistics (float32 rows of 768, 64 threads) one 16-byte load in each of
// 3 trips, bfloat16 rows 8-byte loads (12 elements a thread: 4 lanes), lanes combined before the
// one accumulator; a reduction over two loops adds the lanes to the inner one. A strided one
// (a column sum) keeps one element a trip.
TEST_F(Nvrtc, GroupedReductionLanesAreVectors) {
  TensorOptions cpu{.device = "CPU"}, bf16{.dtype = DType::BFloat16, .device = "CPU"};
  auto stats = render_cuda({(Tensor::empty({16, 1024, 768}, cpu) * Tensor::empty({16, 1024, 768}, cpu)).sum(-1)});
  ASSERT_EQ(stats.size(), 1u);
  const std::string& src = stats[0].source;
  EXPECT_EQ(stats[0].kernel.local_size, std::vector<int64_t>{64}) << src;
  EXPECT_NE(src.find("ridx2 < (3ll)"), std::string::npos) << src;
  EXPECT_EQ(count_of(src, "*(const uint4*)(data1 + "), 1u) << src;
  EXPECT_EQ(count_of(src, "*(const uint4*)(data2 + "), 1u) << src;
  EXPECT_EQ(count_of(src, "= acc0 + v"), 1u) << src;  // one update of one accumulator
  auto half_rows = render_cuda({Tensor::empty({4096, 768}, bf16).max(-1)});
  ASSERT_EQ(half_rows.size(), 1u);
  EXPECT_EQ(count_of(half_rows[0].source, "*(const uint2*)(data1 + "), 1u) << half_rows[0].source;
  auto two_loops = render_cuda({Tensor::empty({64, 16, 512}, cpu).sum({1, 2})});
  ASSERT_EQ(two_loops.size(), 1u);
  EXPECT_EQ(count_of(two_loops[0].source, "*(const uint4*)(data1 + "), 1u) << two_loops[0].source;
  auto columns = render_cuda({Tensor::empty({64, 4096}, cpu).sum(0)});
  ASSERT_EQ(columns.size(), 1u);
  EXPECT_EQ(count_of(columns[0].source, "uint4"), 0u) << columns[0].source;
  for (auto* k : {&stats[0], &half_rows[0], &two_loops[0]})
    EXPECT_EQ(cuda_compile(k->name, k->source, 90).image.substr(0, 4), "\x7f" "ELF") << k->source;
}

// Note [merged inner loops]: an elementwise kernel over images of 20 x 20 takes the columns, rows
// and channels into dimension 0, so lanes leave a warp's width or more of neighbouring threads;
// each loop's index is recovered in 32 bits. Long rows keep dimension 0 to themselves.
TEST(CudaRenderer, ShortImageLoopsMergeIntoDimensionZero) {
  TensorOptions cpu{.device = "CPU"};
  Tensor x = Tensor::from_vector(testutil::rnd_values(512 * 32 * 20 * 20, 1), {512, 32, 20, 20}, cpu);
  Tensor b = Tensor::from_vector(testutil::rnd_values(32, 2), {1, 32, 1, 1}, cpu);
  auto ks = render_cuda({(x + b).relu()});
  ASSERT_EQ(ks.size(), 1u);
  EXPECT_EQ(ks[0].kernel.global_size, (std::vector<int64_t>{32 * 20 * 20 / 4, 512}));
  EXPECT_EQ(ks[0].kernel.local_size[0], 128) << ks[0].source;
  EXPECT_NE(ks[0].source.find("(int)"), std::string::npos) << ks[0].source;
  Tensor rows = Tensor::from_vector(testutil::rnd_values(2048 * 1024, 3), {2048, 1024}, cpu);
  auto wide = render_cuda({rows * 2});
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_EQ(wide[0].kernel.global_size, (std::vector<int64_t>{1024 / 4, 2048}));
}

class Cuda : public testutil::CudaTest {
 protected:
  // Realizes t at DEBUG=4 and returns the generated source that was printed.
  static std::string source_of(Tensor& t) {
    testutil::KnobScope debug(knobs::DEBUG, 4);
    ::testing::internal::CaptureStderr();
    t.realize();
    return ::testing::internal::GetCapturedStderr();
  }
};

TEST_F(Cuda, DeviceSelection) {
  EXPECT_EQ(&get_device("CUDA:0"), &get_device("CUDA"));
  EXPECT_NE(get_device("cuda").description().find("CUDA ("), std::string::npos);
  EXPECT_NE(get_device("CUDA").description().find(", sm_"), std::string::npos);
  testutil::expect_error([] { get_device("CUDA:" + std::to_string(cuda_device_count())); }, {"CUDA device(s) found"});
  testutil::expect_error([] { get_device("CUDA:x"); }, {"expected CUDA or CUDA:<index>"});
  Tensor t = rnd({5}, 1).to("CUDA");
  EXPECT_EQ(t.device(), "CUDA");
  EXPECT_TRUE(match(t * 2));
}

TEST_F(Cuda, BuildFailureReportsLogAndKernelName) {
  testutil::expect_error(
      [] { get_device("CUDA").compiler().compile("tg_broken2", "extern \"C\" __global__ void tg_broken2(int* a) { a[0] = nope; }"); },
      {"CUDA kernel 'tg_broken2' failed to build", "NVRTC_ERROR_COMPILATION", "nope"});
}

TEST_F(Cuda, LaunchErrorsAreDecodedAndNameTheKernel) {
  Device& d = get_device("CUDA");
  Program& p = d.get_program("tg_inc", "extern \"C\" __global__ void tg_inc(float* a) { a[threadIdx.x] += 1.0f; }");
  void* buf = d.pool().alloc(4096 * sizeof(float));
  testutil::expect_error([&] { p.launch({buf}, {4096}, {4096}, false); },
                         {"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE", "kernel tg_inc", "block 4096x1x1"});
  // the error is not sticky: the context still works
  std::vector<float> host(256, 1.0f), back(256);
  d.allocator().copy_in(buf, host.data(), host.size() * sizeof(float));
  auto t = p.launch({buf}, {256}, {256}, true);
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(*t, 0.0);
  EXPECT_LT(*t, 1.0);
  d.allocator().copy_out(back.data(), buf, back.size() * sizeof(float));
  for (float v : back) EXPECT_EQ(v, 2.0f);
  d.pool().free(buf, 4096 * sizeof(float));
}

TEST_F(Cuda, ElementwiseLoopsBecomeThreads) {
  Tensor a = rnd({2, 3, 4, 5}, 1), b = rnd({2, 3, 4, 5}, 2);
  Tensor c = a * b + 1;
  std::string src = source_of(c);
  EXPECT_NE(src.find("blockIdx.z"), std::string::npos) << src;  // 4 loops in 3 dimensions
  EXPECT_EQ(src.find("for ("), std::string::npos) << src;
  EXPECT_TRUE(match(c));
  EXPECT_TRUE(match(rnd({3, 5}, 3).permute({1, 0}).contiguous()));
  Tensor wide = rnd({131071, 2, 2}, 4);  // beyond gridDim.z: on dimension 0
  EXPECT_TRUE(match(wide * 2 + 1));
  // images merged into dimension 0 with lanes (Note [merged inner loops]), a padded one gated
  Tensor img = rnd({128, 32, 20, 20}, 5), bias = rnd({1, 32, 1, 1}, 6);
  EXPECT_TRUE(match((img + bias).relu()));
  EXPECT_TRUE(match(img.pad({{0, 0}, {0, 0}, {4, 4}, {4, 4}})));
}

// Note [vector accesses]: the kernel's 16-byte path where its buffers are aligned, the element
// by element one where they are not (a view 4 or 8 bytes into its base), with the same results.
TEST_F(Cuda, VectorAccessesAtAnyAlignment) {
  TensorOptions cpu{.device = "CPU"};
  constexpr int64_t N = 1024 * 1024;
  auto ks = render_cuda({Tensor::empty({1024, 1024}, cpu) * 2 + 1});
  ASSERT_EQ(ks.size(), 1u);
  ASSERT_NE(ks[0].source.find("*(const uint4*)(data1 + "), std::string::npos) << ks[0].source;
  Device& d = get_device("CUDA");
  Program& p = d.get_program(ks[0].name, ks[0].source);
  std::vector<float> host(N), back(N);
  for (int64_t i = 0; i < N; i++) host[static_cast<size_t>(i)] = static_cast<float>(i % 1000) * 0.5f;
  const size_t bytes = (2 * N + 8) * sizeof(float);
  auto* base = static_cast<float*>(d.pool().alloc(bytes));
  for (int64_t shift : {0, 1, 2}) {
    float *in = base + shift, *out = base + N + 4 + shift;
    d.allocator().copy_in(in, host.data(), N * sizeof(float));
    p.launch({out, in}, ks[0].kernel.global_size, ks[0].kernel.local_size, false);
    d.allocator().copy_out(back.data(), out, N * sizeof(float));
    int64_t wrong = 0;
    for (int64_t i = 0; i < N; i++) wrong += back[static_cast<size_t>(i)] != host[static_cast<size_t>(i)] * 2 + 1;
    EXPECT_EQ(wrong, 0) << "buffers " << shift * 4 << " bytes past 16-byte alignment";
  }
  // a grouped row sum's lanes (Note [reduce lanes]): sums of halves below 2^23 are exact
  auto rows = render_cuda({Tensor::empty({1024, 1024}, cpu).sum(1)});
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_NE(rows[0].source.find("*(const uint4*)(data1 + "), std::string::npos) << rows[0].source;
  Program& r = d.get_program(rows[0].name, rows[0].source);
  for (int64_t shift : {0, 1, 2}) {
    float *in = base + shift, *out = base + N + 4 + shift;
    d.allocator().copy_in(in, host.data(), N * sizeof(float));
    r.launch({out, in}, rows[0].kernel.global_size, rows[0].kernel.local_size, false);
    d.allocator().copy_out(back.data(), out, 1024 * sizeof(float));
    int64_t wrong = 0;
    for (int64_t row = 0; row < 1024; row++) {
      double sum = 0;
      for (int64_t i = 0; i < 1024; i++) sum += host[static_cast<size_t>(row * 1024 + i)];
      wrong += back[static_cast<size_t>(row)] != static_cast<float>(sum);
    }
    EXPECT_EQ(wrong, 0) << "row sums of a buffer " << shift * 4 << " bytes past 16-byte alignment";
  }
  d.pool().free(base, bytes);
}

TEST_F(Cuda, GroupedReductionUsesSharedMemory) {
  for (Op op : {Op::ADD, Op::MAX}) {
    Tensor x = rnd({6, 4096}, 4);
    Tensor r = op == Op::ADD ? x.sum(1) : x.max(1);
    std::string src = source_of(r);
    EXPECT_NE(src.find("__shared__ float tg_red0[16];"), std::string::npos) << src;  // 512 threads: 16 warps
    EXPECT_NE(src.find("__shfl_xor_sync(0xffffffffu, acc0, s)"), std::string::npos) << src;
    EXPECT_NE(src.find("__syncthreads();"), std::string::npos) << src;
    EXPECT_NE(src.find("threadIdx.x"), std::string::npos) << src;
    EXPECT_NE(src.find("blockIdx.x"), std::string::npos) << src;
    EXPECT_TRUE(match(r, testutil::Tol{1e-4, 1e-4}));
  }
  Tensor m = rnd({8192}, 5).mean();  // one output: one block
  EXPECT_NE(source_of(m).find("tg_red0"), std::string::npos);
  EXPECT_TRUE(match(m, testutil::Tol{1e-4, 1e-4}));
  Tensor i = testutil::rnd_int({1024}, 6, -50, 50).sum();  // integers are exact
  EXPECT_TRUE(match(i));
}

// Note [grouped reduction], Note [warp combine], Note [elementwise lanes] on the GPU: many rows,
// groups smaller than a warp, integer and float64 partials, softmax and layernorm, lanes.
TEST_F(Cuda, RowReductionsAndLanesMatch) {
  Tensor x = rnd({2048, 256}, 7);
  EXPECT_TRUE(match(x.sum(1), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(x.max(1)));
  EXPECT_TRUE(match(x.softmax(-1), testutil::Tol{1e-5, 1e-4}));
  EXPECT_TRUE(match(x.layernorm(), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(x.sum(0), testutil::Tol{1e-4, 1e-4}));  // a strided reduce: one thread per output
  EXPECT_TRUE(match(rnd({4096, 128}, 8).sum(1), testutil::Tol{1e-4, 1e-4}));  // 16 threads a row
  EXPECT_TRUE(match(testutil::rnd_int({2048, 512}, 9, -50, 50).sum(1)));
  EXPECT_TRUE(match(testutil::rnd_int({2048, 512}, 10, -50, 50).min(1)));
  EXPECT_TRUE(match(x.cast(DType::Float64).sum(1)));
  // Note [reduce lanes]: bfloat16 rows in float32, a reduction over two loops, GPT-2's row length
  EXPECT_TRUE(match(x.cast(DType::BFloat16).sum(1).cast(DType::Float32), testutil::Tol{1e-2, 1e-2}));
  EXPECT_TRUE(match(rnd({64, 16, 512}, 14).sum({1, 2}), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(rnd({1024, 768}, 15).mean(-1), testutil::Tol{1e-5, 1e-4}));
  // Note [short rows]: 16 threads a row of 64, at a stride of 65 and aligned
  EXPECT_TRUE(match(rnd({4096, 65}, 16).shrink({{0, 4096}, {0, 64}}).sum(1), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(rnd({4096, 64}, 17).max(1)));
  // Note [packed groups]: rows of 128 in groups of 16, four to a work-group, one kernel a row
  EXPECT_TRUE(match(rnd({2048, 128}, 18).softmax(-1), testutil::Tol{1e-5, 1e-4}));
  EXPECT_TRUE(match(rnd({2048, 128}, 19).layernorm(), testutil::Tol{1e-4, 1e-4}));
  Tensor a = rnd({1 << 20}, 11), b = rnd({1 << 20}, 12);
  EXPECT_TRUE(match((a * b + 1).relu()));
  EXPECT_TRUE(match(rnd({1024, 1024}, 13).permute({1, 0}).contiguous()));
}

// Note [split column sums] in schedule/split_reduce.cpp: on CUDA GPT-2's bias gradient is split
// into 256 parts of 64 rows (2^18 partials), and the two stages sum as the CPU does.
TEST_F(Cuda, ColumnSumsSplitInto256Parts) {
  Tensor g = rnd({16, 1024, 768}, 20).realize();
  auto no_input = [](const UOp* u) { return u->realized != nullptr; };
  auto split = split_reduce(g.sum({0, 1}).uop(), no_input);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->partial->shape, (Shape{1, 256, 1, 768}));
  EXPECT_TRUE(match(g.sum({0, 1}), testutil::Tol{1e-4, 1e-4}));
  EXPECT_TRUE(match(g.cast(DType::BFloat16).sum({0, 1}).cast(DType::Float32), testutil::Tol{1e-2, 1e-2}));
}

// Note [integer max through PTX] in render_cuda.cpp: min over a short axis is -max(-x), which
// ptxas once merged into a three-input max that lost one negation.
TEST_F(Cuda, IntegerMinOverShortAxis) {
  Tensor i = Tensor::from_vector(std::vector<int32_t>{-47, 4, -2, -4, 34, -5, -9, 20, 13, 38, -21, -22, 4, 3, -28}, {3, 5});
  EXPECT_EQ(i.min(0).to_vector<int32_t>(), (std::vector<int32_t>{-47, -22, -2, -4, -28}));
  EXPECT_EQ(i.argmin(0).to_vector<int32_t>(), (std::vector<int32_t>{0, 2, 0, 0, 2}));
  EXPECT_EQ(i.cast(DType::Int64).min(0).to_vector<int64_t>(), (std::vector<int64_t>{-47, -22, -2, -4, -28}));
  EXPECT_EQ(i.max(0).to_vector<int32_t>(), (std::vector<int32_t>{-5, 4, 20, 13, 38}));
}

// Note [float to integer casts] in render_cuda.cpp: out-of-range values wrap, never saturate.
TEST_F(Cuda, FloatToIntegerCastsWrap) {
  Tensor x = Tensor::from_vector(std::vector<float>{-107.5f, 300.25f, -3.0f, 255.9f}, {4});
  EXPECT_EQ(x.cast(DType::UInt8).to_vector<uint8_t>(), (std::vector<uint8_t>{149, 44, 253, 255}));
  EXPECT_EQ(x.cast(DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{-107, 300, -3, 255}));
}

TEST_F(Cuda, HalfTypesAsStorage) {
  Tensor h = rnd({300}, 8).cast(DType::Float16);
  EXPECT_TRUE(match((h * h + h).sum(), testutil::Tol{2e-2, 2e-2}));
  EXPECT_TRUE(match(h * 3 + 1));
  Tensor b = (rnd({33}, 9).cast(DType::BFloat16) * 3).cast(DType::Float32);
  EXPECT_TRUE(match(b, testutil::tol_for(DType::BFloat16)));
}

// Note [tensor-core contractions] on the GPU: forward passes and input gradients as mma.sync tf32
// kernels (TF32=1, the default) agree with the float32 FMA kernels (TF32=0, checked
// against the reference by the op tests) within tf32's rounding (10 mantissa bits: a wrong index
// is off by the value itself).
TEST_F(Cuda, ConvolutionsRunOnTensorCores) {
  if (!get_device("CUDA").supports(Feature::TensorCores))
    GTEST_SKIP() << "this GPU has no tf32 tensor cores (sm_80 or newer)";
  struct Case {
    Shape x, w;
    int64_t padding;
    size_t tc_kernels;  // how many of the kernels run on the tensor cores
  };
  // 3x3 padded: forward and input gradient (K = 288: steps over all three reduce loops); 3x3 over
  // 8 channels into 64 (K = 72): the forward pass only (its input gradient is too small)
  for (const Case& c :
       {Case{{64, 32, 16, 16}, {32, 32, 3, 3}, 1, 2}, Case{{128, 8, 12, 12}, {64, 8, 3, 3}, 0, 1}}) {
    auto run = [&](int tf32, std::string* log) {
      testutil::KnobScope conv_tf32(knobs::TF32, tf32);
      Tensor x = rnd(c.x, 1), w = rnd(c.w, 2);
      x.requires_grad_();
      w.requires_grad_();
      Tensor y = x.conv2d(w, std::nullopt, {1, 1}, {c.padding, c.padding});
      Tensors out{y};
      for (auto& g : (y * rnd(y.shape(), 3, 0.5, 1.5)).sum().gradients({x, w})) out.push_back(g);
      {
        testutil::KnobScope debug(knobs::DEBUG, log ? 4 : knobs::DEBUG.get());
        if (log) ::testing::internal::CaptureStderr();
        Tensor::realize_all(out);
        if (log) *log = ::testing::internal::GetCapturedStderr();
      }
      std::vector<std::vector<float>> v;
      for (auto& t : out) v.push_back(t.to_vector<float>());
      return v;
    };
    std::string log;
    auto tc = run(1, &log), fma = run(0, nullptr);
    std::string what = shape_str(c.x) + " * " + shape_str(c.w);
    EXPECT_EQ(count_of(log, "__launch_bounds__(128) r_tc_"), c.tc_kernels) << what;
    for (size_t t = 0; t < tc.size(); t++) {
      ASSERT_EQ(tc[t].size(), fma[t].size());
      size_t bad = 0;
      for (size_t i = 0; i < tc[t].size(); i++)
        bad += !(std::fabs(tc[t][i] - fma[t][i]) <= 5e-2 + 2e-2 * std::fabs(fma[t][i]));
      EXPECT_EQ(bad, 0u) << what << ", output " << t
                         << " (0: forward, 1: input gradient, 2: weight gradient)";
    }
  }
}

TEST_F(Cuda, Debug2ReportsKernelTimeAndMemory) {
  Tensor x = rnd({256, 256}, 10);
  Tensor y = (x.matmul(x) + 1).sum();
  double before = GlobalCounters::get().kernel_seconds;
  std::string log;
  {
    testutil::KnobScope debug(knobs::DEBUG, 2);
    ::testing::internal::CaptureStderr();
    y.realize();
    log = ::testing::internal::GetCapturedStderr();
  }
  EXPECT_NE(log.find("*** CUDA"), std::string::npos) << log;
  EXPECT_NE(log.find(" ms   mem in use"), std::string::npos) << log;
  EXPECT_GT(GlobalCounters::get().kernel_seconds, before);  // GPU times from events
  EXPECT_GT(get_device("CUDA").pool().stats().peak_bytes, 256u * 256u * 4u);
}

}  // namespace
}  // namespace tg
