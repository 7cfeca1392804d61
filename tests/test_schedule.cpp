// Scheduling and fusion: kernel counts where fusion matters, views that cost no kernel, DEBUG
// output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "schedule_util.h"
#include "test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/schedule/split_reduce.h"
#include "tinygrad/tensor.h"
#include "tinygrad/tensor_internal.h"

using namespace tg;

using testutil::kernels;
using testutil::written_buffers;

TEST(Fusion, MulAddSumIsOneKernel) {
  Tensor a = Tensor::rand({16, 16}), b = Tensor::rand({16, 16}), c = Tensor::rand({16, 16});
  Tensor r = ((a * b) + c).sum();
  EXPECT_EQ(kernels({r}), 1u);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = c.to_vector<float>();
  double expect = 0;
  for (size_t i = 0; i < av.size(); i++) expect += av[i] * bv[i] + cv[i];
  EXPECT_NEAR(r.item<float>(), expect, 1e-3);
}

TEST(Fusion, ViewsFeedingElementwiseAddNoCopy) {
  Tensor x = Tensor::randn({4, 6}), y = Tensor::rand({3, 8});
  Tensor r = x.relu().reshape({2, 3, 4}).permute({1, 0, 2}).reshape({3, 8}) + y;
  EXPECT_EQ(kernels({r}), 1u);
  auto xv = x.to_vector<float>(), yv = y.to_vector<float>(), rv = r.to_vector<float>();
  // r[i, j*4+k] = relu(x_flat[j*12 + i*4 + k]) + y[i, j*4+k]
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 4; k++) {
        float xr = std::max(0.0f, xv[j * 12 + i * 4 + k]);
        EXPECT_FLOAT_EQ(rv[i * 8 + j * 4 + k], xr + yv[i * 8 + j * 4 + k]);
      }
}

TEST(Fusion, ReduceThenScaleIsOneKernel) {
  Tensor x = Tensor::rand({32, 8});
  EXPECT_EQ(kernels({x.sum(1) * 2.0}), 1u);
  EXPECT_EQ(kernels({x.mean()}), 1u);
}

// Note [row fusion] in tinygrad/schedule/schedule.cpp; tests/test_rowfuse.cpp checks the values.
TEST(Fusion, SoftmaxLayernormAreOneKernel) {
  Tensor x = Tensor::rand({8, 1000});
  EXPECT_EQ(kernels({x.softmax(-1)}), 1u);
  EXPECT_EQ(kernels({x.log_softmax(-1)}), 1u);
  EXPECT_EQ(kernels({x.layernorm()}), 1u);
  EXPECT_EQ(kernels({x.logsumexp(-1)}), 1u);
  EXPECT_EQ(kernels({Tensor::rand({2, 3, 40}).layernorm({-2, -1})}), 1u);
  // cross-entropy: the row max joins the row's logsumexp, which the mean reads with the targets'
  // logits (Note [cross-entropy from the target's logit] in tensor_nn.cpp)
  Tensor labels = Tensor::randint({8}, 0, 1000);
  EXPECT_EQ(kernels({x.sparse_categorical_crossentropy(labels)}), 2u);
  testutil::KnobScope off(knobs::ROWFUSE, 0);
  EXPECT_EQ(kernels({x.softmax(-1)}), 3u);
  EXPECT_EQ(kernels({x.sparse_categorical_crossentropy(labels)}), 3u);
  EXPECT_EQ(kernels({x.layernorm()}), 3u);
}

TEST(Fusion, RowsThatDoNotFitStaySeparate) {
  EXPECT_EQ(kernels({Tensor::rand({2, 20000}).softmax(-1)}), 3u);  // longer than the rule takes
  Tensor x = Tensor::rand({6, 40});
  EXPECT_EQ(kernels({x.softmax(0)}), 3u);  // not the trailing axis
  Tensor m = x.max(-1, true);
  EXPECT_EQ(kernels({x - m, (x * m).sum()}), 3u);  // read by two kernels: computed once
}

// Note [shared elementwise chains] in schedule/shared_chains.cpp: a residual stream that every
// layer's statistics read is computed once per layer instead of in every reader.
TEST(Fusion, AResidualStreamIsComputedOnceForItsReaders) {
  constexpr size_t LAYERS = 8;
  Tensors layer_outputs;
  for (size_t l = 0; l < LAYERS; l++) layer_outputs.push_back(Tensor::rand({256, 256}).realize());
  auto stream = [&] {  // x_l = x_(l-1) + 0.5 h_l; every x_l's row means, and the last x
    Tensors outs;
    Tensor x = layer_outputs[0];
    for (size_t l = 1; l < LAYERS; l++) {
      outs.push_back(x.mean(-1));
      x = x + layer_outputs[l] * 0.5;
    }
    outs.push_back(x);
    return outs;
  };
  auto widest_kernel = [](const Tensors& ts) {  // the most buffers one kernel reads or writes
    std::vector<UOpPtr> outs;
    for (auto& t : ts) outs.push_back(t.uop());
    size_t widest = 0;
    for (auto& item : create_schedule(outs)) widest = std::max(widest, item.buffers.size());
    return widest;
  };
  std::vector<std::vector<float>> inline_values;
  {
    testutil::KnobScope off(knobs::SHARED_CHAINS, 0);
    EXPECT_EQ(widest_kernel(stream()), LAYERS + 1);  // the last x reads every layer's output
    for (auto& t : stream()) inline_values.push_back(t.to_vector<float>());
  }
  // x_3 .. x_6 get buffers (x_7 is an output): x_3 is computed from 4 inputs, a mean from at most 3
  EXPECT_EQ(widest_kernel(stream()), 5u);
  Tensors shared = stream();
  ASSERT_EQ(shared.size(), inline_values.size());
  for (size_t i = 0; i < shared.size(); i++) {
    std::vector<float> v = shared[i].to_vector<float>();
    ASSERT_EQ(v.size(), inline_values[i].size());
    for (size_t j = 0; j < v.size(); j++) ASSERT_NEAR(v[j], inline_values[i][j], 1e-5) << i << " " << j;
  }
  // a chain of two inputs that two kernels read stays inline: its buffer would move more memory
  Tensor a = Tensor::rand({256, 256}).realize(), b = Tensor::rand({256, 256}).realize();
  EXPECT_EQ(kernels({(a + b).sum(0), (a + b).sum(1)}), 2u);
}

