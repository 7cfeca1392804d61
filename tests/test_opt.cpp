// The kernel optimizer (UPCAST, UNROLL, hand-coded choice, BEAM with its disk cache) and the
// CPU thread pool: every optimized kernel must compute what the unoptimized one does.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "tests/test_util.h"
#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/opt_block.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/codegen/renderer.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/beam.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/runtime/thread_pool.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

using namespace tg;
using tg::testutil::expect_error;

namespace {

// The one kernel that computes t from realized inputs.
ScheduleItem only_kernel(const Tensor& t) {
  auto items = create_schedule({t.uop()});
  EXPECT_EQ(items.size(), 1u);
  return items.at(0);
}

// Runs item's kernel with opts and returns its output.
std::vector<float> run_with(const ScheduleItem& item, const std::vector<Opt>& opts) {
  std::vector<DType> dtypes;
  std::vector<void*> ptrs;
  for (auto& b : item.buffers) {
    dtypes.push_back(b->dtype());
    ptrs.push_back(b->ensure_allocated());
  }
  Device& dev = get_device(item.device);
  LoweredKernel k = lower_with_choice(item.ast, dtypes, CodegenTarget::of(dev), KernelChoice::generated(opts));
  dev.get_program(k.kernel.name, k.source).launch(ptrs, k.kernel.global_size, {}, true);
  std::vector<float> out(item.buffers[0]->numel());
  item.buffers[0]->copy_out(out.data(), out.size() * sizeof(float));
  return out;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol = 1e-4) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "at flat " << i;
}

Tensor realized_randn(const Shape& s, uint64_t seed) {
  Tensor::manual_seed(seed);
  return Tensor::randn(s).realize();
}

// A stride-1 convolution reduced into [N, Cout, oy, ox] (one kernel).
Tensor nchw_conv(const Tensor& x, const Tensor& w) {
  int64_t n = x.shape(0), cin = x.shape(1), cout = w.shape(0), kh = w.shape(2), kw = w.shape(3);
  Tensor win = x.pool_windows({kh, kw}, {1, 1}, {1, 1});  // [N, Cin, oy, ox, kh, kw]
  int64_t oy = win.shape(2), ox = win.shape(3);
  return (win.reshape({n, 1, cin, oy, ox, kh, kw}) * w.reshape({1, cout, cin, 1, 1, kh, kw})).sum({2, 5, 6});
}

}  // namespace

TEST(Opt, UpcastAndUnrollKeepAMatmulsResult) {
  Tensor a = realized_randn({12, 20}, 1), b = realized_randn({20, 8}, 2);
  ScheduleItem item = only_kernel(a.matmul(b));
  auto axes = kernel_axes(item.ast);
  ASSERT_EQ(axes.size(), 3u);
  EXPECT_TRUE(axes[2].reduce);
  auto plain = run_with(item, {});
  std::vector<std::vector<Opt>> cases = {
      {{OptOp::UPCAST, 1, 8}},
      {{OptOp::UPCAST, 0, 4}, {OptOp::UPCAST, 1, 2}},
      {{OptOp::UNROLL, 2, 4}},
      {{OptOp::UNROLL, 2, 20}},                                          // the whole reduce loop
      {{OptOp::UPCAST, 0, 3}, {OptOp::UNROLL, 2, 5}, {OptOp::UPCAST, 1, 4}},
      {{OptOp::UPCAST, 0, 2}, {OptOp::UPCAST, 0, 2}},                    // twice on one loop
  };
  for (auto& opts : cases) {
    SCOPED_TRACE(opts_str(opts));
    expect_close(run_with(item, opts), plain);
  }
}

TEST(Opt, PaddedConvolutionAndMaxReduce) {
  Tensor x = realized_randn({2, 3, 6, 6}, 3), w = realized_randn({4, 3, 3, 3}, 4);
  ScheduleItem conv = only_kernel(nchw_conv(x.pad({{0, 0}, {0, 0}, {1, 1}, {1, 1}}), w));
  auto plain = run_with(conv, {});
  auto axes = kernel_axes(conv.ast);
  std::vector<Opt> opts;
  for (auto& ax : axes)
    if (ax.size % 2 == 0 && opts.size() < 3) opts.push_back({ax.reduce ? OptOp::UNROLL : OptOp::UPCAST, ax.id, 2});
  ASSERT_FALSE(opts.empty());
  expect_close(run_with(conv, opts), plain);
  expect_close(run_with(conv, hand_coded_opts(conv.ast)), plain);

  ScheduleItem mx = only_kernel(x.max(3));
  auto mx_plain = run_with(mx, {});
  expect_close(run_with(mx, {{OptOp::UNROLL, kernel_axes(mx.ast).back().id, 3}}), mx_plain, 0);
}

// Note [short output rows]: a weight gradient (rows of kw=5, reduce over batch and pixels) gets
// partial sums along the contiguous output column, the row and the output channel upcast.
TEST(Opt, HandCodedOptsForAWeightGradient) {
  Tensor x = realized_randn({2, 3, 12, 12}, 7), g = realized_randn({2, 4, 8, 8}, 8);
  Tensor win = x.pool_windows({5, 5}, {1, 1}, {1, 1});  // [2, 3, 8, 8, 5, 5]
  Tensor dw = (win.reshape({2, 1, 3, 8, 8, 5, 5}) * g.reshape({2, 4, 1, 8, 8, 1, 1})).sum({0, 3, 4});
  ScheduleItem item = only_kernel(dw);
  auto opts = hand_coded_opts(item.ast);
  ASSERT_EQ(opts.size(), 3u) << opts_str(opts);
  auto axes = kernel_axes(item.ast);
  EXPECT_EQ(opts[0].op, OptOp::UNROLL);
  EXPECT_EQ(opts[0].axis, axes.back().id);  // the output column, innermost reduce loop
  EXPECT_EQ(opts[1].op, OptOp::UPCAST);
  EXPECT_EQ(opts[2].op, OptOp::UPCAST);
  EXPECT_EQ(opts[2].axis, axes.front().id);  // the output channel: g moves along it, x does not
  expect_close(run_with(item, opts), run_with(item, {}));
}

