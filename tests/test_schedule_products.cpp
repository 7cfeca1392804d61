// How the scheduler lays out the operands of matrix products (schedule/padded_rows.cpp): computed
// operands realized, B copied into panels, padded rows or contiguous rows where the device policy
// says so, for forward products and the products of the backward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "schedule_util.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

using namespace tg;

using testutil::kernels;
using testutil::written_buffers;

// Note [product operands]: on the CPU a computed operand of a matmul gets its own kernel
// instead of being recomputed for every output column; plain operands and reduces without an
// expanded input stay one kernel.
TEST(Fusion, ComputedMatmulOperandIsRealizedOnTheCpu) {
  Tensor a = Tensor::randn({16, 32}).realize(), b = Tensor::randn({32, 24}).realize();
  EXPECT_EQ(kernels({a.matmul(b)}), 1u);
  Tensor r = (a * 2.0).relu().matmul(b);
  EXPECT_EQ(kernels({r}), 2u);
  EXPECT_EQ(kernels({(a * 2.0).relu().sum(1)}), 1u);
  auto av = a.to_vector<float>(), bv = b.to_vector<float>(), rv = r.to_vector<float>();
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 24; j++) {
      double want = 0;
      for (int k = 0; k < 32; k++) want += std::max(0.0f, 2 * av[i * 32 + k]) * bv[k * 24 + j];
      EXPECT_NEAR(rv[i * 24 + j], want, 1e-3) << i << "," << j;
    }
}

// Note [padded B rows] in schedule/padded_rows.cpp: a large B whose rows are a multiple of 1 KB is
// copied first on the CPU (one kernel more: panels of the tile's width for float32, Note [B
// panels]), and the product reads a view of the copy.
TEST(Fusion, LargeMatmulReadsBFromPaddedRowsOnTheCpu) {
  Tensor a = Tensor::randn({8, 256}).realize(), b = Tensor::randn({256, 512}).realize();  // B: 512 KB
  Tensor c = Tensor::randn({256, 520}).realize(), w = Tensor::randn({512, 256}).realize();
  EXPECT_EQ(kernels({a.matmul(b)}), 2u);
  EXPECT_EQ(kernels({a.matmul(c)}), 1u);          // rows of 2080 bytes: no aliasing
  EXPECT_EQ(kernels({a.matmul(w.T())}), 1u);      // strided columns (a Linear's weight): no rows to pad
  EXPECT_EQ(kernels({a.matmul(b.T().T())}), 2u);  // permutes compose
  EXPECT_EQ(kernels({b.T().matmul(b)}), 2u);      // a transposed A is read as it is
  auto av = a.to_vector<float>(), bv = b.to_vector<float>(), rv = a.matmul(b).to_vector<float>();
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 512; j += 7) {
      double want = 0;
      for (int k = 0; k < 256; k++) want += static_cast<double>(av[i * 256 + k]) * bv[k * 512 + j];
      EXPECT_NEAR(rv[i * 512 + j], want, 1e-3) << i << "," << j;
    }
}

// Note [the matmul form] in schedule/padded_rows.cpp: the scheduler relays a matmul's B out in its
// own type, only where the device policy says so: float32 into panels of the tile's width (Note
// [B panels]: as many elements), bfloat16 into rows padded by one cache line (32 columns more); a
// batched B reads its own as it is, and so do small products of the backward pass (Note
// [gradient products]: the x @ w below has too few rows for panels of a B that does not alias).
TEST(Fusion, SchedulerPadsTheRowsOfAMatmulsB) {
  if (!get_device(default_device()).policy().pad_aliasing_rows) GTEST_SKIP() << "the device keeps B's layout";
  Tensor a = Tensor::randn({8, 256}).realize(), b = Tensor::randn({256, 512}).realize();
  EXPECT_EQ(written_buffers(a.matmul(b), 256 * 512, DType::Float32), 1u);
  EXPECT_EQ(written_buffers(a.matmul(b), 256 * 528, DType::Float32), 0u);
  Tensor ah = Tensor::randn({8, 512}, {.dtype = DType::BFloat16}).realize();
  Tensor bh = Tensor::randn({512, 512}, {.dtype = DType::BFloat16}).realize();
  EXPECT_EQ(written_buffers(ah.matmul(bh), 512 * 544, DType::BFloat16), 1u);
  Tensor bb = Tensor::randn({2, 256, 512}).realize();
  EXPECT_EQ(kernels({a.reshape({1, 8, 256}).expand({2, 8, 256}).matmul(bb)}), 1u);
  Tensor x = Tensor::randn({8, 256}).realize().requires_grad_(), w = Tensor::randn({256, 512}).realize().requires_grad_();
  Tensor y = x.matmul(w);
  y.sum().backward();
  EXPECT_EQ(written_buffers(*x.grad(), 256 * 528, DType::Float32), 0u);
  EXPECT_EQ(written_buffers(*w.grad(), 256 * 528, DType::Float32), 0u);
  auto wv = w.to_vector<float>(), gv = x.grad()->to_vector<float>();
  for (int k = 0; k < 256; k += 5) {  // d sum(x @ w) / dx[i, k] = sum over j of w[k, j]
    double want = 0;
    for (int j = 0; j < 512; j++) want += wv[k * 512 + j];
    EXPECT_NEAR(gv[k], want, 1e-3) << k;
  }
  auto hv = ah.matmul(bh).cast(DType::Float32).to_vector<float>();
  auto ahv = ah.cast(DType::Float32).to_vector<float>(), bhv = bh.cast(DType::Float32).to_vector<float>();
  for (int j = 0; j < 512; j += 11) {
    double want = 0;
    for (int k = 0; k < 512; k++) want += static_cast<double>(ahv[k]) * bhv[k * 512 + j];
    EXPECT_NEAR(hv[j], want, 0.02 * (1 + std::abs(want))) << j;
  }
}

