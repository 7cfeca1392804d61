// Backend op tests, part 4: linear algebra and neural-network compositions: matmul (batched,
// broadcast, 1-D cases), linear, conv2d (stride, padding, dilation, groups, bias), max_pool2d,
// avg_pool2d, layernorm, the losses, one_hot, dropout, and float16/bfloat16 versions. Forward
// and backward, each against the float64 reference interpreter on the same lazy graph, plus
// hand-checked values.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_util.h"
#include "test_util.h"

using namespace tg;
using namespace tg::testutil;

namespace {
using V = std::vector<float>;
using D = std::vector<double>;
Tensor vec(std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); }

void expect_near_all(const D& got, const D& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "at " << i;
}

// ---- the host's versions, written from the definitions (independent of the engine) ----

// numpy matmul: 1-D operands get a dim added and removed, batch dims broadcast.
D host_matmul(const D& a, Shape sa, const D& b, Shape sb) {
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), nb - ba.size(), 1);
  bb.insert(bb.begin(), nb - bb.size(), 1);
  Shape bo(nb);
  for (size_t i = 0; i < nb; i++) bo[i] = std::max(ba[i], bb[i]);
  D out;
  for (int64_t flat = 0; flat < prod(bo); flat++) {
    int64_t oa = 0, ob = 0, rem = flat, sta = 1, stb = 1;
    for (size_t i = nb; i-- > 0;) {
      int64_t idx = rem % bo[i];
      rem /= bo[i];
      oa += (ba[i] == 1 ? 0 : idx) * sta, sta *= ba[i];
      ob += (bb[i] == 1 ? 0 : idx) * stb, stb *= bb[i];
    }
    for (int64_t r = 0; r < n; r++)
      for (int64_t c = 0; c < m; c++) {
        double acc = 0;
        for (int64_t t = 0; t < k; t++) acc += a[(oa * n + r) * k + t] * b[(ob * k + t) * m + c];
        out.push_back(acc);
      }
  }
  return out;
}

std::vector<int64_t> two(const std::vector<int64_t>& v) { return v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v; }

D host_conv2d(const D& x, const Shape& xs, const D& w, const Shape& ws, const D* bias, std::vector<int64_t> st,
              std::vector<int64_t> pd, std::vector<int64_t> dl, int64_t groups) {
  st = two(st), pd = two(pd), dl = two(dl);
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], CO = ws[0], CG = ws[1], KH = ws[2], KW = ws[3];
  int64_t OH = (H + 2 * pd[0] - dl[0] * (KH - 1) - 1) / st[0] + 1, OW = (W + 2 * pd[1] - dl[1] * (KW - 1) - 1) / st[1] + 1;
  D out;
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < CO; co++)
      for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
          double acc = bias ? (*bias)[co] : 0;
          int64_t g = co / (CO / groups);
          for (int64_t ci = 0; ci < CG; ci++)
            for (int64_t ky = 0; ky < KH; ky++)
              for (int64_t kx = 0; kx < KW; kx++) {
                int64_t iy = oy * st[0] - pd[0] + ky * dl[0], ix = ox * st[1] - pd[1] + kx * dl[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                acc += x[((n * C + g * CG + ci) * H + iy) * W + ix] * w[((co * CG + ci) * KH + ky) * KW + kx];
              }
          out.push_back(acc);
        }
  (void)C;
  return out;
}

