// The kernel optimizer (UPCAST, UNROLL, hand-coded choice, BEAM with its disk cache) and the
// CPU thread pool: every optimized kernel must compute what the unoptimized one does. The cache
// opts (BLOCK, KBLOCK, PADTO, PREFETCH) are tested in test_opt_block.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "tests/opt_util.h"
#include "tests/test_util.h"
#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/opt.h"
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
using namespace tg::optutil;

namespace {

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

// Note [short contiguous reduce rows]: a per-channel sum over 20-wide rows (BatchNorm's over the
// CNN's 20 x 20 maps) unrolls the whole row, whose partial sums the SLP vectorizer packs, where
// the largest power of two dividing it (4) is under a vector's lanes; a row over two tiles' lanes
// keeps the power of two.
TEST(Opt, HandCodedOptsUnrollAWholeShortContiguousRow) {
  const CpuLimits avx2{}, avx512{.vector_bits = 512, .vector_registers = 32};
  for (const CpuLimits& host : {avx2, avx512}) {
    Tensor x = realized_randn({4, 3, 20, 20}, 23);
    ScheduleItem item = only_kernel(x.sum({0, 2, 3}));
    auto opts = hand_coded_opts(item.ast, host);
    ASSERT_EQ(opts.size(), 1u) << opts_str(opts);
    EXPECT_EQ(opts[0], (Opt{OptOp::UNROLL, kernel_axes(item.ast).back().id, 20})) << opts_str(opts);
    expect_close(run_with(item, opts), run_with(item, {}));
  }
  Tensor wide = realized_randn({4, 3, 36}, 24);  // 36 > 2 x 16 lanes on AVX2: 4 partial sums
  ScheduleItem item = only_kernel(wide.sum({0, 2}));
  auto opts = hand_coded_opts(item.ast, avx2);
  ASSERT_EQ(opts.size(), 1u) << opts_str(opts);
  EXPECT_EQ(opts[0], (Opt{OptOp::UNROLL, kernel_axes(item.ast).back().id, 4})) << opts_str(opts);
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