// Note [whole rows]: a 20-wide output row is upcast whole, then the output channel.
TEST(Opt, HandCodedOptsUpcastAWholeShortRow) {
  Tensor x = realized_randn({2, 3, 24, 24}, 9), w = realized_randn({8, 3, 5, 5}, 10);
  ScheduleItem item = only_kernel(nchw_conv(x, w));
  auto opts = hand_coded_opts(item.ast);
  ASSERT_EQ(opts.size(), 2u) << opts_str(opts);
  auto axes = kernel_axes(item.ast);  // n, co, oy, ox, then the reduce loops
  EXPECT_EQ(opts[0], (Opt{OptOp::UPCAST, axes[1].id, 4}));
  EXPECT_EQ(opts[1], (Opt{OptOp::UPCAST, axes[3].id, 20}));  // Note [contiguous lanes last]
  expect_close(run_with(item, opts), run_with(item, {}));
}

// Note [channel-last convolutions] and Note [register tile size]: the kernel of a CPU convolution
// reduces into [N, oy, ox, Cout]; its tile is two vectors of output channels (the weights are
// contiguous along them) times up to five output columns (the input is reused along the channels).
TEST(Opt, HandCodedOptsTileAChannelLastConvolution) {
  Tensor x = realized_randn({2, 8, 24, 24}, 11), w = realized_randn({32, 8, 5, 5}, 12);
  Tensor wl = w.permute({1, 2, 3, 0}).contiguous().realize();  // [Cin, kh, kw, Cout]
  Tensor win =
      x.pool_windows({5, 5}, {1, 1}, {1, 1}).permute({0, 2, 3, 1, 4, 5});  // [N, oy, ox, Cin, kh, kw]
  Tensor out =
      (win.reshape({2, 20, 20, 1, 8, 5, 5}) * wl.permute({3, 0, 1, 2}).reshape({1, 1, 1, 32, 8, 5, 5}))
          .sum({4, 5, 6});  // [N, oy, ox, Cout]
  ScheduleItem item = only_kernel(out);
  auto opts = hand_coded_opts(item.ast);
  auto axes = kernel_axes(item.ast);  // n, oy, ox, co, then the reduce loops
  ASSERT_EQ(opts.size(), 2u) << opts_str(opts);
  EXPECT_EQ(opts[0], (Opt{OptOp::UPCAST, axes[2].id, 5}));
  EXPECT_EQ(opts[1], (Opt{OptOp::UPCAST, axes[3].id, 16}));  // Note [contiguous lanes last]
  expect_close(run_with(item, opts), run_with(item, {}));
  // and it is what conv2d computes
  std::vector<float> want = x.conv2d(w).permute({0, 2, 3, 1}).contiguous().to_vector<float>();
  expect_close(run_with(item, opts), want);
}

// Note [reduce across rows]: a sum over the strided leading axis accumulates a contiguous run of
// outputs side by side.
TEST(Opt, HandCodedOptsForAColumnSum) {
  Tensor a = realized_randn({50, 48}, 13);
  ScheduleItem item = only_kernel(a.sum(0));
  auto opts = hand_coded_opts(item.ast);
  ASSERT_EQ(opts.size(), 1u) << opts_str(opts);
  EXPECT_EQ(opts[0], (Opt{OptOp::UPCAST, kernel_axes(item.ast).front().id, 16}));
  expect_close(run_with(item, opts), run_with(item, {}));
}

// Note [divided loads]: a per-channel sum that reads a pooled tensor at x/2 (a max pool's
// backward inside BatchNorm's) still gets partial sums along the contiguous last loop.
TEST(Opt, HandCodedOptsUnrollAReduceThatReadsAPooledTensor) {
  Tensor x = realized_randn({4, 3, 8, 8}, 21), p = realized_randn({4, 3, 4, 4}, 22);
  Tensor up = p.reshape({4, 3, 4, 1, 4, 1}).expand({4, 3, 4, 2, 4, 2}).reshape({4, 3, 8, 8});
  ScheduleItem item = only_kernel((x * up).sum({0, 2, 3}));
  auto opts = hand_coded_opts(item.ast);
  ASSERT_EQ(opts.size(), 1u) << opts_str(opts);
  EXPECT_EQ(opts[0].op, OptOp::UNROLL) << opts_str(opts);
  EXPECT_EQ(opts[0].axis, kernel_axes(item.ast).back().id) << opts_str(opts);
  expect_close(run_with(item, opts), run_with(item, {}));
}

TEST(Opt, HandCodedOptsTileAMatmul) {
  Tensor a = realized_randn({64, 32}, 5), b = realized_randn({32, 64}, 6);
  ScheduleItem item = only_kernel(a.matmul(b));
  auto opts = hand_coded_opts(item.ast);
  ASSERT_EQ(opts.size(), 2u) << opts_str(opts);
  EXPECT_EQ(opts[0], (Opt{OptOp::UPCAST, 0, 4}));
  EXPECT_EQ(opts[1], (Opt{OptOp::UPCAST, 1, 16}));  // the contiguous output loop, widest and last
  EXPECT_LE(lane_count(opts), 128);
  expect_close(run_with(item, opts), run_with(item, {}));
  // a sum over the contiguous last axis gets partial accumulators
  ScheduleItem sum = only_kernel(a.sum(1));
  auto sopts = hand_coded_opts(sum.ast);
  ASSERT_FALSE(sopts.empty());
  EXPECT_EQ(sopts[0].op, OptOp::UNROLL);
  expect_close(run_with(sum, sopts), run_with(sum, {}));
}

// Note [cache blocking]: BLOCK and KBLOCK reorder a matmul's loops and keep its result, also with
// sizes that the tile does not divide evenly into powers of two, an epilogue and a batch loop.
TEST(Opt, BlocksKeepAMatmulsResult) {
  Tensor a = realized_randn({12, 40}, 21), b = realized_randn({40, 24}, 22), bias = realized_randn({24}, 23);
  Tensor ba = realized_randn({3, 6, 20}, 24), bb = realized_randn({3, 20, 10}, 25);
  ScheduleItem mm = only_kernel(a.matmul(b)), epilogue = only_kernel((a.matmul(b) + bias).relu());
  ScheduleItem batched = only_kernel(ba.matmul(bb));
  // loops: i 0, j 1, k 2; BLOCK's inner loops and KBLOCK's reduce loop take the next free ids
  std::vector<std::vector<Opt>> cases = {
      {{OptOp::BLOCK, 0, 4}},
      {{OptOp::BLOCK, 1, 24}},  // moves j innermost
      {{OptOp::KBLOCK, 2, 8}},  // five partial sums in the output
      {{OptOp::KBLOCK, 2, 20}, {OptOp::UNROLL, 3, 4}},
      {{OptOp::BLOCK, 1, 24},
       {OptOp::BLOCK, 0, 6},
       {OptOp::KBLOCK, 2, 10},
       {OptOp::UPCAST, 4, 3},
       {OptOp::UPCAST, 3, 8}},                                              // the hand-coded shape of it
      {{OptOp::BLOCK, 0, 3}, {OptOp::BLOCK, 3, 3}, {OptOp::KBLOCK, 2, 5}},  // a block within a block
  };
  for (auto* item : {&mm, &epilogue}) {
    auto plain = run_with(*item, {});
    for (auto& opts : cases) {
      SCOPED_TRACE(opts_str(opts));
      expect_close(run_with(*item, opts), plain);
    }
  }
  auto plain = run_with(batched, {});  // loops: batch 0, i 1, j 2, k 3
  for (auto& opts : std::vector<std::vector<Opt>>{{{OptOp::KBLOCK, 3, 4}},
                                                  {{OptOp::BLOCK, 2, 10},
                                                   {OptOp::BLOCK, 1, 3},
                                                   {OptOp::KBLOCK, 3, 5},
                                                   {OptOp::UPCAST, 5, 3},
                                                   {OptOp::UPCAST, 4, 2}}}) {
    SCOPED_TRACE(opts_str(opts));
    expect_close(run_with(batched, opts), plain);
  }
}