// Gradients of sum(conv2d(x, w) * gout) with respect to x and w, scattered from the definition.
std::pair<D, D> host_conv2d_grad(const D& x, const Shape& xs, const D& w, const Shape& ws, const D& gout,
                                 std::vector<int64_t> st, std::vector<int64_t> pd, std::vector<int64_t> dl,
                                 int64_t groups) {
  st = two(st), pd = two(pd), dl = two(dl);
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], CO = ws[0], CG = ws[1], KH = ws[2], KW = ws[3];
  int64_t OH = (H + 2 * pd[0] - dl[0] * (KH - 1) - 1) / st[0] + 1, OW = (W + 2 * pd[1] - dl[1] * (KW - 1) - 1) / st[1] + 1;
  D dx(x.size(), 0.0), dw(w.size(), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < CO; co++)
      for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
          double g = gout[((n * CO + co) * OH + oy) * OW + ox];
          int64_t grp = co / (CO / groups);
          for (int64_t ci = 0; ci < CG; ci++)
            for (int64_t ky = 0; ky < KH; ky++)
              for (int64_t kx = 0; kx < KW; kx++) {
                int64_t iy = oy * st[0] - pd[0] + ky * dl[0], ix = ox * st[1] - pd[1] + kx * dl[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                size_t xi = static_cast<size_t>(((n * C + grp * CG + ci) * H + iy) * W + ix);
                size_t wi = static_cast<size_t>(((co * CG + ci) * KH + ky) * KW + kx);
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
  return {dx, dw};
}

// Pooling over the last two dims; max pads with -inf, avg pads with zeros and divides by k*k.
D host_pool(const D& x, const Shape& xs, std::vector<int64_t> k, std::vector<int64_t> st, std::vector<int64_t> pd,
            std::vector<int64_t> dl, bool max) {
  k = two(k), st = st.empty() ? k : two(st), pd = two(pd), dl = two(dl);
  int64_t H = xs[xs.size() - 2], W = xs.back(), lead = prod(xs) / (H * W);
  int64_t OH = (H + 2 * pd[0] - dl[0] * (k[0] - 1) - 1) / st[0] + 1, OW = (W + 2 * pd[1] - dl[1] * (k[1] - 1) - 1) / st[1] + 1;
  D out;
  for (int64_t l = 0; l < lead; l++)
    for (int64_t oy = 0; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++) {
        double acc = max ? -INFINITY : 0;
        for (int64_t ky = 0; ky < k[0]; ky++)
          for (int64_t kx = 0; kx < k[1]; kx++) {
            int64_t iy = oy * st[0] - pd[0] + ky * dl[0], ix = ox * st[1] - pd[1] + kx * dl[1];
            double v = (iy < 0 || iy >= H || ix < 0 || ix >= W) ? (max ? -INFINITY : 0) : x[(l * H + iy) * W + ix];
            acc = max ? std::max(acc, v) : acc + v;
          }
        out.push_back(max ? acc : acc / static_cast<double>(k[0] * k[1]));
      }
  return out;
}
}  // namespace

// ---- matmul ----

using MatmulShapes = std::pair<Shape, Shape>;
class Matmul : public ::testing::TestWithParam<MatmulShapes> {};

TEST_P(Matmul, Float32) {
  auto& [sa, sb] = GetParam();
  Tensor a = rnd(sa, 81), b = rnd(sb, 82);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].matmul(in[1]); }, {a, b}));
  expect_near_all(a.matmul(b).to_vector<double>(), host_matmul(a.to_vector<double>(), sa, b.to_vector<double>(), sb));
}

INSTANTIATE_TEST_SUITE_P(Ops, Matmul,
                         ::testing::Values(MatmulShapes{{3, 4}, {4, 5}},        // 2-D
                                           MatmulShapes{{2, 3, 4}, {2, 4, 2}},  // batched
                                           MatmulShapes{{2, 3, 4}, {4, 3}},     // broadcast batch
                                           MatmulShapes{{3, 4}, {2, 4, 2}},     // broadcast batch (left)
                                           MatmulShapes{{4}, {4, 3}},           // 1-D x 2-D
                                           MatmulShapes{{3, 4}, {4}},           // 2-D x 1-D
                                           MatmulShapes{{5}, {5}},              // dot
                                           MatmulShapes{{2, 1, 3}, {3, 1}}));   // size-1 dims