// Note [shared elementwise chains]: once the residual x below them is a buffer, a LayerNorm's
// x - mean and its normalized x load one full-size input each, so they stay inline in their
// readers (the output, and the column sums a backward pass takes of them) instead of being
// written in float32 too.
TEST(Fusion, ALayerNormOfABufferedResidualWritesNoNormalizedCopy) {
  Tensor a = Tensor::rand({256, 256}).realize(), b = Tensor::rand({256, 256}).realize();
  Tensor w = Tensor::rand({256}).realize();
  Tensors g;
  for (int i = 0; i < 3; i++) g.push_back(Tensor::rand({256, 256}).realize());
  auto graph = [&] {
    Tensor x = a + b * 0.5;  // the residual: read by the norm's kernels, a column sum and the next residual
    Tensor normalized = x.layernorm();
    Tensors outs{normalized * w, x + a, x.sum(0)};
    for (auto& gi : g) outs.push_back((normalized * gi).sum(0));  // weight gradients read it
    return outs;
  };
  auto full_size_intermediates = [&](const Tensors& outs) {  // buffers of x's size that are no output
    std::vector<UOpPtr> us;
    for (auto& t : outs) us.push_back(t.uop());
    auto items = create_schedule(us);
    size_t n = 0;
    for (size_t i = 0; i < items.size(); i++)
      if (items[i].kind == ScheduleItem::Kind::Kernel && items[i].buffers[0]->nbytes() == 256 * 256 * 4) n++;
    return n - 2;  // the two full-size outputs
  };
  EXPECT_EQ(full_size_intermediates(graph()), 1u);  // x alone, not the normalized x too
  Tensors shared = graph();
  std::vector<std::vector<float>> inline_values;
  {
    testutil::KnobScope off(knobs::SHARED_CHAINS, 0);
    for (auto& t : graph()) inline_values.push_back(t.to_vector<float>());
  }
  for (size_t i = 0; i < shared.size(); i++) {
    std::vector<float> v = shared[i].to_vector<float>();
    for (size_t j = 0; j < v.size(); j++) ASSERT_NEAR(v[j], inline_values[i][j], 1e-4) << i << " " << j;
  }
}

// Note [values stored rounded]: a bfloat16 product read back in float32 (a Linear under
// autocast) is stored rounded, in a bfloat16 buffer, by the product's own kernel; its two readers
// widen it as they load it. The values are those of the product rounded, as before; a product
// whose float32 result is itself an output keeps its float32 buffer.
TEST(Fusion, HalfProductsReadBackInFloat32AreStoredRounded) {
  Tensor x = Tensor::rand({64, 96}).realize(), w = Tensor::rand({96, 48}).realize();
  Tensor y = x.cast(DType::BFloat16).matmul(w.cast(DType::BFloat16)).float_();
  Tensor a = y * 2.0, b = y.sum(0);
  auto products = [](const Tensors& ts) {  // the dtype each kernel with a sum of products writes
    std::vector<UOpPtr> outs;
    for (auto& t : ts) outs.push_back(t.uop());
    std::vector<DType> written;
    for (auto& item : create_schedule(outs)) {
      bool product = false;
      for (auto& u : toposort({item.ast})) product = product || (u->op == Op::REDUCE && u->src[0]->op == Op::MUL);
      if (product) written.push_back(item.buffers[0]->dtype());
    }
    return written;
  };
  EXPECT_EQ(products({a, b}), std::vector<DType>{DType::BFloat16});
  auto bf16_rounded = [](float f) {  // to the nearest bfloat16, ties to even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> ys = y.to_vector<float>(), as = a.to_vector<float>();
  for (size_t i = 0; i < ys.size(); i++) {
    EXPECT_EQ(ys[i], bf16_rounded(ys[i]));
    EXPECT_EQ(as[i], 2 * ys[i]);
  }
  Tensor w2 = Tensor::rand({96, 48}).realize();  // a product not computed yet
  EXPECT_EQ(products({x.cast(DType::BFloat16).matmul(w2.cast(DType::BFloat16)).float_()}),
            std::vector<DType>{DType::Float32});
}

// Note [split reductions] and Note [split long reductions] in schedule/split_reduce.cpp: the rule
// itself, on graphs of any device (the scheduler applies it on GPU-style devices only).
TEST(SplitReduce, LongReductionsSplitByOutputs) {
  auto no_input = [](const UOp* u) { return u->realized != nullptr; };
  auto parts = [&](const Tensor& r) -> int64_t {
    auto split = split_reduce(r.uop(), no_input);
    return split ? prod(split->partial->shape) / prod(r.shape()) : 1;
  };
  // few outputs (BatchNorm's statistics): as many partials as 1024 work-groups allow
  EXPECT_EQ(parts(Tensor::empty({128, 32, 24, 24}).sum({0, 2, 3})), 32);
  // many outputs, long (a convolution's weight gradient): SPLIT_PARTS partials of the batch, each
  // of at least 4096 elements
  Tensor x = Tensor::empty({1024, 16, 1, 8}).expand({1024, 16, 8, 8});
  Tensor g = Tensor::empty({1024, 64, 1, 8}).expand({1024, 64, 8, 8});
  Tensor wgrad = (x.reshape({1024, 1, 16, 8, 8}) * g.reshape({1024, 64, 1, 8, 8})).sum({0, 3, 4});
  EXPECT_EQ(parts(wgrad), 8);
  auto split = split_reduce(wgrad.uop(), no_input);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->partial->shape[0], 8);  // the batch, outermost
  EXPECT_EQ(split->root->shape, wgrad.shape());
  auto wide = [](Shape s) {  // a [.., C, ..] buffer seen as `s`
    Shape small(s.size(), 1);
    small[1] = s[1];
    return Tensor::empty(small).expand(s);
  };
  EXPECT_EQ(parts(wide({6, 1024, 96, 128}).sum({0, 2, 3})), 8);  // rows, where the batch splits worse
  EXPECT_EQ(parts(wide({3, 1024, 160, 160}).sum({0, 2, 3})), 8);
  EXPECT_EQ(parts(wide({16, 1024, 32, 64}).sum({0, 2, 3})), 1);  // 32768 elements: one stage
  EXPECT_EQ(parts(wide({4, 1 << 17, 1 << 14}).sum({0, 2})), 1);  // more outputs than are grouped
  testutil::KnobScope split_parts(knobs::SPLIT_PARTS, 1);
  EXPECT_EQ(parts(wgrad), 1);
  split_parts.set(16);
  EXPECT_EQ(parts(wgrad), 16);
}