// Note [padded loops] in codegen/opt_block.cpp: PADTO pads an output loop that the tile's height
// does not divide; the padded iterations read the last row again and store nothing, also where a
// KBLOCK adds partial sums into the output (a padded row stored twice would add its sum twice).
TEST(Opt, PaddedLoopsKeepAMatmulsResult) {
  Tensor a = realized_randn({13, 40}, 60), b = realized_randn({40, 24}, 61), bias = realized_randn({24}, 62);
  Tensor ba = realized_randn({3, 6, 20}, 63), bb = realized_randn({3, 20, 10}, 64);
  ScheduleItem mm = only_kernel(a.matmul(b)), epilogue = only_kernel((a.matmul(b) + bias).relu());
  ScheduleItem batched = only_kernel(ba.matmul(bb));
  std::vector<std::vector<Opt>> cases = {
      {{OptOp::PADTO, 0, 5}},
      {{OptOp::PADTO, 0, 5}, {OptOp::UPCAST, 0, 5}, {OptOp::UPCAST, 1, 8}},
      {{OptOp::PADTO, 0, 5}, {OptOp::KBLOCK, 2, 8}, {OptOp::UPCAST, 0, 5}},
      {{OptOp::PADTO, 0, 8},
       {OptOp::BLOCK, 1, 24},
       {OptOp::BLOCK, 0, 8},
       {OptOp::KBLOCK, 2, 10},
       {OptOp::UPCAST, 4, 4},
       {OptOp::UPCAST, 3, 8}},  // the hand-coded shape of it: 16 rows in blocks of 8
  };
  for (auto* item : {&mm, &epilogue}) {
    auto plain = run_with(*item, {});
    for (auto& opts : cases) {
      SCOPED_TRACE(opts_str(opts));
      expect_close(run_with(*item, opts), plain);
    }
  }
  // loops: batch 0, i 1, j 2, k 3; the padded rows of one matrix must not reach the next one's
  auto plain = run_with(batched, {});
  for (auto& opts : std::vector<std::vector<Opt>>{{{OptOp::PADTO, 1, 4}, {OptOp::UPCAST, 1, 4}},
                                                  {{OptOp::PADTO, 1, 4}, {OptOp::KBLOCK, 3, 5}, {OptOp::UPCAST, 1, 4}}}) {
    SCOPED_TRACE(opts_str(opts));
    expect_close(run_with(batched, opts), plain);
  }
  expect_error([&] { apply_opts(mm.ast, {{OptOp::PADTO, 2, 16}}); }, {"PADTO(2,16)", "reduce loop"});
  expect_error([&] { apply_opts(mm.ast, {{OptOp::PADTO, 1, 8}}); }, {"PADTO(1,8)", "size 24 is a multiple already"});
  expect_error([&] { apply_opts(mm.ast, {{OptOp::KBLOCK, 2, 8}, {OptOp::PADTO, 2, 3}}); },
               {"PADTO(2,3)", "carries partial sums"});
  EXPECT_EQ(opts_str(parse_opts("PADTO(0,130) BLOCK(0,130)")), "PADTO(0,130) BLOCK(0,130)");
}

// Note [prefetched panels] in codegen/opt_block.cpp: PREFETCH keeps the product's result and asks
// for B's stream once per cache line a step: one prefetch for a tile's 16 lanes of a panel (the
// rows' loads of A, one element a step, get none); an output loop cannot be prefetched along.
TEST(Opt, PrefetchesAPanelOncePerCacheLine) {
  Tensor a = realized_randn({16, 1024}, 67), b = realized_randn({1024, 288}, 68);
  Tensor copy = b.reshape({1024, 18, 16}).permute({1, 0, 2}).contiguous().realize();
  ScheduleItem item = only_kernel(a.matmul(copy.permute({1, 0, 2}).reshape({1024, 288})));
  const std::vector<Opt> opts{{OptOp::UPCAST, 0, 4}, {OptOp::UPCAST, 1, 16}, {OptOp::PREFETCH, 2, 32}};
  expect_close(run_with(item, opts), run_with(item, {}), 1e-3);
  std::vector<DType> dtypes;
  for (auto& buf : item.buffers) dtypes.push_back(buf->dtype());
  Device& dev = get_device(item.device);
  auto source = [&](const std::vector<Opt>& o) {
    return lower_with_choice(item.ast, dtypes, CodegenTarget::of(dev), KernelChoice::generated(o)).source;
  };
  auto prefetches = [](const std::string& src) {
    int n = 0;
    for (const char* call : {"call void @llvm.prefetch", "__builtin_prefetch("})
      for (size_t at = src.find(call); at != std::string::npos; at = src.find(call, at + 1)) n++;
    return n;
  };
  EXPECT_EQ(prefetches(source(opts)), 1);
  EXPECT_EQ(prefetches(source({opts[0], opts[1]})), 0);
  expect_error([&] { apply_opts(item.ast, {{OptOp::PREFETCH, 0, 32}}); }, {"PREFETCH(0,32)", "output loop"});
  EXPECT_EQ(opts_str(parse_opts("UPCAST(3,16) PREFETCH(2,32)")), "UPCAST(3,16) PREFETCH(2,32)");
}