TEST(Ops, MatmulMore) {
  Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3}), b = vec({1, 0, -1, 2, 0.5f, 1}, {3, 2});
  EXPECT_EQ(a.matmul(b).to_vector<float>(), (V{0.5, 7, 2, 16}));
  EXPECT_EQ(a.matmul(vec({1, 1, 1}, {3})).to_vector<float>(), (V{6, 15}));
  EXPECT_EQ(vec({1, 2, 3}, {3}).dot(vec({4, 5, 6}, {3})).shape(), Shape{});
  EXPECT_EQ(vec({1, 2, 3}, {3}).dot(vec({4, 5, 6}, {3})).item<float>(), 32);
  Tensor i = rnd_int({3, 4}, 83, -5, 5), j = rnd_int({4, 2}, 84, -5, 5);
  EXPECT_TRUE(match_all({i.matmul(j), i.matmul(rnd({4, 2}, 85)), a.T().matmul(a), a.matmul(a.T().flip({0}))}));
  EXPECT_EQ(i.matmul(j).dtype(), DType::Int32);
  // linear: x @ W.T + b, with gradients for all three
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].linear(in[1], in[2]); },
                            {rnd({2, 5}, 86), rnd({3, 5}, 87), rnd({3}, 88)}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].linear(in[1]).relu().matmul(in[1]); },
                            {rnd({4, 3}, 89), rnd({2, 3}, 90)}));
  // non-contiguous operands
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].T().matmul(in[1].flip({0})[{Slice{0, 4}}]); },
                            {rnd({4, 2}, 91), rnd({5, 3}, 92)}));
}

TEST(Ops, MatmulHalfTypes) {
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].matmul(in[1]); },
                            {rnd({3, 8}, 93, -1, 1, DType::Float16), rnd({8, 2}, 94, -1, 1, DType::Float16)},
                            Tol{1e-2, 1e-2}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].matmul(in[1]); },
                            {rnd({3, 8}, 95, -1, 1, DType::BFloat16), rnd({8, 2}, 96, -1, 1, DType::BFloat16)},
                            Tol{5e-2, 5e-2}));
  Tensor h = rnd({2, 3}, 97, -1, 1, DType::Float16);
  EXPECT_EQ(h.matmul(rnd({3, 2}, 98)).dtype(), DType::Float32);
  EXPECT_TRUE(match(h.matmul(rnd({3, 2}, 98)), Tol{1e-2, 1e-2}));
}

// ---- conv2d ----

struct ConvCase {
  const char* name;
  Shape x, w;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }

class Conv2d : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2d, Float32) {
  auto& c = GetParam();
  Tensors in{rnd(c.x, 101), rnd(c.w, 102, -1, 1)};
  if (c.bias) in.push_back(rnd({c.w[0]}, 103));
  auto f = [&](const Tensors& t) {
    std::optional<Tensor> b;
    if (c.bias) b = t[2];
    return t[0].conv2d(t[1], b, c.stride, c.padding, c.dilation, c.groups);
  };
  EXPECT_TRUE(check_fwd_bwd(f, in));
  D bias = c.bias ? in[2].to_vector<double>() : D{};
  expect_near_all(f(in).to_vector<double>(), host_conv2d(in[0].to_vector<double>(), c.x, in[1].to_vector<double>(), c.w,
                                                         c.bias ? &bias : nullptr, c.stride, c.padding, c.dilation, c.groups));
}