// Note [split column sums] in schedule/split_reduce.cpp: a column sum splits a reduced axis into
// up to 2^17 partials of at least 64 rows; a transposed input (its rows contiguous), a contraction
// (a weight gradient) and small sums keep the other rules.
TEST(SplitReduce, ColumnSumsSplitIntoParts) {
  auto no_input = [](const UOp* u) { return u->realized != nullptr; };
  auto split_of = [&](const Tensor& r) { return split_reduce(r.uop(), no_input); };
  auto parts = [&](const Tensor& r) -> int64_t {
    auto split = split_of(r);
    return split ? prod(split->partial->shape) / prod(r.shape()) : 1;
  };
  EXPECT_EQ(parts(Tensor::empty({16384, 768}).sum(0)), 128);  // 98304 partials of 128 rows
  EXPECT_EQ(parts(Tensor::empty({16384, 3072}).sum(0)), 32);
  auto split3 = split_of(Tensor::empty({16, 1024, 768}).sum({0, 1}));
  ASSERT_TRUE(split3.has_value());
  EXPECT_EQ(split3->partial->shape, (Shape{1, 128, 1, 768}));  // the 1024 in 128 parts of 8
  // LayerNorm's weight gradient (statistics broadcast along the columns) and a bias gradient that
  // adds the bias again (broadcast along the rows)
  Tensor g = Tensor::empty({16, 1024, 768}), mean = Tensor::empty({16, 1024, 1}), bias = Tensor::empty({768});
  EXPECT_EQ(parts((g * (g - mean)).sum({0, 1})), 128);
  EXPECT_EQ(parts((g + bias).relu().sum({0, 1})), 128);
  EXPECT_EQ(parts(Tensor::empty({768, 16384}).permute({1, 0}).sum(0)), 1);  // rows contiguous: one stage
  Tensor a = Tensor::empty({16384, 64}), b = Tensor::empty({16384, 64});
  EXPECT_EQ(parts((a.reshape({16384, 64, 1}) * b.reshape({16384, 1, 64})).sum(0)), 1);  // a contraction
  EXPECT_EQ(parts(Tensor::empty({1000, 77}).sum(0)), 1);
  EXPECT_EQ(parts(Tensor::empty({3, 5000}).sum(0)), 1);
  EXPECT_EQ(parts(Tensor::empty({16384, 4}).sum(0)), 16);  // too narrow: the few-outputs rule
}

TEST(Fusion, ReshapeOfRealizedNeedsNoKernel) {
  Tensor x = Tensor::rand({4, 4});
  EXPECT_EQ(kernels({x.reshape({16})}), 0u);
  EXPECT_EQ(kernels({x.reshape({2, 8}).reshape({16})}), 0u);
}

// Note [MLP kernel count]: a 3-layer MLP's forward pass, loss and gradients are 17 kernels on
// either CPU compiler (CPU_LLVM=0 and 1): the three products and the two relus that feed a
// product (Note [product operands]), 4 for the cross-entropy loss and its mean, and 8 for the
// backward pass (the loss gradient, two input gradients with their relu masks, three weight
// gradients); the random inputs and weights are drawn on the host (no kernel). Where the device
// copies a transposed B (the CPU), the two input gradients dY @ W^T read copies of W2^T and W3^T
// (Note [gradient products] in schedule/padded_rows.cpp): 19. A fusion that
// breaks or a kernel more anywhere changes the count; a change that saves kernels on purpose
// updates it here.
TEST(Fusion, MlpForwardBackwardKernelCountIsExact) {
  Tensor::manual_seed(1);
  Tensor w1 = Tensor::randn({784, 128}).requires_grad_(), w2 = Tensor::randn({128, 64}).requires_grad_();
  Tensor w3 = Tensor::randn({64, 10}).requires_grad_();
  Tensor x = Tensor::rand({32, 784});
  Tensor labels = Tensor::randint({32}, 0, 10);
  Tensor loss = x.matmul(w1).relu().matmul(w2).relu().matmul(w3).sparse_categorical_crossentropy(labels);
  loss.backward();
  size_t copies = get_device(default_device()).policy().copy_transposed_b ? 2 : 0;
  EXPECT_EQ(kernels({loss, *w1.grad(), *w2.grad(), *w3.grad()}), 17u + copies);  // Note [MLP kernel count]
}

namespace {
// The loops of a kernel graph (their sizes, sorted), whether any is a reduce, whether it stores by adding.
struct KernelShape {
  std::vector<int64_t> loops;
  bool reduces = false, accumulates = false;
};
KernelShape shape_of(const UOpPtr& ast) {
  KernelShape k;
  for (auto& n : toposort({ast})) {
    if (n->op == Op::RANGE) k.loops.push_back(static_cast<int64_t>(n->src[0]->const_value()));
    k.reduces |= n->op == Op::REDUCE;
    k.accumulates |= is_accumulating_store(*n);
  }
  std::sort(k.loops.begin(), k.loops.end());
  return k;
}
}  // namespace

