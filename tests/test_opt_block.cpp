// The kernel optimizer's cache opts (codegen/opt_block.h): BLOCK, KBLOCK, PADTO and PREFETCH
// keep every kernel's result, and the hand-coded choice of them follows the host's caches.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tests/opt_util.h"
#include "tests/test_util.h"
#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/opt_block.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

using namespace tg;
using namespace tg::optutil;
using tg::testutil::expect_error;

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