// A stream is a load that moves by one to four cache lines a step of a reduce loop of 16 steps
// or more (a channel-last convolution's weight gradient reads its input and output gradient so):
// it is prefetched 2 KB ahead; a load a row apart each step, or a short loop, is not.
TEST(Opt, StreamsAlongLongReduceLoopsArePrefetched) {
  auto prefetch_of = [](const Tensor& t) {
    ScheduleItem item = only_kernel(t);
    for (auto& ax : kernel_axes(item.ast))
      if (ax.reduce) return stream_prefetch(item.ast, ax);
    return std::optional<Opt>{};
  };
  auto columns = prefetch_of(realized_randn({64, 32}, 69).sum(0));  // 128 bytes a step
  ASSERT_TRUE(columns.has_value());
  EXPECT_EQ(columns->op, OptOp::PREFETCH);
  EXPECT_EQ(columns->amount, 16);
  EXPECT_FALSE(prefetch_of(realized_randn({64, 2048}, 70).sum(0)).has_value());  // 8 KB a step
  EXPECT_FALSE(prefetch_of(realized_randn({8, 32}, 71).sum(0)).has_value());     // 8 steps
  EXPECT_FALSE(prefetch_of(realized_randn({32, 64}, 72).sum(1)).has_value());    // 4 bytes a step
}

// A power-of-two row count gets tiles of the most rows the registers hold (5 on AVX2) over rows
// padded to whole tiles, where that costs at most 1/32 of the rows; AVX-512's 8 rows divide it.
TEST(Opt, HandCodedOptsPadRowsForTallerTiles) {
  Tensor a = realized_randn({256, 512}, 65), b = realized_randn({512, 272}, 66);
  auto items = create_schedule({a.matmul(b).uop()});
  const ScheduleItem& product = items.back();  // after the panels of B, where the device makes them
  auto opts = hand_coded_opts(product.ast);  // an AVX2 core's: 32 KB L1, 1 MB L2, 5 rows of 16 lanes
  ASSERT_FALSE(opts.empty());
  EXPECT_EQ(opts_str(opts).substr(0, 8), "PADTO(0,") << opts_str(opts);
  EXPECT_NE(opts_str(opts).find("UPCAST(4,5) UPCAST(3,16)"), std::string::npos) << opts_str(opts);
  int64_t padded = 0;
  for (auto& ax : kernel_axes(apply_opts(product.ast, {opts[0]})))
    if (ax.id == 0) padded = ax.size;
  EXPECT_GT(padded, 256);
  EXPECT_LE(padded, 256 + 256 / 32);
  EXPECT_EQ(padded % 5, 0);
  if (items.size() > 1) run_with(items[0], {});  // realize the panels the product reads
  expect_close(run_with(product, opts), run_with(product, {}), 1e-3);
  CpuLimits avx512{.vector_bits = 512, .vector_registers = 32};
  EXPECT_EQ(opts_str(hand_coded_opts(product.ast, avx512)).find("PADTO"), std::string::npos);
}

TEST(Opt, HandCodedOptsBlockALargeMatmul) {
  // B: 544 KB, rows of 1088 bytes (a multiple of 1 KB would be padded first: Note [padded B rows])
  Tensor a = realized_randn({64, 512}, 26), b = realized_randn({512, 272}, 27);
  ScheduleItem item = only_kernel(a.matmul(b));
  auto opts = hand_coded_opts(item.ast);
  EXPECT_EQ(opts_str(opts), "BLOCK(1,272) BLOCK(0,32) KBLOCK(2,256) UPCAST(4,4) UPCAST(3,16)");
  expect_close(run_with(item, opts), run_with(item, {}), 1e-3);
  // one loop more in the kernel: the output loop of KBLOCK, which carries the partial sums
  auto axes = kernel_axes(apply_opts(item.ast, opts));
  int carried = 0;
  for (auto& ax : axes) carried += ax.carried;
  EXPECT_EQ(carried, 1);
  // a small one keeps the plain tile
  Tensor c = realized_randn({64, 32}, 28), d = realized_randn({32, 64}, 29);
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(c.matmul(d)).ast)), "UPCAST(0,4) UPCAST(1,16)");
}

// Note [blocks of B panels] in codegen/opt_block.cpp: a B read from panels of the tile's width
// (the layout of Note [B panels] in schedule/padded_rows.cpp, made here by hand) gets K blocks of
// a panel in 1/16 of the L2 instead of half the L1, and keeps the product's result.
TEST(Opt, HandCodedOptsBlockAMatmulOfBPanels) {
  // B: 4.7 MB, rows of 1152 bytes (not padded); 16 rows of A (too few for a copy of B)
  Tensor a = realized_randn({16, 4096}, 40), b = realized_randn({4096, 288}, 41);
  Tensor copy = b.reshape({4096, 18, 16}).permute({1, 0, 2}).contiguous().realize();
  Tensor panels = copy.permute({1, 0, 2}).reshape({4096, 288});
  ScheduleItem item = only_kernel(a.matmul(panels));
  auto opts = hand_coded_opts(item.ast);  // an AVX2 core's: 32 KB L1, 1 MB L2, 16-lane tiles
  EXPECT_EQ(opts_str(opts), "BLOCK(1,288) BLOCK(0,8) KBLOCK(2,1024) UPCAST(4,4) UPCAST(3,16) PREFETCH(5,32)");
  expect_close(run_with(item, opts), run_with(item, {}), 1e-2);
  // the same B with its rows: K blocks of a K x 16 panel in half the L1
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(a.matmul(b)).ast)),
            "BLOCK(1,288) BLOCK(0,8) KBLOCK(2,256) UPCAST(4,4) UPCAST(3,16)");
  // a K whose panel takes 1/8 of the L2 (2048 x 16 lanes x 4 bytes: 128 KB) is not split: the
  // A block is sized with the whole K (512 KB / 8 KB a row: 64 rows, here 8 of its 16)
  Tensor a_mid = realized_randn({16, 2048}, 44);
  Tensor mid = copy.permute({1, 0, 2}).reshape({4096, 288}).shrink({{0, 2048}, {0, 288}});
  ScheduleItem whole = only_kernel(a_mid.matmul(mid));
  auto whole_opts = hand_coded_opts(whole.ast);
  EXPECT_EQ(opts_str(whole_opts), "BLOCK(1,288) BLOCK(0,8) UPCAST(4,4) UPCAST(3,16) PREFETCH(2,32)");
  expect_close(run_with(whole, whole_opts), run_with(whole, {}), 1e-3);
  // a K that one panel block holds is not split: no partial sums through the output
  Tensor a_short = realized_randn({16, 1024}, 42), b_short = realized_randn({1024, 288}, 43);
  Tensor short_copy = b_short.reshape({1024, 18, 16}).permute({1, 0, 2}).contiguous().realize();
  ScheduleItem one_block = only_kernel(a_short.matmul(short_copy.permute({1, 0, 2}).reshape({1024, 288})));
  auto one_block_opts = hand_coded_opts(one_block.ast);
  EXPECT_EQ(opts_str(one_block_opts), "BLOCK(1,288) BLOCK(0,8) UPCAST(4,4) UPCAST(3,16) PREFETCH(2,32)");
  expect_close(run_with(one_block, one_block_opts), run_with(one_block, {}), 1e-3);
  // the 2-core Intel Xeon's (48 KB L1, 2 MB L2, AVX-512) 2048 matmul from panels of 32: K whole
  // (a 256 KB panel) and row blocks of 128 (a 1 MB A block), where K blocks of 1024 by row blocks
  // of 256 carried partial sums through the output
  // (256 rows of A: the scheduler copies B into panels of the host's tile width, checked at 32)
  if (!get_device(default_device()).policy().pad_aliasing_rows) GTEST_SKIP() << "the device keeps B's layout";
  CpuLimits xeon{.vector_bits = 512, .vector_registers = 32, .l1d_bytes = 48 << 10, .l2_bytes = 2 << 20};
  Tensor a_xeon = realized_randn({256, 2048}, 45), b_xeon = realized_randn({2048, 2048}, 46);
  auto xeon_items = create_schedule({a_xeon.matmul(b_xeon).uop()});
  ASSERT_EQ(xeon_items.size(), 2u);  // the panels of B, the product
  if (cpu_tiles(get_device(default_device()).policy().cpu).wide_lanes == 32) {
    EXPECT_EQ(opts_str(hand_coded_opts(xeon_items[1].ast, xeon)),
              "BLOCK(1,2048) BLOCK(0,128) UPCAST(4,8) UPCAST(3,32) PREFETCH(2,16)");
  }
  // panels of another width than the tile's are rows to it
  CpuLimits avx512{.vector_bits = 512, .vector_registers = 32};
  EXPECT_EQ(opts_str(hand_coded_opts(item.ast, avx512)),
            "BLOCK(1,288) BLOCK(0,8) KBLOCK(2,128) UPCAST(4,8) UPCAST(3,32)");
}