// Note [gather and scatter-add]: an embedding lookup of N rows of a V x D table runs over N x D
// (no loop over V), and its gradient is a zeroing kernel and an accumulating one over N x D.
TEST(Gather, EmbeddingLookupAndItsGradientDoNotLoopOverTheVocabulary) {
  const int64_t V = 1000, D = 8, N = 6;
  Tensor table = Tensor::randn({V, D}).requires_grad_();
  Tensor::realize_all({table});
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{999, 3, 3, 0, -1, 1000}, {N});
  Tensor rows = table.index_select(0, idx);
  auto fwd = create_schedule({rows.uop()});
  ASSERT_EQ(fwd.size(), 1u);
  KernelShape k = shape_of(fwd[0].ast);
  EXPECT_FALSE(k.reduces);
  EXPECT_EQ(k.loops, (std::vector<int64_t>{N, D}));  // N < D
  // out-of-range indices read 0
  auto got = rows.to_vector<float>(), t = table.to_vector<float>();
  for (int64_t d = 0; d < D; d++) {
    EXPECT_EQ(got[0 * D + d], t[999 * D + d]);
    EXPECT_EQ(got[2 * D + d], t[3 * D + d]);
    EXPECT_EQ(got[4 * D + d], 0.0f);
    EXPECT_EQ(got[5 * D + d], 0.0f);
  }

  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {N, 1});
  (rows * w).sum().backward();
  auto bwd = create_schedule({table.grad()->uop()});
  size_t accumulating = 0;
  for (auto& item : bwd) {
    KernelShape b = shape_of(item.ast);
    EXPECT_FALSE(b.reduces);
    if (b.accumulates) EXPECT_EQ(b.loops, (std::vector<int64_t>{N, D}));
    else EXPECT_EQ(b.loops, (std::vector<int64_t>{D, V}));  // zeroing the gradient
    accumulating += b.accumulates;
  }
  EXPECT_EQ(accumulating, 1u);
  EXPECT_EQ(bwd.size(), 2u);
  auto g = table.grad()->to_vector<float>();
  for (int64_t d = 0; d < D; d++) {
    EXPECT_EQ(g[999 * D + d], 1.0f);
    EXPECT_EQ(g[3 * D + d], 5.0f);  // rows 1 and 2 both read row 3: 2 + 3
    EXPECT_EQ(g[0 * D + d], 4.0f);
    EXPECT_EQ(g[1 * D + d], 0.0f);  // -1 and 1000 add nothing
  }
}

// Note [kernels with several outputs]: an Adam-style update stores the parameter and both
// moments from one kernel; an output also read through a view keeps its own kernel.
TEST(Fusion, AnUpdateAndItsMomentsAreOneKernelWithThreeOutputs) {
  Tensor p = Tensor::randn({64, 32}), m = Tensor::randn({64, 32}), v = Tensor::rand({64, 32}), g = Tensor::randn({64, 32});
  Tensor::realize_all({p, m, v, g});
  Tensor g2 = g * 0.5;  // computed: each output evaluates it
  Tensor m2 = m * 0.9 + g2 * 0.1, v2 = v * 0.99 + g2 * g2 * 0.01;
  Tensor p2 = p - m2 / (v2.sqrt() + 1e-8) * 0.01;
  auto items = create_schedule({p2.uop(), m2.uop(), v2.uop()});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].outputs, 3u);
  Tensor::realize_all({p2, m2, v2});
  auto pv = p.to_vector<float>(), mv = m.to_vector<float>(), vv = v.to_vector<float>(), gv = g.to_vector<float>();
  auto pn = p2.to_vector<float>(), mn = m2.to_vector<float>(), vn = v2.to_vector<float>();
  for (size_t i = 0; i < pv.size(); i += 97) {
    float gi = gv[i] * 0.5f, mi = mv[i] * 0.9f + gi * 0.1f, vi = vv[i] * 0.99f + gi * gi * 0.01f;
    EXPECT_NEAR(mn[i], mi, 1e-6);
    EXPECT_NEAR(vn[i], vi, 1e-6);
    EXPECT_NEAR(pn[i], pv[i] - mi / (std::sqrt(vi) + 1e-8f) * 0.01f, 1e-5);
  }
  Tensor a = m * 2.0, b = a + a.flip({0});  // a is read at another index: two kernels
  EXPECT_EQ(create_schedule({a.uop(), b.uop()}).size(), 2u);
}

TEST(Debug, Level4PrintsGeneratedSource) {
  std::string err;
  {
    testutil::KnobScope debug(knobs::DEBUG, 4);
    testing::internal::CaptureStderr();
    Tensor x = Tensor::rand({5, 7});
    (x * 3.0 + 1.0).exp().sum(0).realize();
    err = testing::internal::GetCapturedStderr();
  }
  EXPECT_NE(err.find("r__5_x7"), std::string::npos) << err;  // the kernel's name: 7 sums over 5, upcast
  EXPECT_TRUE(err.find("data0") != std::string::npos || err.find("define") != std::string::npos) << err;
  EXPECT_NE(err.find("*** CPU"), std::string::npos) << err;
}

TEST(Debug, Level2ShowsTimeAndMemory) {
  std::string err;
  {
    testutil::KnobScope debug(knobs::DEBUG, 2);
    testing::internal::CaptureStderr();
    (Tensor::rand({64}) + 1.0).realize();
    err = testing::internal::GetCapturedStderr();
  }
  EXPECT_NE(err.find(" ms"), std::string::npos) << err;
  EXPECT_NE(err.find("mem in use"), std::string::npos) << err;
}

TEST(MemoryPool, FreedBuffersAreReused) {
  auto& pool = get_device("CPU").pool();
  auto before = pool.stats();
  for (int i = 0; i < 5; i++) (Tensor::rand({1000}) * 2.0).realize();
  auto after = pool.stats();
  EXPECT_GT(after.reuse_hits, before.reuse_hits);
  EXPECT_GE(after.peak_bytes, after.bytes_in_use);
}