// Note [gradient products] in schedule/padded_rows.cpp: a Linear's weight gradient (the sum over
// the batch of dY[b, o] x[b, i]) reads the layer's input as its B: a large one is copied into
// panels first on the CPU, whether the input is a [batch, 784] matrix or a batch of images
// flattened, and the gradient is the same sum.
TEST(Fusion, WeightGradientsReadTheLayersInputFromPanels) {
  if (!get_device(default_device()).policy().pad_aliasing_rows) GTEST_SKIP() << "the device keeps B's layout";
  Tensor images = Tensor::randn({512, 1, 28, 28}).realize();
  for (const Tensor& x : {images.reshape({512, 784}).contiguous().realize(), images.reshape({512, 784})}) {
    Tensor w = Tensor::randn({256, 784}).realize().requires_grad_();
    x.matmul(w.T()).sum().backward();
    EXPECT_EQ(written_buffers(*w.grad(), 512 * 784, DType::Float32), 1u);  // the panels of x
    auto xv = x.to_vector<float>(), gv = w.grad()->to_vector<float>();
    for (int i = 0; i < 784; i += 13) {  // d sum(x @ w^T) / dw[o, i] = sum over b of x[b, i], for every o
      double want = 0;
      for (int b = 0; b < 512; b++) want += xv[b * 784 + i];
      EXPECT_NEAR(gv[i], want, 1e-3) << i;
      EXPECT_NEAR(gv[255 * 784 + i], want, 1e-3) << i;
    }
  }
}

// Note [transposed B]: a Linear's x @ W^T reads W^T from a contiguous copy on the CPU (one more
// kernel), except for a single row of x; the result is the same product.
TEST(Fusion, ATransposedBIsCopiedIntoRowsForManyRowsOfA) {
  if (!get_device(default_device()).policy().copy_transposed_b) GTEST_SKIP() << "the device keeps B's layout";
  Tensor x = Tensor::randn({64, 96}).realize(), w = Tensor::randn({40, 96}).realize();
  EXPECT_EQ(written_buffers(x.matmul(w.T()), 96 * 40, DType::Float32), 1u);
  EXPECT_EQ(kernels({x.matmul(w.T())}), 2u);
  Tensor one = x.shrink({{0, 1}, {0, 96}});
  EXPECT_EQ(kernels({one.matmul(w.T())}), 1u);
  auto got = x.matmul(w.T()).to_vector<float>(), xv = x.to_vector<float>(), wv = w.to_vector<float>();
  for (int i = 0; i < 64; i += 7)
    for (int j = 0; j < 40; j += 3) {
      double want = 0;
      for (int k = 0; k < 96; k++) want += static_cast<double>(xv[i * 96 + k]) * wv[j * 96 + k];
      EXPECT_NEAR(got[i * 40 + j], want, 1e-3 * (1 + std::abs(want)));
    }
}