// The gradients (conv2d's own rule, Note [conv2d gradient]) against the host's scatter.
TEST_P(Conv2d, GradientMatchesDefinition) {
  auto& c = GetParam();
  Tensor x = rnd(c.x, 111), w = rnd(c.w, 112, -1, 1);
  x.requires_grad_(true);
  w.requires_grad_(true);
  Tensor out = x.conv2d(w, std::nullopt, c.stride, c.padding, c.dilation, c.groups);
  Tensor gout = rnd(out.shape(), 113);
  Tensors g = (out * gout).sum().gradients({x, w});
  auto [dx, dw] = host_conv2d_grad(x.to_vector<double>(), c.x, w.to_vector<double>(), c.w, gout.to_vector<double>(),
                                   c.stride, c.padding, c.dilation, c.groups);
  expect_near_all(g[0].to_vector<double>(), dx);
  expect_near_all(g[1].to_vector<double>(), dw);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, Conv2d,
    ::testing::Values(ConvCase{"basic", {2, 3, 5, 5}, {4, 3, 3, 3}, {1}, {0}, {1}, 1, false},
                      ConvCase{"bias", {1, 2, 4, 4}, {3, 2, 2, 2}, {1}, {0}, {1}, 1, true},
                      ConvCase{"stride2", {1, 2, 7, 7}, {2, 2, 3, 3}, {2}, {0}, {1}, 1, false},
                      ConvCase{"padding1", {2, 2, 4, 4}, {3, 2, 3, 3}, {1}, {1}, {1}, 1, true},
                      ConvCase{"dilation2", {1, 2, 7, 6}, {2, 2, 3, 2}, {1}, {0}, {2}, 1, false},
                      ConvCase{"groups2", {1, 4, 5, 5}, {6, 2, 3, 3}, {1}, {1}, {1}, 2, false},
                      ConvCase{"depthwise", {1, 3, 5, 5}, {3, 1, 3, 3}, {1}, {0}, {1}, 3, true},
                      ConvCase{"per_dim", {1, 2, 7, 6}, {2, 2, 3, 2}, {2, 1}, {1, 0}, {1, 2}, 1, false},
                      ConvCase{"all", {2, 4, 8, 8}, {4, 2, 3, 3}, {2}, {2}, {2}, 2, true},
                      ConvCase{"1x1", {2, 3, 3, 3}, {5, 3, 1, 1}, {1}, {0}, {1}, 1, true},
                      // stride that leaves rows and columns over, uneven everything
                      ConvCase{"stride3_leftover", {2, 3, 9, 7}, {4, 3, 3, 2}, {3, 2}, {2, 1}, {1, 2}, 1, false},
                      // padding wider than the kernel reach: the input gradient crops
                      ConvCase{"pad_wide", {1, 2, 4, 5}, {3, 2, 2, 3}, {1, 2}, {3, 2}, {1}, 1, true},
                      ConvCase{"groups_stride_dilation", {2, 6, 9, 8}, {9, 2, 3, 2}, {2, 3}, {1, 2}, {2, 1}, 3, false}),
    [](const auto& info) { return std::string(info.param.name); });

// Shapes that take the GPU layouts (Note [gpu register tiles] in codegen/opt_gpu.cpp, Note
// [grouped reduction] in codegen/gpu_dims.cpp) while the reference stays cheap: 2^18 outputs of
// one input channel get a 4 x 4 register tile and their weight gradient is a grouped reduction
// over 2^16 elements; an odd width over 8 input channels has a weight gradient grouped over
// 4224 elements (128 threads) with the 3x3 taps as lanes; 8 output channels of 2^15 pixels get a
// 4 x 8 tile, and 32 x 16 channels over 33 x 32 outputs a weight gradient whose lanes are the
// taps of 4 output channels. The absolute tolerance is the float32 sums': the first shape's
// weight gradient adds 2^16 products of up to 3 into entries of up to about 300, and one entry
// that cancels to -0.026 came out 1.3e-3 off in float32 on the 2-core AMD EPYC Zen 5 (its
// float64 run on the device matched the reference to 8 digits); a wrong index moves an entry by
// a whole product, about 1.
TEST(Ops, Conv2dAtGpuLayoutShapes) {
  for (auto [xs, ws] : {std::pair<Shape, Shape>{{16, 1, 66, 66}, {4, 1, 3, 3}},
                        {{4, 8, 34, 35}, {16, 8, 3, 3}},
                        {{2, 1, 130, 130}, {8, 1, 3, 3}},
                        {{4, 16, 35, 34}, {32, 16, 3, 3}}}) {
    auto f = [](const Tensors& t) { return t[0].conv2d(t[1], t[2]); };
    EXPECT_TRUE(check_fwd_bwd(f, {rnd(xs, 121), rnd(ws, 122, -1, 1), rnd({ws[0]}, 123)}, Tol{1e-3, 5e-3})) << shape_str(xs);
  }
}