// Note [pool block sizes]: small blocks round to 64 bytes, middling ones to an eighth of the next
// power of two, and a large block (a captured step's arena) wastes at most 2 MiB.
TEST(MemoryPool, LargeBlocksRoundToAtMostTwoMebibytes) {
  const size_t mib = size_t{1} << 20;
  EXPECT_EQ(MemoryPool::round_size(100), 128u);
  EXPECT_EQ(MemoryPool::round_size(3 * mib + 1), 3 * mib + mib / 2);  // eighths of 4 MiB
  const size_t arena = size_t{8178} * 1000 * 1000;                    // GPT-2 124M's arena
  EXPECT_GE(MemoryPool::round_size(arena), arena);
  EXPECT_LT(MemoryPool::round_size(arena), arena + 2 * mib);
  EXPECT_EQ(MemoryPool::round_size(64 * mib + 1), 66 * mib);
}

namespace {
// Host memory that counts what it has handed out, to see what a pool holds.
class CountingAllocator : public Allocator {
 public:
  void* alloc(size_t bytes) override {
    held += bytes;
    return std::malloc(bytes);
  }
  void free(void* ptr, size_t bytes) override {
    held -= bytes;
    std::free(ptr);
  }
  void copy_in(void*, const void*, size_t) override {}
  void copy_out(void*, const void*, size_t) override {}
  size_t held = 0;
};
}  // namespace

// Note [bounded cache]: a change of shapes does not make the pool hold old and new blocks at once.
TEST(MemoryPool, HoldsNoMoreThanItsPeakWhenShapesChange) {
  CountingAllocator backing;
  MemoryPool pool(backing);
  const size_t mb = size_t{1} << 20;
  std::vector<void*> train;
  for (int i = 0; i < 8; i++) train.push_back(pool.alloc(3 * mb));  // "training": 24 MiB live
  for (void* p : train) pool.free(p, 3 * mb);
  const size_t peak = pool.stats().peak_bytes;
  EXPECT_EQ(pool.stats().bytes_cached, peak);
  std::vector<void*> eval;
  for (int i = 0; i < 4; i++) eval.push_back(pool.alloc(5 * mb));  // "evaluation": other sizes, 20 MiB
  EXPECT_LE(backing.held, peak);  // old blocks went back as the new ones came
  EXPECT_EQ(pool.stats().bytes_in_use + pool.stats().bytes_cached, backing.held);
  for (void* p : eval) pool.free(p, 5 * mb);
  // A new peak needs new memory; nothing beyond it stays.
  std::vector<void*> big;
  for (int i = 0; i < 10; i++) big.push_back(pool.alloc(4 * mb));
  EXPECT_EQ(pool.stats().peak_bytes, backing.held - pool.stats().bytes_cached);
  EXPECT_LE(backing.held, pool.stats().peak_bytes);
  for (void* p : big) pool.free(p, 4 * mb);
  // Same sizes again: all hits, no new memory.
  const size_t held = backing.held;
  const uint64_t hits = pool.stats().reuse_hits;
  for (int i = 0; i < 10; i++) big[i] = pool.alloc(4 * mb);
  EXPECT_EQ(backing.held, held);
  EXPECT_EQ(pool.stats().reuse_hits, hits + 10);
  for (void* p : big) pool.free(p, 4 * mb);
}

TEST(Laziness, NothingRunsUntilNeeded) {
  Tensor x = Tensor::rand({8});
  x.realize();
  auto before = GlobalCounters::get().kernels_run;
  Tensor y = (x * 2.0).exp().sum();
  EXPECT_EQ(GlobalCounters::get().kernels_run, before);
  y.item<float>();
  EXPECT_EQ(GlobalCounters::get().kernels_run, before + 1);
}

// Note [cross-entropy from the target's logit] in tensor_nn.cpp: the loss and its gradient reduce
// over the logits' rows twice (the maximum, the sum of exponentials); the target's logit is
// gathered by the loss's kernel, and the gradient is one elementwise kernel.
TEST(Fusion, CrossEntropyReducesTheLogitsRowsTwice) {
  testutil::KnobScope separate(knobs::ROWFUSE, 0);  // each row statistic a kernel of its own
  Tensor logits = Tensor::randn({64, 40}).realize();
  Tensor labels = Tensor::randint({64}, 0, 40).realize();
  Tensor loss = logits.sparse_categorical_crossentropy(labels);
  Tensor grad = loss.gradients({logits})[0];
  std::vector<std::pair<int64_t, bool>> readers;  // each kernel reading the logits: its output's size, whether it reduces
  for (auto& item : create_schedule({loss.uop(), grad.uop()})) {
    bool reads = false;
    for (size_t b = item.outputs; b < item.buffers.size(); b++) reads |= item.buffers[b]->numel() == 64 * 40;
    if (!reads) continue;
    auto nodes = toposort({item.ast});
    readers.emplace_back(item.buffers[0]->numel(),
                         std::any_of(nodes.begin(), nodes.end(), [](const UOpPtr& n) { return n->op == Op::REDUCE; }));
  }
  std::sort(readers.begin(), readers.end());
  // the loss (the mean over rows, the targets' logits gathered), the maximum and the logsumexp
  // of each row, the gradient (elementwise)
  const std::vector<std::pair<int64_t, bool>> kernels_reading{{1, true}, {64, true}, {64, true}, {64 * 40, false}};
  EXPECT_EQ(readers, kernels_reading);
  // the loss and gradient of the definition: mean over rows of logsumexp - x[label]
  auto x = logits.to_vector<float>();
  auto y = labels.to_vector<int32_t>();
  auto g = grad.to_vector<float>();
  double want = 0;
  for (size_t r = 0; r < 64; r++) {
    double top = -1e30, sum = 0;
    for (size_t c = 0; c < 40; c++) top = std::max(top, double(x[r * 40 + c]));
    for (size_t c = 0; c < 40; c++) sum += std::exp(x[r * 40 + c] - top);
    want += (std::log(sum) + top - x[r * 40 + size_t(y[r])]) / 64;
    for (size_t c = 0; c < 40; c++) {
      double dx = (std::exp(x[r * 40 + c] - top) / sum - (int32_t(c) == y[r])) / 64;
      ASSERT_NEAR(g[r * 40 + c], dx, 1e-6) << "row " << r << " class " << c;
    }
  }
  EXPECT_NEAR(loss.item<float>(), want, 1e-5);
}