// Note [transposing copies] in codegen/opt.cpp: a copy that changes the layout (NHWC -> NCHW)
// loads whole vectors along the loop its source is contiguous in: that loop is upcast by a
// vector's lanes (8 on an AVX2 core, 16 on AVX-512). Copies in order and loads broadcast along the
// stores keep the loop vectorizer's plain loop.
TEST(Opt, TransposingCopiesLoadWholeVectors) {
  Tensor x = realized_randn({4, 24, 24, 32}, 50);
  ScheduleItem to_nchw = only_kernel(x.permute({0, 3, 1, 2}).contiguous());
  auto opts = hand_coded_opts(to_nchw.ast);  // an AVX2 core's
  EXPECT_EQ(opts_str(opts), "UPCAST(1,8)");  // the channel loop, along which x is contiguous
  expect_close(run_with(to_nchw, opts), run_with(to_nchw, {}));
  CpuLimits avx512{.vector_bits = 512, .vector_registers = 32};
  EXPECT_EQ(opts_str(hand_coded_opts(to_nchw.ast, avx512)), "UPCAST(1,16)");
  // 20 columns: half a vector's 8 lanes do not divide them either, so 4 (at least 4 lanes)
  Tensor y = realized_randn({4, 32, 20, 20}, 51);
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(y.permute({0, 2, 3, 1}).contiguous()).ast)), "UPCAST(2,4)");
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(x + 1.0f).ast)), "");
  Tensor bias = realized_randn({32}, 52);
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(x + bias).ast)), "");
}

// Note [copies in the source's order] in codegen/opt.cpp: B copied into panels of 32 columns
// loops over the rows of B outermost (the loop the threads split), then the panels, then a
// panel's lanes, so that it reads each row of B whole; and keeps the copy's result. A copy in
// order, and one whose innermost loop is not contiguous on both sides, keep their loops.
TEST(Opt, PanelCopiesLoopInTheSourcesOrder) {
  Tensor b = realized_randn({64, 96}, 53);
  ScheduleItem copy = only_kernel(b.reshape({64, 3, 32}).permute({1, 0, 2}).contiguous());
  auto opts = hand_coded_opts(copy.ast);  // loops: panel 0, row 1, lane 2
  EXPECT_EQ(opts_str(opts), "BLOCK(1,64) BLOCK(0,3) BLOCK(2,32)");
  std::vector<int64_t> sizes;  // the loops outermost first
  for (auto& ax : kernel_axes(apply_opts(copy.ast, opts)))
    if (ax.size > 1) sizes.push_back(ax.size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{64, 3, 32}));
  expect_close(run_with(copy, opts), run_with(copy, {}));
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(b.reshape({64, 6, 16}).contiguous()).ast)), "");
  // panels of 8 lanes write runs of 32 bytes: shorter than two cache lines, the loops stay
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(b.reshape({64, 12, 8}).permute({1, 0, 2}).contiguous()).ast)), "");
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(b.permute({1, 0}).contiguous()).ast)), "UPCAST(0,8)");
  // the scheduler's panels of a matmul's B (Note [B panels]) loop over B's 512 rows outermost
  // where the host's tile is 32 lanes wide
  if (!get_device(default_device()).policy().pad_aliasing_rows) GTEST_SKIP() << "the device keeps B's layout";
  Tensor a = realized_randn({256, 512}, 55), b_large = realized_randn({512, 512}, 56);
  auto items = create_schedule({a.matmul(b_large).uop()});
  ASSERT_EQ(items.size(), 2u);
  const CpuLimits host = get_device(default_device()).policy().cpu;
  auto copy_opts = hand_coded_opts(items[0].ast, host);
  int64_t outermost = 0;
  for (auto& ax : kernel_axes(apply_opts(items[0].ast, copy_opts)))
    if (ax.size > 1 && !outermost) outermost = ax.size;
  const int64_t width = cpu_tiles(host).wide_lanes;  // runs of 64 bytes (AVX2) keep the panels outermost
  EXPECT_EQ(outermost, width * 4 >= 128 ? 512 : 512 / width) << opts_str(copy_opts);
  // a broadcast source is not a copy of one: its loops stay
  Tensor row = realized_randn({1, 96}, 54);
  EXPECT_EQ(opts_str(hand_coded_opts(only_kernel(row.expand({64, 96}).reshape({64, 3, 32}).permute({1, 0, 2}).contiguous()).ast)), "");
}