TEST(Ops, Conv2dHandChecked) {
  Tensor x = vec({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = vec({1, 0, 0, -1}, {1, 1, 2, 2});  // x[i,j] - x[i+1,j+1]
  EXPECT_EQ(x.conv2d(w).to_vector<float>(), (V{-4, -4, -4, -4}));
  EXPECT_EQ(x.conv2d(Tensor::ones({1, 1, 3, 3}), std::nullopt, {1}, {1}).to_vector<float>(),
            (V{12, 21, 16, 27, 45, 33, 24, 39, 28}));
  EXPECT_EQ(x.conv2d(Tensor::ones({1, 1, 2, 2}), std::nullopt, {1}, {0}, {2}).to_vector<float>(), (V{20}));
  EXPECT_EQ(x.conv2d(Tensor::ones({1, 1, 1, 1}), vec({10}, {1}), {2}).to_vector<float>(), (V{11, 13, 17, 19}));
  Tensor w2 = vec({1, 2}, {2, 1, 1, 1});  // groups=2 on two channels: scale each
  Tensor x2 = Tensor::cat({x, x}, 1);
  auto g = x2.conv2d(w2, std::nullopt, {1}, {0}, {1}, 2).to_vector<float>();
  EXPECT_EQ(g[0], 1);
  EXPECT_EQ(g[9], 2);
  EXPECT_EQ(g[17], 18);
}

TEST(Ops, Conv2dHalfTypes) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tol tol = dt == DType::Float16 ? Tol{1e-2, 2e-2} : Tol{5e-2, 1e-1};
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].conv2d(in[1], in[2], {1}, {1}); },
                              {rnd({1, 2, 4, 4}, 104, -1, 1, dt), rnd({2, 2, 3, 3}, 105, -1, 1, dt), rnd({2}, 106, -1, 1, dt)},
                              tol))
        << dtype_name(dt);
  }
}

// ---- pooling ----

struct PoolCase {
  const char* name;
  Shape x;
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool max;
};
void PrintTo(const PoolCase& c, std::ostream* os) { *os << c.name; }

class Pool2d : public ::testing::TestWithParam<PoolCase> {};

TEST_P(Pool2d, Float32) {
  auto& c = GetParam();
  auto f = [&](const Tensors& t) {
    return c.max ? t[0].max_pool2d(c.kernel, c.stride, c.padding, c.dilation) : t[0].avg_pool2d(c.kernel, c.stride, c.padding);
  };
  Tensor x = distinct(c.x, 107);
  EXPECT_TRUE(check_fwd_bwd(f, {x}));
  expect_near_all(f({x}).to_vector<double>(), host_pool(x.to_vector<double>(), c.x, c.kernel, c.stride, c.padding, c.dilation, c.max));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, Pool2d,
    ::testing::Values(PoolCase{"max_k2", {2, 2, 4, 4}, {2}, {}, {0}, {1}, true},
                      PoolCase{"max_k3_s1", {1, 2, 5, 5}, {3}, {1}, {0}, {1}, true},
                      PoolCase{"max_k3_s2_p1", {1, 2, 6, 6}, {3}, {2}, {1}, {1}, true},
                      PoolCase{"max_dilation2", {1, 1, 6, 7}, {2}, {1}, {0}, {2}, true},
                      PoolCase{"max_rect", {1, 2, 5, 6}, {2, 3}, {1, 2}, {1, 0}, {1}, true},
                      PoolCase{"max_3d_input", {2, 5, 5}, {2}, {}, {0}, {1}, true},
                      PoolCase{"avg_k2", {2, 2, 4, 4}, {2}, {}, {0}, {1}, false},
                      PoolCase{"avg_k3_s1", {1, 2, 5, 5}, {3}, {1}, {0}, {1}, false},
                      PoolCase{"avg_k2_p1", {1, 1, 5, 5}, {2}, {2}, {1}, {1}, false},
                      PoolCase{"avg_rect", {1, 2, 6, 5}, {3, 2}, {2, 1}, {0}, {1}, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Ops, PoolHandChecked) {
  Tensor x = Tensor::arange(0, 16, 1).reshape({1, 1, 4, 4});
  EXPECT_EQ(x.max_pool2d({2}).to_vector<float>(), (V{5, 7, 13, 15}));
  EXPECT_EQ(x.avg_pool2d({2}).to_vector<float>(), (V{2.5, 4.5, 10.5, 12.5}));
  EXPECT_EQ(x.max_pool2d({3}, {1}).to_vector<float>(), (V{10, 11, 14, 15}));
  EXPECT_EQ(x.max_pool2d({2}, {2}, {1}).to_vector<float>(), (V{0, 2, 3, 8, 10, 11, 12, 14, 15}));
  EXPECT_EQ(x.max_pool2d({2}, {1}, {0}, {3}).to_vector<float>(), (V{15}));
  // avg pool with padding counts the zero padding (as tinygrad's default)
  EXPECT_EQ(x.avg_pool2d({2}, {2}, {1}).to_vector<float>()[0], 0);
  EXPECT_EQ(x.avg_pool2d({2}, {2}, {1}).to_vector<float>()[4], (5 + 6 + 9 + 10) / 4.0f);
  Tensor xi = x.cast(DType::Int32), xh = x.cast(DType::Float16);
  EXPECT_TRUE(match_all({xi.max_pool2d({2}, {1}, {1}), xh.max_pool2d({3}, {1}), xh.avg_pool2d({2}),
                         x.cast(DType::BFloat16).max_pool2d({2})}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].max_pool2d({2}, {1}); }, {xh}));
}