// Note [kept convolution outputs]: a later schedule reads a convolution computed by an earlier one.
TEST(Fusion, ConvolutionOutputIsKeptForLaterSchedules) {
  Tensor x = Tensor::rand({2, 3, 6, 6}).realize(), w = Tensor::rand({4, 3, 3, 3}).realize();
  Tensor c = x.conv2d(w);
  Tensor y = c.relu();
  // the convolution, then the activation over its buffer; on the CPU the convolution is the copy
  // of the weights, the channel-last reduce and its NCHW realize point (Note [channel-last convolutions])
  bool channel_last = get_device(default_device()).policy().channels_last_convolutions;
  EXPECT_EQ(kernels({y}), channel_last ? 4u : 2u);
  y.realize();
  EXPECT_TRUE(c.uop()->realized);
  Tensor z = c * 2.0;
  auto items = create_schedule({z.uop()});
  ASSERT_EQ(items.size(), 1u);
  for (auto& n : toposort({items[0].ast})) EXPECT_NE(n->op, Op::REDUCE) << "the convolution ran again";
  auto cv = x.conv2d(w).to_vector<float>(), zv = z.to_vector<float>();
  ASSERT_EQ(cv.size(), zv.size());
  for (size_t i = 0; i < cv.size(); i++) EXPECT_FLOAT_EQ(zv[i], 2 * cv[i]);
}

// Note [a weight gradient reads its input from memory] in tensor_nn.cpp: on channel-last devices
// the activation under a convolution is written once for the weight gradient, whose reduces then
// load it instead of recomputing relu(x + b) for every FMA; the gradient is unchanged.
TEST(Fusion, ConvolutionWeightGradientReadsItsInputFromABuffer) {
  if (!get_device(default_device()).policy().channels_last_convolutions)
    GTEST_SKIP() << "the device keeps NCHW convolutions";
  Tensor x = Tensor::randn({4, 3, 10, 10}).realize(), b = Tensor::randn({1, 3, 1, 1}).realize();
  Tensor w = Tensor::randn({8, 3, 3, 3}).realize().requires_grad_();
  (x + b).relu().conv2d(w).sum().backward();
  Tensor dw = *w.grad();
  EXPECT_EQ(written_buffers(dw, 4 * 3 * 10 * 10, DType::Float32), 1u);
  for (auto& item : create_schedule({dw.uop()})) {
    auto nodes = toposort({item.ast});
    bool reduces = std::any_of(nodes.begin(), nodes.end(), [](const UOpPtr& n) { return n->op == Op::REDUCE; });
    bool relu = std::any_of(nodes.begin(), nodes.end(), [](const UOpPtr& n) { return n->op == Op::MAX; });
    EXPECT_FALSE(reduces && relu) << "a reduce of the weight gradient recomputes the activation";
  }
  Tensor wr = Tensor::from_vector(w.to_vector<float>(), w.shape()).requires_grad_();
  (x + b).relu().realize().conv2d(wr).sum().backward();
  auto got = dw.to_vector<float>(), want = wr.grad()->to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
}

// Note [weight gradient blocks] in tensor_nn.cpp: a channel-last weight gradient sums blocks of as
// many images as half the CPU's L2 holds (inputs and output gradients), one partial sum a block.
TEST(Fusion, ConvolutionWeightGradientBlocksFollowTheL2) {
  // the CNN's 5x5 32->32 layer: 32 x 24 x 24 inputs and 20 x 20 x 32 output gradients an image
  constexpr int64_t image_bytes = (32 * 24 * 24 + 20 * 20 * 32) * 4;
  EXPECT_EQ(weight_gradient_images(512, image_bytes, 1 << 20), 4);  // a 1 MB L2 (the AMD EPYC)
  EXPECT_EQ(weight_gradient_images(512, image_bytes, 2 << 20), 8);  // a 2 MB L2 (the Intel Xeon)
  EXPECT_EQ(weight_gradient_images(6, 200 << 10, 1 << 20), 2) << "a divisor of the batch";
  EXPECT_EQ(weight_gradient_images(512, 1 << 20, 1 << 20), 1) << "an image larger than half the L2";
  Device& dev = get_device(default_device());
  if (!dev.policy().channels_last_convolutions) GTEST_SKIP() << "the device keeps NCHW convolutions";
  constexpr int64_t n = 64;
  Tensor x = Tensor::randn({n, 32, 24, 24}).realize(), r = Tensor::randn({n, 32, 20, 20}).realize();
  Tensor w = Tensor::randn({32, 32, 5, 5}).realize().requires_grad_();
  (x.conv2d(w) * r).sum().backward();
  const int64_t blocks = n / weight_gradient_images(n, image_bytes, dev.policy().cpu.l2_bytes);
  ASSERT_GT(blocks, 1) << "an L2 of " << dev.policy().cpu.l2_bytes << " bytes holds the whole batch";
  EXPECT_EQ(written_buffers(*w.grad(), blocks * 32 * 32 * 5 * 5, DType::Float32), 1u)
      << "one partial sum of the weight for each of " << blocks << " blocks";
}