TEST(Opt, BadBlocksAreNamed) {
  Tensor a = realized_randn({6, 10}, 30), b = realized_randn({10, 4}, 31);
  ScheduleItem mm = only_kernel(a.matmul(b)), mx = only_kernel(a.max(1));
  ScheduleItem half = only_kernel(a.cast(DType::Float16).matmul(b.cast(DType::Float16)));
  auto fails = [](const ScheduleItem& item, const std::vector<Opt>& opts, std::vector<std::string> words) {
    expect_error([&] { apply_opts(item.ast, opts); }, words);
  };
  fails(mm, {{OptOp::BLOCK, 2, 5}}, {"BLOCK(2,5)", "reduce loop (KBLOCK it)"});
  fails(mm, {{OptOp::KBLOCK, 0, 2}}, {"KBLOCK(0,2)", "output loop (BLOCK it)"});
  fails(mm, {{OptOp::KBLOCK, 2, 10}}, {"smaller than loop 2's size"});
  fails(mm, {{OptOp::KBLOCK, 2, 3}}, {"does not divide"});
  fails(mx, {{OptOp::KBLOCK, 1, 5}}, {"not a sum"});
  fails(half, {{OptOp::KBLOCK, 2, 5}}, {"partial sums are float32", "float16"});
  fails(mm, {{OptOp::KBLOCK, 2, 5}, {OptOp::UPCAST, 2, 2}}, {"UPCAST(2,2)", "carries partial sums"});
  // the outermost loop is split across threads, so it cannot carry partial sums
  fails(only_kernel(realized_randn({40}, 32).sum()), {{OptOp::KBLOCK, 0, 8}},
        {"no output loop runs outside"});
  EXPECT_EQ(opts_str(parse_opts("BLOCK(1,8) KBLOCK(2,4)")), "BLOCK(1,8) KBLOCK(2,4)");
}

TEST(Opt, BadOptsAreNamed) {
  Tensor a = realized_randn({6, 10}, 7);
  ScheduleItem item = only_kernel(a.sum(1));
  expect_error([&] { apply_opts(item.ast, {{OptOp::UPCAST, 0, 4}}); }, {"UPCAST(0,4)", "does not divide", "size 6"});
  expect_error([&] { apply_opts(item.ast, {{OptOp::UPCAST, 1, 2}}); }, {"UPCAST(1,2)", "reduce loop"});
  expect_error([&] { apply_opts(item.ast, {{OptOp::UNROLL, 0, 2}}); }, {"UNROLL(0,2)", "output loop"});
  expect_error([&] { apply_opts(item.ast, {{OptOp::UPCAST, 9, 2}}); }, {"no loop 9"});
  EXPECT_EQ(opts_str(parse_opts("UPCAST(1,8) UNROLL(2,4)")), "UPCAST(1,8) UNROLL(2,4)");
  expect_error([] { parse_opts("UPCAST(1;8)"); }, {"cannot parse 'UPCAST(1;8)'"});
  expect_error([] { parse_opts("SPLIT(1,8)"); }, {"unknown opt 'SPLIT'"});
}

class Beam : public tg::testutil::TempDirTest {};

TEST_F(Beam, FindsOptsThatComputeTheSameAndCachesThem) {
  testutil::KnobScope cachedir(knobs::CACHEDIR, dir_.string());
  Tensor a = realized_randn({32, 48}, 8), b = realized_randn({48, 32}, 9);
  ScheduleItem item = only_kernel(a.matmul(b));
  auto plain = run_with(item, {});
  KernelChoice choice = beam_search(item, 2);
  ASSERT_EQ(choice.kind, KernelChoice::Kind::Generated);  // the CPU has no tensor cores nor library
  auto opts = choice.opts;
  expect_close(run_with(item, opts), plain);
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir_ / "beam")) files += e.path().extension() == ".txt";
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(beam_search(item, 2).opts, opts);  // from the cache
  // a damaged cache entry is searched again, not trusted
  for (auto& e : std::filesystem::directory_iterator(dir_ / "beam")) std::ofstream(e.path()) << "UPCAST(7,3)";
  auto again = beam_search(item, 2).opts;
  expect_close(run_with(item, again), plain);
}

namespace {

// A CPU device whose compiler runs `on_compile(n)` before the n-th compile (from 0), so that a
// test decides which BEAM candidates fail and how. Registered once as "BEAMFAIL".
struct FailingCompiles {
  static std::function<void(int)>& on_compile() {
    static std::function<void(int)> f;
    return f;
  }
  static int& count() {
    static int n = 0;
    return n;
  }
};

class FailingCompiler : public Compiler {
 public:
  explicit FailingCompiler(Compiler& inner) : inner_(inner) {}
  std::string cache_key() const override { return "beamfail " + inner_.cache_key(); }
  std::unique_ptr<Program> compile(const std::string& name, const std::string& source) override {
    if (auto& f = FailingCompiles::on_compile()) f(FailingCompiles::count()++);
    return inner_.compile(name, source);
  }

 private:
  Compiler& inner_;
};

class FailingCompilesDevice : public Device {
 public:
  explicit FailingCompilesDevice(const std::string& name)
      : Device(name), cpu_(make_cpu_device("CPU")), compiler_(cpu_->compiler()) {}
  Allocator& allocator() override { return cpu_->allocator(); }
  const Renderer& renderer() const override { return cpu_->renderer(); }
  Compiler& compiler() override { return compiler_; }
  bool supports(Feature f) const override { return cpu_->supports(f); }
  const DevicePolicy& policy() const override { return cpu_->policy(); }

 private:
  std::unique_ptr<Device> cpu_;
  FailingCompiler compiler_;
};

// item's kernel (on CPU buffers) as a kernel of the BEAMFAIL device, whose compiles run `hook`.
ScheduleItem on_failing_device(ScheduleItem item, std::function<void(int)> hook) {
  static bool registered = [] {
    register_device("BEAMFAIL",
                    [](const std::string& name) { return std::make_unique<FailingCompilesDevice>(name); });
    return true;
  }();
  (void)registered;
  FailingCompiles::on_compile() = std::move(hook);
  FailingCompiles::count() = 0;
  item.device = "BEAMFAIL";
  return item;
}

}  // namespace