// ---- normalisation, losses and friends ----

TEST(Ops, Layernorm) {
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm(); }, {rnd({3, 8}, 111)}, Tol{1e-4, 1e-4}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm({-2, -1}); }, {rnd({2, 3, 4}, 112)}, Tol{1e-4, 1e-4}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm({0}, 1e-2); }, {rnd({5, 2}, 113)}, Tol{1e-4, 1e-4}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm() * in[1] + in[2]; },
                            {rnd({4, 6}, 114), rnd({6}, 115), rnd({6}, 116)}, Tol{1e-4, 1e-4}));
  auto y = vec({1, 2, 3, 4}, {1, 4}).layernorm({-1}, 0).to_vector<double>();
  double s = std::sqrt(1.25);
  EXPECT_NEAR(y[0], -1.5 / s, 1e-5);
  EXPECT_NEAR(y[3], 1.5 / s, 1e-5);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm(); }, {rnd({2, 16}, 117, -2, 2, DType::Float16)},
                            Tol{2e-2, 2e-2}));
}

// Note [attention as a composition] in tensor_attention.cpp: forward and backward against the
// float64 reference, a hand-checked causal case, half inputs, and bad input named.
TEST(Ops, ScaledDotProductAttention) {
  auto attn = [](bool causal) {
    return [causal](const Tensors& in) { return in[0].scaled_dot_product_attention(in[1], in[2], causal); };
  };
  EXPECT_TRUE(check_fwd_bwd(attn(false), {rnd({2, 3, 5, 4}, 141), rnd({2, 3, 6, 4}, 142), rnd({2, 3, 6, 3}, 143)},
                            Tol{1e-4, 1e-4}));
  EXPECT_TRUE(check_fwd_bwd(attn(true), {rnd({2, 2, 6, 4}, 144), rnd({2, 2, 6, 4}, 145), rnd({2, 2, 6, 4}, 146)},
                            Tol{1e-4, 1e-4}));
  // a boolean mask broadcast over the batch (every query sees key 0), and a scale of its own
  Tensor visible = (rnd({5, 6}, 147) > 0).logical_or(Tensor::arange(6).reshape({1, 6}) < 1);
  EXPECT_TRUE(check_fwd_bwd(
      [&](const Tensors& in) { return in[0].scaled_dot_product_attention(in[1], in[2], false, 0, visible, 0.3); },
      {rnd({3, 5, 4}, 148), rnd({3, 6, 4}, 149), rnd({3, 6, 2}, 150)}, Tol{1e-4, 1e-4}));
  // q = k = 0: equal weights over the visible keys, so causal row i is the mean of v[0..i]
  Tensor zeros = Tensor::zeros({1, 3, 2});
  auto out = zeros.scaled_dot_product_attention(zeros, vec({1, 10, 2, 20, 6, 60}, {1, 3, 2}), true).to_vector<float>();
  EXPECT_EQ(out, (V{1, 10, 1.5, 15, 3, 30}));
  EXPECT_TRUE(check_fwd_bwd(attn(true),
                            {rnd({1, 2, 8, 8}, 151, -2, 2, DType::BFloat16), rnd({1, 2, 8, 8}, 152, -2, 2, DType::BFloat16),
                             rnd({1, 2, 8, 8}, 153, -2, 2, DType::BFloat16)},
                            Tol{3e-2, 3e-2}));
  Tensor q = rnd({2, 4, 8}, 154);
  expect_error([&] { q.scaled_dot_product_attention(rnd({2, 4, 6}, 155), rnd({2, 4, 8}, 156)); },
               {"scaled_dot_product_attention", "same last dim"});
  expect_error([&] { q.scaled_dot_product_attention(rnd({2, 5, 8}, 157), rnd({2, 4, 8}, 158)); },
               {"same sequence length"});
  expect_error([&] { q.scaled_dot_product_attention(q.cast(DType::Float16), q); }, {"one floating dtype"});
  expect_error([&] { q.scaled_dot_product_attention(q, q, false, 0, Tensor::ones({4, 4})); }, {"mask must be bool"});
  expect_error([&] { q.scaled_dot_product_attention(q, q, false, 1.0); }, {"dropout_p must be in [0, 1)"});
}