// Note [conv2d gradient] in tensor_nn.cpp: without gradients (evaluation) a convolution is not a
// kept realize point, and its value is the same.
TEST(Fusion, ConvolutionUnderNoGradIsNotKept) {
  Tensor x = Tensor::rand({2, 3, 6, 6}).realize(), w = Tensor::rand({4, 3, 3, 3}).realize().requires_grad_(true);
  auto with_grad = x.conv2d(w).relu().to_vector<float>();
  NoGradGuard no_grad;
  Tensor c = x.conv2d(w);
  Tensor y = c.relu();
  y.realize();
  for (auto& u : toposort({c.uop()}))
    EXPECT_FALSE(u->op == Op::CUSTOM_GRAD || u->realized) << "an evaluation pass kept the convolution's output";
  auto without = y.to_vector<float>();
  ASSERT_EQ(with_grad.size(), without.size());
  for (size_t i = 0; i < without.size(); i++) EXPECT_NEAR(without[i], with_grad[i], 1e-5f) << i;
}

// Note [intermediates die after their last reader] in engine/realize.cpp: a chain of realize
// points needs the memory of a few links at a time, not of all of them.
TEST(MemoryPool, IntermediatesAreFreedAfterTheirLastReader) {
  constexpr int64_t n = int64_t{1} << 18;  // 1 MiB of float32
  constexpr int links = 8;
  Tensor x = Tensor::rand({n}).realize();
  Tensor y = x;
  for (int i = 0; i < links; i++) y = (y + 1.0).contiguous();
  auto& pool = get_device(default_device()).pool();
  const size_t before = pool.stats().bytes_in_use;
  pool.reset_peak();
  y.realize();
  const size_t link_bytes = n * sizeof(float);
  EXPECT_LE(pool.stats().peak_bytes - before, 3 * link_bytes) << "the schedule held its intermediates";
  auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (int64_t i = 0; i < n; i += 4099) EXPECT_FLOAT_EQ(yv[i], xv[i] + links) << i;
}

// Note [dying inputs in a normal run] in engine/jit_in_place.cpp: a kernel that computes an
// intermediate element by element from one that dies there writes it over that one, so the two
// never take memory at once (as the cross-entropy's gradient over GPT's logits).
TEST(MemoryPool, AnIntermediateIsWrittenOverTheInputThatDiesInItsKernel) {
  constexpr int64_t n = int64_t{1} << 18;  // 1 MiB of float32
  Tensor x = Tensor::rand({n}).realize();
  Tensor a = (x + 1.0).contiguous();
  Tensor total = (a * 2.0).contiguous().sum();
  auto& pool = get_device(default_device()).pool();
  const size_t before = pool.stats().bytes_in_use;
  pool.reset_peak();
  total.realize();
  const size_t link_bytes = n * sizeof(float);
  EXPECT_LT(pool.stats().peak_bytes - before, link_bytes + link_bytes / 2) << "a and 2a were held at once";
  double want = 0;
  for (float v : x.to_vector<float>()) want += 2.0 * (v + 1.0);
  EXPECT_NEAR(total.item<float>(), want, 1e-4 * want);
}

// Note [lowering cache]: the same op on other buffers reuses the lowered kernel, and a kernel
// that reads one buffer twice is not confused with one that reads two.
TEST(LoweringCache, TheSameOpOnOtherBuffersIsLoweredOnce) {
  auto softmax_of = [](const std::vector<float>& v) {
    return Tensor::from_vector(v, {3, 4}).realize().softmax(-1).to_vector<float>();
  };
  std::vector<float> a(12), b(12);
  for (int i = 0; i < 12; i++) a[i] = 0.1f * i, b[i] = 1.0f - 0.3f * i;
  std::vector<float> first = softmax_of(a);
  LoweringCacheStats before = lowering_cache_stats();
  std::vector<float> second = softmax_of(b);
  LoweringCacheStats after = lowering_cache_stats();
  EXPECT_GT(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
  for (int r = 0; r < 3; r++) {
    double total = 0;
    for (int c = 0; c < 4; c++) total += std::exp(b[r * 4 + c]);
    for (int c = 0; c < 4; c++) EXPECT_NEAR(second[r * 4 + c], std::exp(b[r * 4 + c]) / total, 1e-6);
  }
  EXPECT_NE(first, second);

  Tensor x = Tensor::from_vector(a, {12}).realize(), y = Tensor::from_vector(b, {12}).realize();
  std::vector<float> twice = (x + x).to_vector<float>(), both = (x + y).to_vector<float>();
  for (int i = 0; i < 12; i++) {
    EXPECT_FLOAT_EQ(twice[i], 2 * a[i]);
    EXPECT_FLOAT_EQ(both[i], a[i] + b[i]);
  }
}

// Note [concatenations stored in place] in schedule/concat_in_place.cpp: the kernels that compute
// a 1-d concatenation's pieces store them into its buffer, and the pieces no kernel computes here
// (constants, an output of the schedule) are written by one kernel per run of them, at most one.
TEST(Fusion, AConcatenationsPiecesAreStoredInPlace) {
  Tensor a = Tensor::randn({8, 4});
  a.realize();
  const auto av = a.to_vector<float>();
  auto rows = [&] { return a.sum(1); };         // [8]
  auto cols = [&] { return (a * 2.0).max(0); };  // [4]
  std::vector<float> row_sums(8, 0.0f), col_max(4, -1e30f);
  for (size_t i = 0; i < 8; i++)
    for (size_t j = 0; j < 4; j++) {
      row_sums[i] += av[i * 4 + j];
      col_max[j] = std::max(col_max[j], 2.0f * av[i * 4 + j]);
    }
  auto expect_pieces = [](const Tensor& c, const std::vector<std::vector<float>>& parts) {
    std::vector<float> want;
    for (auto& p : parts) want.insert(want.end(), p.begin(), p.end());
    auto got = c.to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-5) << "element " << i;
  };
  // both pieces computed in place: the two reduces and no concatenation kernel
  Tensor both = Tensor::cat({rows(), cols()}, 0);
  EXPECT_EQ(kernels({both}), 2u);
  expect_pieces(both, {row_sums, col_max});
  // a constant piece after them: one kernel writes it
  Tensor padded = Tensor::cat({rows(), cols(), Tensor::zeros({3})}, 0);
  EXPECT_EQ(kernels({padded}), 3u);
  expect_pieces(padded, {row_sums, col_max, {0, 0, 0}});
  // two runs of constants would take two kernels: one concatenation kernel instead
  Tensor gaps = Tensor::cat({rows(), Tensor::zeros({3}), cols(), Tensor::ones({2})}, 0);
  EXPECT_EQ(kernels({gaps}), 3u);
  expect_pieces(gaps, {row_sums, {0, 0, 0}, col_max, {1, 1}});
  // a piece that is an output keeps its own buffer and is copied (another order: nodes are
  // shared, and `both` is realized)
  Tensor r = rows(), c = Tensor::cat({cols(), r}, 0);
  EXPECT_EQ(kernels({c, r}), 3u);
  Tensor::realize_all({c, r});
  expect_pieces(c, {col_max, row_sums});
  expect_pieces(r, {row_sums});
}