TEST_F(Beam, SkipsCandidatesThatFailToCompile) {
  std::string saved = knobs::CACHEDIR.get();
  knobs::CACHEDIR.set(dir_.string());
  Tensor a = realized_randn({32, 48}, 10), b = realized_randn({48, 32}, 11);
  ScheduleItem cpu_item = only_kernel(a.matmul(b));
  auto plain = run_with(cpu_item, {});
  // the plain kernel and every other candidate fail: BEAM keeps one of the others
  int failed = 0;
  ScheduleItem item = on_failing_device(cpu_item, [&](int n) {
    if (n % 2 == 0) {
      failed++;
      throw CompileError("k", "src", "refused by the test");
    }
  });
  auto opts = beam_search(item, 2).opts;
  FailingCompiles::on_compile() = nullptr;
  knobs::CACHEDIR.set(saved);
  EXPECT_GT(failed, 1);
  EXPECT_FALSE(opts.empty());  // the plain kernel failed, so any candidate that compiled wins
  expect_close(run_with(cpu_item, opts), plain);
}

TEST_F(Beam, PropagatesErrorsThatAreNotCompileErrors) {
  std::string saved = knobs::CACHEDIR.get();
  knobs::CACHEDIR.set(dir_.string());
  Tensor a = realized_randn({16, 24}, 12), b = realized_randn({24, 16}, 13);
  ScheduleItem item = on_failing_device(only_kernel(a.matmul(b)), [](int n) {
    if (n == 1) TG_FAIL("CC='nope': the C compiler cannot be run");
  });
  expect_error([&] { beam_search(item, 2); }, {"CC='nope': the C compiler cannot be run"});
  FailingCompiles::on_compile() = nullptr;
  knobs::CACHEDIR.set(saved);
}

TEST(ThreadPool, RunsEveryPartOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  for (int round = 0; round < 100; round++) pool.run(3, [&](int i) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 100);
  pool.run(1, [&](int i) { hits[i]++; });
  EXPECT_EQ(hits[0].load(), 101);
}

TEST(ThreadPool, SplitKernelsMatchOneThread) {
  Tensor x = realized_randn({1024, 300}, 10), y = realized_randn({300, 256}, 11);
  ScheduleItem item = only_kernel(x.matmul(y));
  std::vector<DType> dtypes;
  std::vector<void*> ptrs;
  for (auto& b : item.buffers) dtypes.push_back(b->dtype()), ptrs.push_back(b->ensure_allocated());
  Device& dev = get_device(item.device);
  LinearKernel k = linearize(apply_opts(item.ast, hand_coded_opts(item.ast)), dtypes);
  Program& p = dev.get_program(k.name, dev.renderer().render(k));
  auto read = [&] {
    std::vector<float> out(item.buffers[0]->numel());
    item.buffers[0]->copy_out(out.data(), out.size() * 4);
    return out;
  };
  p.launch(ptrs, {}, {}, true);  // one thread, the whole range
  auto one = read();
  ASSERT_FALSE(k.global_size.empty());
  p.launch(ptrs, k.global_size, {}, true);  // split across the pool
  EXPECT_EQ(read(), one);
}

// Note [exp2 by arithmetic] against the C library, over the whole float range and its edges.
TEST(Transcendental, Exp2MatchesTheCLibrary) {
  std::vector<float> xs = {-200.f, -150.f, -149.5f, -140.f, -126.5f, -126.f, -125.7f, -20.25f, -1.f, -0.5f, -1e-7f,
                           0.f, 1e-7f, 0.49999f, 0.5f, 1.f, 3.3f, 10.3f, 63.99f, 126.9f, 127.9f, 128.f, 200.f,
                           INFINITY, -INFINITY, NAN};
  for (int i = -2000; i <= 2000; i++) xs.push_back(static_cast<float>(i) * 0.0637f);
  auto got = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())}).exp2().to_vector<float>();
  for (size_t i = 0; i < xs.size(); i++) {
    float want = std::exp2(xs[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << "exp2(" << xs[i] << ")";
    } else if (std::isinf(want) || want == 0) {
      EXPECT_EQ(got[i], want) << "exp2(" << xs[i] << ")";
    } else {
      // 2 ulp for normal results; denormals keep their absolute accuracy
      EXPECT_NEAR(got[i], want, std::max(2.5e-7 * want, 1.5e-45)) << "exp2(" << xs[i] << ")";
    }
  }
}

// Note [one kernel-cache key]: every codegen knob is in the compiled-kernel cache's key, so the
// same kernel graph under NOOPT=1 compiles its own program, and NOOPT=0 finds the first one again;
// a runtime knob (DEBUG) is not in the key.
TEST(KernelCache, EveryCodegenKnobIsInTheKey) {
  for (const char* name : {"BEAM", "NOOPT", "CPU_LLVM", "MATMUL_LIB", "TF32", "SPLIT_PARTS", "CC"})
    EXPECT_NE(codegen_key().find(std::string(name) + "="), std::string::npos) << name << " in " << codegen_key();
  EXPECT_EQ(codegen_key().find("DEBUG="), std::string::npos) << codegen_key();
  Device& cpu = get_device("CPU");
  auto run = [] {
    Tensor a = Tensor::arange(64).reshape({8, 8}).cast(DType::Float32);
    return (a * a + 1.0).sum(1).to_vector<float>();
  };
  std::vector<float> optimized = run();
  size_t after_first = cpu.compiled_count();
  {
    testutil::KnobScope noopt(knobs::NOOPT, 1);
    EXPECT_NE(codegen_key().find("NOOPT=1"), std::string::npos);
    EXPECT_EQ(run(), optimized);
    EXPECT_GT(cpu.compiled_count(), after_first) << "NOOPT=1 reused the optimized program";
  }
  size_t after_noopt = cpu.compiled_count();
  EXPECT_EQ(run(), optimized);
  EXPECT_EQ(cpu.compiled_count(), after_noopt) << "back at NOOPT=0 the first program was compiled again";
}