// Note [products above products] in schedule/padded_rows.cpp: in a two-layer MLP each Linear's B
// is copied once and each product is one kernel; the second product reads the first one's
// output as computed with the copy, not a second, strided computation of it.
TEST(Fusion, EveryLinearOfAnMlpReadsItsCopiedB) {
  if (!get_device(default_device()).policy().copy_transposed_b) GTEST_SKIP() << "the device keeps B's layout";
  Tensor x = Tensor::randn({2, 32, 96}).realize(), w1 = Tensor::randn({80, 96}).realize();
  Tensor w2 = Tensor::randn({40, 80}).realize();
  Tensor y = (x.matmul(w1.T()) * 2.0).matmul(w2.T());
  EXPECT_EQ(written_buffers(y, 96 * 80, DType::Float32), 1u);
  EXPECT_EQ(written_buffers(y, 80 * 40, DType::Float32), 1u);
  EXPECT_EQ(kernels({y}), 4u);  // two copies, two products
  auto got = y.to_vector<float>(), xv = x.to_vector<float>(), w1v = w1.to_vector<float>(), w2v = w2.to_vector<float>();
  for (int i = 0; i < 64; i += 9) {
    std::vector<double> h(80);
    for (int j = 0; j < 80; j++)
      for (int k = 0; k < 96; k++) h[j] += 2.0 * xv[i * 96 + k] * w1v[j * 96 + k];
    for (int o = 0; o < 40; o += 7) {
      double want = 0;
      for (int j = 0; j < 80; j++) want += h[j] * w2v[o * 80 + j];
      EXPECT_NEAR(got[i * 40 + o], want, 1e-3 * (1 + std::abs(want)));
    }
  }
}

// Note [transposed B]: attention's scores q @ k^T read k^T (a batched B) from a copy when each
// batch has at least 32 rows of q, and as it is for one row (a decoding step).
TEST(Fusion, AttentionScoresReadACopiedKTranspose) {
  if (!get_device(default_device()).policy().copy_transposed_b) GTEST_SKIP() << "the device keeps B's layout";
  Tensor q = Tensor::randn({2, 3, 64, 16}).realize(), k = Tensor::randn({2, 3, 64, 16}).realize();
  Tensor scores = q.matmul(k.transpose(-2, -1));
  EXPECT_EQ(written_buffers(scores, 2 * 3 * 16 * 64, DType::Float32), 1u);
  EXPECT_EQ(kernels({scores}), 2u);
  Tensor one = q.shrink({{0, 2}, {0, 3}, {63, 64}, {0, 16}});
  EXPECT_EQ(kernels({one.matmul(k.transpose(-2, -1))}), 1u);
  auto got = scores.to_vector<float>(), qv = q.to_vector<float>(), kv = k.to_vector<float>();
  for (int bh = 0; bh < 6; bh++)
    for (int i = 0; i < 64; i += 5)
      for (int j = 0; j < 64; j += 11) {
        double want = 0;
        for (int d = 0; d < 16; d++) want += static_cast<double>(qv[(bh * 64 + i) * 16 + d]) * kv[(bh * 64 + j) * 16 + d];
        EXPECT_NEAR(got[(bh * 64 + i) * 64 + j], want, 1e-3 * (1 + std::abs(want)));
      }
}

// Note [gradient products]: attention's dP = dO @ V^T, autograd's sum over the forward product's
// m axis, reads V^T through a copy; a Linear's input gradient dY @ W reads W's contiguous rows as
// they are.
TEST(Fusion, GradientProductsCopyOnlyAStridedB) {
  if (!get_device(default_device()).policy().copy_transposed_b) GTEST_SKIP() << "the device keeps B's layout";
  Tensor p = Tensor::randn({2, 3, 64, 48}).realize().requires_grad_(), v = Tensor::randn({2, 3, 48, 16}).realize();
  Tensor g = Tensor::randn({2, 3, 64, 16}).realize();
  (p.matmul(v) * g).sum().backward();
  Tensor dp = *p.grad();
  EXPECT_EQ(written_buffers(dp, 2 * 3 * 16 * 48, DType::Float32), 1u);  // V^T's copy
  auto got = dp.to_vector<float>(), gv = g.to_vector<float>(), vv = v.to_vector<float>();
  for (int bh = 0; bh < 6; bh++)
    for (int i = 0; i < 64; i += 7)
      for (int j = 0; j < 48; j += 5) {
        double want = 0;
        for (int d = 0; d < 16; d++) want += static_cast<double>(gv[(bh * 64 + i) * 16 + d]) * vv[(bh * 48 + j) * 16 + d];
        EXPECT_NEAR(got[(bh * 64 + i) * 48 + j], want, 1e-3 * (1 + std::abs(want)));
      }
  Tensor x = Tensor::randn({64, 96}).realize().requires_grad_(), w = Tensor::randn({40, 96}).realize();
  Tensor gy = Tensor::randn({64, 40}).realize();
  (x.matmul(w.T()) * gy).sum().backward();
  EXPECT_EQ(written_buffers(*x.grad(), 40 * 96, DType::Float32), 0u);  // dY @ W: W's rows are contiguous, no copy
}