// Note [reducing kernels run early] in schedule/memory_order.cpp: gradients listed first layer
// first. The walk from the first layer's gradient runs the whole backward pass, so without the
// rule the last layer's weight gradient came last and kept its operands alive to the end; with it,
// each weight gradient runs as soon as its layer's output gradient exists (last layer first), and
// fewer bytes of intermediates are alive at once. The gradients are the same.
TEST(Schedule, WeightGradientsRunAsSoonAsTheirOperandsAreReady) {
  constexpr int LAYERS = 4;
  Tensor x = Tensor::rand({256, 32}).realize();
  Tensors weights;
  for (int i = 0; i < LAYERS; i++) weights.push_back((Tensor::rand({32, 32}) * 0.2).realize());
  Tensor h = x;
  for (auto& w : weights) h = h.matmul(w).relu();
  Tensors grads = h.sum().gradients(weights);
  std::vector<UOpPtr> outs;
  for (auto& g : grads) outs.push_back(g.uop());
  std::vector<std::shared_ptr<Buffer>> out_buffers;
  auto items = create_schedule(outs, &out_buffers);
  auto position_writing = [&](const std::shared_ptr<Buffer>& b) {
    for (size_t i = 0; i < items.size(); i++)
      for (size_t o = 0; o < items[i].outputs; o++)
        if (items[i].buffers[o] == b) return i;
    return items.size();
  };
  for (int i = 0; i + 1 < LAYERS; i++)
    EXPECT_LT(position_writing(out_buffers[size_t(i + 1)]), position_writing(out_buffers[size_t(i)]))
        << "the weight gradient of layer " << i + 1 << " runs after layer " << i << "'s";
  // the most bytes of intermediates alive at once (each from its writer to its last reader)
  std::unordered_map<const Buffer*, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < items.size(); i++)
    for (size_t b = 0; b < items[i].buffers.size(); b++) {
      auto [it, fresh] = life.try_emplace(items[i].buffers[b].get(), i, i);
      if (!fresh) it->second.second = i;
      else if (b >= items[i].outputs) life.erase(it);  // read before any item wrote it: an input
    }
  size_t peak = 0;
  for (size_t i = 0; i < items.size(); i++) {
    size_t live = 0;
    for (auto& [buffer, span] : life)
      if (span.first <= i && i <= span.second) live += buffer->nbytes();
    peak = std::max(peak, live);
  }
  EXPECT_LE(peak, size_t{256} * 32 * 4 * 8);  // 8 activations' bytes (9 in the walk's order)
  Tensors again = h.sum().gradients(weights);
  for (int i = 0; i < LAYERS; i++) {
    auto got = grads[size_t(i)].to_vector<float>(), want = again[size_t(i)].to_vector<float>();
    for (size_t j = 0; j < got.size(); j++) ASSERT_FLOAT_EQ(got[j], want[j]);
  }
}

// The same with the gradients stored into one bucket (Note [concatenations stored in place]), as
// data parallelism has them: each weight gradient's kernel writes its own part of the bucket, and
// writes to disjoint parts of one buffer do not order each other, so they still run last layer
// first, as soon as their operands are ready.
TEST(Schedule, GradientsStoredIntoOneBucketStillRunEarly) {
  constexpr int LAYERS = 4;
  Tensor x = Tensor::rand({256, 32}).realize();
  Tensors weights;
  for (int i = 0; i < LAYERS; i++) weights.push_back((Tensor::rand({32, 32}) * 0.2).realize());
  Tensor h = x;
  for (auto& w : weights) h = h.matmul(w.T()).relu();  // as nn::Linear: its gradient in w's order
  Tensors grads = h.sum().gradients(weights), flat;
  for (auto& g : grads) flat.push_back(g.reshape({32 * 32}));
  Tensor bucket = Tensor::cat(flat, 0);
  std::vector<std::shared_ptr<Buffer>> out_buffers;
  auto items = create_schedule({bucket.uop()}, &out_buffers);
  auto position_writing = [&](size_t offset) {
    for (size_t i = 0; i < items.size(); i++)
      for (size_t o = 0; o < items[i].outputs; o++) {
        const auto& b = items[i].buffers[o];
        if (b->view_base() == out_buffers[0] && b->view_offset() == offset) return i;
      }
    return items.size();
  };
  const size_t piece = 32 * 32 * sizeof(float);
  for (size_t i = 0; i + 1 < LAYERS; i++) {
    ASSERT_LT(position_writing(i * piece), items.size()) << "layer " << i << "'s gradient is computed in place";
    EXPECT_LT(position_writing((i + 1) * piece), position_writing(i * piece))
        << "the weight gradient of layer " << i + 1 << " runs after layer " << i << "'s";
  }
  Tensors again = h.sum().gradients(weights);
  auto got = bucket.to_vector<float>();
  for (size_t i = 0; i < LAYERS; i++) {
    auto want = again[i].to_vector<float>();
    for (size_t j = 0; j < want.size(); j++) ASSERT_FLOAT_EQ(got[i * want.size() + j], want[j]);
  }
}