namespace {

// The value of a kernel-graph index expression with its loops at the given values.
int64_t eval_index(const UOpPtr& u, const std::map<const UOp*, int64_t>& at) {
  auto s = [&](size_t i) { return eval_index(u->src[i], at); };
  switch (u->op) {
    case Op::CONST: return static_cast<int64_t>(u->const_value());
    case Op::RANGE: return at.at(u.get());
    case Op::ADD: return s(0) + s(1);
    case Op::MUL: return s(0) * s(1);
    case Op::MAX: return std::max(s(0), s(1));
    case Op::CMPLT: return s(0) < s(1);
    case Op::WHERE: return s(0) ? s(1) : s(2);
    default: ADD_FAILURE() << "eval_index: " << op_name(u->op); return 0;
  }
}

// The lowered kernel's reduce loops whose trip count the outer loops set (Note [reduce loops
// skip gated zeros] in codegen/reduce_bounds.cpp).
std::vector<UOpPtr> bounded_loops(const ScheduleItem& item, const std::vector<Opt>& opts) {
  LoweredKernel k = lower_with_choice(item.ast, param_dtypes(item), CodegenTarget::of(get_device(item.device)),
                                      KernelChoice::generated(opts));
  std::vector<UOpPtr> out;
  for (auto& u : k.kernel.uops)
    if (u->op == Op::RANGE && u->src[0]->op != Op::CONST) out.push_back(u);
  return out;
}

// The outer loop an expression depends on (exactly one).
const UOp* only_loop_in(const UOpPtr& e) {
  std::vector<const UOp*> loops;
  for (auto& n : toposort({e}))
    if (n->op == Op::RANGE) loops.push_back(n.get());
  EXPECT_EQ(loops.size(), 1u);
  return loops.empty() ? nullptr : loops[0];
}

}  // namespace

// Note [reduce loops skip gated zeros] and Note [transposed convolutions skip the padded rows]:
// the input gradient of a 5x5 convolution over 24 x 24 pixels is a transposed convolution of the
// 20 x 20 output gradient padded by 4 rows and columns. With the CPU's tile (4 columns x 16
// channels) the tap-row loop of output row y runs over the taps that reach a row of the output
// gradient only: 20 x 5 tap rows in all instead of 24 x 5, and the result is the definition's.
TEST(ReduceBounds, TransposedConvolutionSkipsThePaddedRows) {
  if (!get_device("CPU").policy().channels_last_convolutions) GTEST_SKIP() << "the CPU keeps NCHW convolutions";
  const int64_t n = 2, c = 32, hw = 24, k = 5, o = hw - k + 1;
  Tensor x = realized_randn({n, c, hw, hw}, 31), w = realized_randn({c, c, k, k}, 32);
  x.requires_grad_(true);
  Tensor g = realized_randn({n, c, o, o}, 33);
  Tensor dx = (x.conv2d(w) * g).sum().gradients({x})[0];
  std::vector<ScheduleItem> convs;
  for (auto& item : create_schedule({dx.uop()})) {
    if (bounded_loops(item, {}).size() == 1) convs.push_back(item);
    if (convs.empty()) run_with(item, {});  // the transposed convolution's inputs
  }
  ASSERT_EQ(convs.size(), 1u) << "one kernel of the backward pass bounds a loop: the transposed convolution";
  ScheduleItem conv = convs[0];
  auto axes = kernel_axes(conv.ast);  // n, y, x, channel, then the reduce loops
  ASSERT_EQ(axes.size(), 7u);
  std::vector<Opt> tile{{OptOp::UPCAST, axes[2].id, 4}, {OptOp::UPCAST, axes[3].id, 16}};
  auto loops = bounded_loops(conv, tile);
  ASSERT_EQ(loops.size(), 1u);
  const UOp* row = only_loop_in(loops[0]->src[0]);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->arg_int(), axes[1].id);  // the output row sets it
  int64_t taps = 0;
  for (int64_t y = 0; y < hw; y++) {
    int64_t trip = eval_index(loops[0]->src[0], {{row, y}}), useful = 0;
    for (int64_t i = 0; i < k; i++) useful += y + i - (k - 1) >= 0 && y + i - (k - 1) < o;
    EXPECT_EQ(trip, useful) << "output row " << y;
    taps += trip;
  }
  EXPECT_EQ(taps, o * k);
  // lanes along the rows reach different taps: that loop keeps its trip count
  EXPECT_TRUE(bounded_loops(conv, {{OptOp::UPCAST, axes[1].id, 2}, {OptOp::UPCAST, axes[3].id, 16}}).empty());

  // the definition: dx[b, ci, y, x] = sum of g[b, co, y - i, x - j] * w[co, ci, i, j]
  auto xv = dx.to_vector<float>(), gv = g.to_vector<float>(), wv = w.to_vector<float>();
  std::vector<float> want(xv.size());
  for (int64_t b = 0; b < n; b++)
    for (int64_t co = 0; co < c; co++)
      for (int64_t y = 0; y < o; y++)
        for (int64_t xx = 0; xx < o; xx++) {
          float gg = gv[static_cast<size_t>(((b * c + co) * o + y) * o + xx)];
          for (int64_t ci = 0; ci < c; ci++)
            for (int64_t i = 0; i < k; i++)
              for (int64_t j = 0; j < k; j++)
                want[static_cast<size_t>(((b * c + ci) * hw + y + i) * hw + xx + j)] +=
                    gg * wv[static_cast<size_t>(((co * c + ci) * k + i) * k + j)];
        }
  expect_close(xv, want, 1e-4);
  expect_close(run_with(conv, tile), run_with(conv, {}));
  expect_close(run_with(conv, {{OptOp::UPCAST, axes[1].id, 2}}), run_with(conv, {}));
}

// A cumulative sum reads a padded window: output o sums o + 1 elements instead of n.
TEST(ReduceBounds, CumsumRunsATriangle) {
  Tensor x = realized_randn({3, 40}, 34);
  ScheduleItem item = only_kernel(x.cumsum(1));
  auto loops = bounded_loops(item, {});
  ASSERT_EQ(loops.size(), 1u);
  const UOp* col = only_loop_in(loops[0]->src[0]);
  ASSERT_NE(col, nullptr);
  for (int64_t o = 0; o < 40; o++) EXPECT_EQ(eval_index(loops[0]->src[0], {{col, o}}), o + 1);
  auto xv = x.to_vector<float>();
  std::vector<float> want(xv.size());
  for (size_t r = 0; r < 3; r++)
    for (size_t o = 0; o < 40; o++) want[r * 40 + o] = (o ? want[r * 40 + o - 1] : 0.0f) + xv[r * 40 + o];
  expect_close(run_with(item, {}), want, 1e-5);
}

// A max over padding (-inf outside, not 0) keeps its loops.
TEST(ReduceBounds, MaxPoolingKeepsItsLoops) {
  Tensor x = realized_randn({1, 2, 6, 6}, 35);
  ScheduleItem item = only_kernel(x.max_pool2d({3, 3}, {1, 1}, {1, 1}));
  EXPECT_TRUE(bounded_loops(item, {}).empty());
}