TEST(Ops, CrossEntropy) {
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{2, 0, 4, 4}, {4});
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].sparse_categorical_crossentropy(labels); },
                            {rnd({4, 5}, 121, -3, 3)}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].sparse_categorical_crossentropy(labels, 0.1); },
                            {rnd({4, 5}, 122, -3, 3)}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].cross_entropy(labels.cast(DType::Int64)); },
                            {rnd({4, 5}, 123, -3, 3)}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].sparse_categorical_crossentropy(labels); },
                            {rnd({4, 5}, 124, -3, 3, DType::Float16)}, Tol{1e-2, 1e-2}));
  // uniform logits: log(C); a confident right answer: ~0
  EXPECT_NEAR(Tensor::zeros({4, 5}).sparse_categorical_crossentropy(labels).item<float>(), std::log(5.0), 1e-6);
  Tensor sure = Tensor::from_vector(std::vector<float>{50, 0, 0, 0, 50, 0}, {2, 3});
  EXPECT_NEAR(sure.sparse_categorical_crossentropy(Tensor::from_vector(std::vector<int32_t>{0, 1}, {2})).item<float>(), 0, 1e-6);
  // its gradient is (softmax - onehot) / N
  Tensor z = vec({0, 0, 0, 0}, {2, 2}).requires_grad_();
  z.sparse_categorical_crossentropy(Tensor::from_vector(std::vector<int32_t>{1, 0}, {2})).backward();
  EXPECT_EQ(z.grad()->to_vector<float>(), (V{0.25, -0.25, -0.25, 0.25}));
}

TEST(Ops, OtherLosses) {
  Tensor t = rnd({3, 4}, 125, 0, 1);
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].sigmoid().binary_crossentropy(t); }, {rnd({3, 4}, 126)}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].binary_crossentropy_logits(t); }, {rnd({3, 4}, 127, -30, 30)}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].mse(in[1]); }, {rnd({3, 4}, 128), rnd({3, 4}, 129)}));
  EXPECT_NEAR(vec({1, 2}, {2}).mse(vec({0, 0}, {2})).item<float>(), 2.5, 1e-6);
  EXPECT_NEAR(vec({0.5f}, {1}).binary_crossentropy(vec({1}, {1})).item<float>(), std::log(2.0), 1e-6);
  EXPECT_NEAR(vec({0}, {1}).binary_crossentropy_logits(vec({1}, {1})).item<float>(), std::log(2.0), 1e-6);
}

TEST(Ops, OneHotAndDropout) {
  Tensor l = Tensor::from_vector(std::vector<int32_t>{0, 3, 1}, {3});
  EXPECT_EQ(l.one_hot(4).to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0}));
  EXPECT_TRUE(match(l.one_hot(5)));
  Tensor x = rnd({4, 50}, 131, 1, 2);
  EXPECT_EQ(x.dropout(0.5, false).uop(), x.uop());
  EXPECT_EQ(x.dropout(0).uop(), x.uop());
  Tensor::manual_seed(3);
  Tensor d = x.dropout(0.25);
  EXPECT_TRUE(match(d));
  auto dv = d.to_vector<float>(), xv = x.to_vector<float>();
  int zeros = 0;
  for (size_t i = 0; i < dv.size(); i++) {
    if (dv[i] == 0) zeros++;
    else EXPECT_NEAR(dv[i], xv[i] / 0.75, 1e-5);
  }
  EXPECT_NEAR(zeros / 200.0, 0.25, 0.08);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].dropout(0.5); }, {rnd({3, 3}, 132)}));
}
