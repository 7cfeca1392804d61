// Backend op tests, part 2: reductions (sum, mean, max, min, prod, argmax, argmin, var, std)
// over every axis pattern with and without keepdim, on integer, bool and half types, on
// non-contiguous inputs; softmax, log_softmax, logsumexp and cumsum. Forward and backward, each
// against the float64 reference interpreter evaluating the same lazy graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops_util.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"

using namespace tg;
using namespace tg::testutil;

namespace {

using Axes = std::vector<int64_t>;

// The host's version of a reduction over `axes` of a row-major array: groups the elements of
// each output position (in order) and hands them to `g`.
std::vector<double> host_reduce(const std::vector<double>& x, const Shape& shape, Axes axes,
                                const std::function<double(const std::vector<double>&)>& g) {
  int64_t nd = static_cast<int64_t>(shape.size());
  if (axes.empty())
    for (int64_t d = 0; d < nd; d++) axes.push_back(d);
  for (auto& a : axes) a = (a + nd) % nd;
  Shape out = shape;
  for (auto a : axes) out[a] = 1;
  std::vector<std::vector<double>> groups(static_cast<size_t>(prod(out)));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); i++) {
    int64_t rem = i, o = 0, stride = 1;
    for (int64_t d = nd - 1; d >= 0; d--) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (out[d] != 1) o += idx * stride;
      stride *= out[d];
    }
    groups[o].push_back(x[i]);
  }
  std::vector<double> r;
  for (auto& gr : groups) r.push_back(g(gr));
  return r;
}

double h_sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }
double h_mean(const std::vector<double>& v) { return h_sum(v) / static_cast<double>(v.size()); }
double h_var(const std::vector<double>& v, double correction) {
  double m = h_mean(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / (static_cast<double>(v.size()) - correction);
}

struct ReduceCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Axes&, bool)> f;
  bool single_axis;  // argmax/argmin: at most one axis
  std::function<double(const std::vector<double>&)> host;
};
void PrintTo(const ReduceCase& c, std::ostream* os) { *os << c.name; }

std::optional<int64_t> one_axis(const Axes& a) { return a.empty() ? std::nullopt : std::optional<int64_t>(a[0]); }

const std::vector<ReduceCase>& reduce_cases() {
  static const std::vector<ReduceCase> cases = {
      {"sum", [](const Tensor& x, const Axes& a, bool k) { return x.sum(a, k); }, false,
       [](const std::vector<double>& v) { return h_sum(v); }},
      {"mean", [](const Tensor& x, const Axes& a, bool k) { return x.mean(a, k); }, false,
       [](const std::vector<double>& v) { return h_mean(v); }},
      {"max", [](const Tensor& x, const Axes& a, bool k) { return x.max(a, k); }, false,
       [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }},
      {"min", [](const Tensor& x, const Axes& a, bool k) { return x.min(a, k); }, false,
       [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }},
      {"prod", [](const Tensor& x, const Axes& a, bool k) { return (x * 0.3 + 1.0).prod(a, k); }, false,
       [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 1.0, [](double p, double x) { return p * (x * 0.3 + 1); }); }},
      {"var", [](const Tensor& x, const Axes& a, bool k) { return x.var(a, k); }, false,
       [](const std::vector<double>& v) { return h_var(v, 1); }},
      {"var_c0", [](const Tensor& x, const Axes& a, bool k) { return x.var(a, k, 0); }, false,
       [](const std::vector<double>& v) { return h_var(v, 0); }},
      {"std", [](const Tensor& x, const Axes& a, bool k) { return x.std(a, k); }, false,
       [](const std::vector<double>& v) { return std::sqrt(h_var(v, 1)); }},
      {"argmax", [](const Tensor& x, const Axes& a, bool k) { return x.argmax(one_axis(a), k); }, true,
       [](const std::vector<double>& v) { return double(std::max_element(v.begin(), v.end()) - v.begin()); }},
      {"argmin", [](const Tensor& x, const Axes& a, bool k) { return x.argmin(one_axis(a), k); }, true,
       [](const std::vector<double>& v) { return double(std::min_element(v.begin(), v.end()) - v.begin()); }},
  };
  return cases;
}

std::string axes_name(const Axes& a) {
  if (a.empty()) return "all";
  std::string s;
  for (auto v : a) s += v < 0 ? "m" + std::to_string(-v) : std::to_string(v);
  return s;
}

}  // namespace

// Every op over all, one (positive or negative) and two axes, with and without keepdim.
std::vector<std::tuple<ReduceCase, Axes, bool>> reduce_params() {
  std::vector<std::tuple<ReduceCase, Axes, bool>> out;
  for (auto& c : reduce_cases())
    for (const Axes& a : {Axes{}, Axes{0}, Axes{1}, Axes{-1}, Axes{0, 2}})
      for (bool k : {false, true})
        if (!c.single_axis || a.size() <= 1) out.emplace_back(c, a, k);
  return out;
}

class Reduce : public ::testing::TestWithParam<std::tuple<ReduceCase, Axes, bool>> {};

TEST_P(Reduce, Float32) {
  auto& [c, axes, keepdim] = GetParam();
  Tensor x = distinct({3, 4, 5}, 61);
  Tensor y = c.f(x, axes, keepdim);
  // the result shape, by hand
  Shape want;
  for (int64_t d = 0; d < 3; d++) {
    bool reduced = axes.empty() || std::find_if(axes.begin(), axes.end(), [&](int64_t a) { return (a + 3) % 3 == d; }) != axes.end();
    if (!reduced) want.push_back(x.shape()[d]);
    else if (keepdim) want.push_back(1);
  }
  EXPECT_EQ(y.shape(), want);
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0], axes, keepdim); }, {x}));
  auto expect = host_reduce(x.to_vector<double>(), x.shape(), axes, c.host);
  auto got = y.to_vector<double>();
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], expect[i], 1e-5 * (1 + std::fabs(expect[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Ops, Reduce,
                         ::testing::ValuesIn(reduce_params()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + axes_name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_keep" : "");
                         });

// Reductions over several axes at once, as BatchNorm's statistics (Note [grouped reduction] in
// codegen/gpu_dims.cpp: one flat loop over N, H, W): a power-of-two count, an odd one (one
// thread per output), and mean, var and max with their gradients.
TEST(Ops, ReduceOverSeveralAxes) {
  for (const Shape& s : {Shape{16, 3, 16, 16}, Shape{5, 3, 9, 7}, Shape{6, 4, 8, 12}}) {
    Tensor x = rnd(s, 131);
    EXPECT_TRUE(match_all({x.sum({0, 2, 3}), x.max({0, 2, 3}), (x * x).sum({0, 1, 3})}, Tol{1e-4, 1e-4})) << shape_str(s);
  }
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& t) { return t[0].var({0, 2, 3}) + t[0].mean({0, 2, 3}); },
                            {rnd({16, 3, 16, 16}, 132)}, Tol{1e-4, 1e-4}));
}

// Long reductions with few outputs (BatchNorm's statistics): on GPU-style devices two kernels,
// partial sums in many work-groups and a short reduce of those (Note [split reductions] in
// schedule/split_reduce.cpp), whose split axis may be odd (17) or not the first reduced one.
TEST(Ops, LongReductionsWithFewOutputs) {
  bool split = get_device(default_device()).policy().split_reductions;
  for (const Shape& s : {Shape{128, 3, 24, 24}, Shape{17, 4, 31, 37}, Shape{2, 5, 96, 100}}) {
    Tensor x = rnd(s, 133);
    Tensors outs{x.sum({0, 2, 3}), x.max({0, 2, 3}), (x * x).mean({0, 2, 3}), x.min(), x.sum()};
    EXPECT_EQ(create_schedule({outs[0].uop()}).size(), split ? 2u : 1u) << shape_str(s);
    EXPECT_TRUE(match_all(outs, Tol{1e-4, 1e-4})) << shape_str(s);
  }
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& t) { return t[0].var({0, 2, 3}) + t[0].mean({0, 2, 3}); },
                            {rnd({64, 3, 20, 20}, 134)}, Tol{1e-4, 1e-4}));
  for (DType dt : {DType::Float16, DType::BFloat16}) {  // partials in float32, one rounding
    Tensor h = rnd({64, 2, 16, 16}, 135, -1, 1, dt);
    Tol tol = dt == DType::Float16 ? Tol{5e-3, 2e-2} : Tol{3e-2, 1e-1};
    EXPECT_TRUE(match_all({h.sum({0, 2, 3}), h.max({0, 2, 3})}, tol)) << dtype_name(dt);
    EXPECT_EQ(h.sum({0, 2, 3}).dtype(), dt);
  }
  Tensor few = rnd({40, 3, 8, 8}, 136);  // 2560 elements per output: one kernel everywhere
  EXPECT_EQ(create_schedule({few.sum({0, 2, 3}).uop()}).size(), 1u);
}

// Long reductions with many outputs (a convolution's weight gradient): on GPU-style devices
// partial sums of at most SPLIT_PARTS blocks of an outer reduced axis, then a short reduce (Note
// [split long reductions] in schedule/split_reduce.cpp): 520 outputs of 65536 elements, in 8
// parts of 2 images, or of 12 rows where the batch does not split. A product of broadcast
// operands, as in a weight gradient, keeps the inputs small, and its sums and maxima are known
// on the host (the reference interpreter would take seconds).
TEST(Ops, LongReductionsWithManyOutputs) {
  bool split = get_device(default_device()).policy().split_reductions;
  for (const Shape& s : {Shape{16, 1, 64, 64}, Shape{1, 1, 96, 683}}) {
    Tensor a = rnd(s, 137), b = rnd({1, 520, 1, 1}, 138);
    Tensor sum = (a * b).sum({0, 2, 3}), max = (a * b).max({0, 2, 3});
    EXPECT_EQ(create_schedule({sum.uop()}).size(), split ? 2u : 1u) << shape_str(s);
    auto av = a.to_vector<float>(), bv = b.to_vector<float>(), sv = sum.to_vector<float>(), mv = max.to_vector<float>();
    double total = 0, magnitude = 0, hi = -1e30, lo = 1e30;
    for (float v : av) total += v, magnitude += std::abs(v), hi = std::max<double>(hi, v), lo = std::min<double>(lo, v);
    for (size_t c = 0; c < bv.size(); c++) {
      EXPECT_NEAR(sv[c], bv[c] * total, 1e-5 * std::abs(bv[c]) * magnitude) << c;
      EXPECT_FLOAT_EQ(mv[c], static_cast<float>(bv[c] * (bv[c] >= 0 ? hi : lo))) << c;
    }
  }
}

// Column sums, a reduction over the rows that keeps the contiguous axis (bias and LayerNorm
// gradients): on GPU-style devices a large one runs as parts of rows and then a sum of the
// partials (Note [split column sums] in schedule/split_reduce.cpp), each thread with partial sums
// of rows (Note [column sums] in codegen/opt_gpu.cpp): [16384, 768] as GPT-2's bias gradients,
// [16, 1024, 768] over its first two axes, with a row statistic broadcast along the columns as in
// LayerNorm's weight gradient, and a max. Small and odd ones ([1000, 77], [3, 5000]) stay one
// kernel. Sums of 16384 values of up to 2 accumulate rounding errors of about 1e-3.
TEST(Ops, ColumnSums) {
  bool split = get_device(default_device()).policy().split_reductions;
  const int64_t R = 16384, C = 768;
  std::vector<float> xv = rnd_values(R * C, 139), mv = rnd_values(R, 140);
  Tensor x = Tensor::from_vector(xv, {16, 1024, C}), mean = Tensor::from_vector(mv, {16, 1024, 1});
  Tensor rows = x.reshape({R, C});
  Tensors outs{rows.sum(0), x.sum({0, 1}), (x * (x - mean)).sum({0, 1}), rows.max(0)};
  EXPECT_EQ(create_schedule({outs[0].uop()}).size(), split ? 2u : 1u);
  EXPECT_EQ(create_schedule({outs[2].uop()}).size(), split ? 2u : 1u);
  std::vector<double> sum(C), ln(C), max(C, -1e30);  // the references, in float64 on the host
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) {
      double v = xv[r * C + c];
      sum[c] += v, ln[c] += v * (v - mv[r]), max[c] = std::max(max[c], v);
    }
  Tensor::realize_all(outs);
  std::vector<std::vector<float>> got;
  for (auto& t : outs) got.push_back(t.to_vector<float>());
  for (int64_t c = 0; c < C; c++) {
    EXPECT_NEAR(got[0][c], sum[c], 1e-2) << c;
    EXPECT_NEAR(got[1][c], sum[c], 1e-2) << c;
    EXPECT_NEAR(got[2][c], ln[c], 1e-5 * std::abs(ln[c]) + 1e-2) << c;
    EXPECT_EQ(got[3][c], static_cast<float>(max[c])) << c;
  }
  for (const Shape& s : {Shape{1000, 77}, Shape{3, 5000}}) {
    Tensor y = rnd(s, 141);
    Tensors small{y.sum(0), y.mean(0), y.max(0)};
    EXPECT_EQ(create_schedule({small[0].uop()}).size(), 1u) << shape_str(s);
    EXPECT_TRUE(match_all(small, Tol{1e-5, 1e-4})) << shape_str(s);
  }
}

TEST(Ops, ReduceHandChecked) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 5, 5, 2, 0, 0, -1, 3}, {2, 4});
  EXPECT_EQ(x.argmax(1).to_vector<int32_t>(), (std::vector<int32_t>{1, 3}));  // first maximum wins
  EXPECT_EQ(x.argmin(1).to_vector<int32_t>(), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(x.argmax().to_vector<int32_t>(), (std::vector<int32_t>{1}));
  EXPECT_EQ(x.argmax(0, true).shape(), (Shape{1, 4}));
  EXPECT_EQ(x.argmax(std::nullopt, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(x.sum(1).to_vector<float>(), (std::vector<float>{13, 2}));
  EXPECT_EQ(x.prod({0}).to_vector<float>(), (std::vector<float>{0, 0, -5, 6}));
  EXPECT_FLOAT_EQ(x.var().item<float>(), 36.875f / 7);  // mean 15/8: (65 - 8 * 1.875^2) / 7
  EXPECT_TRUE(match_all({x.argmax(1), x.argmin(0), x.argmax(), x.max(1), x.min(0)}));
  // max with ties: the gradient is shared between the tied maxima
  Tensor t = Tensor::from_vector(std::vector<float>{3, 1, 3, 2}, {4}).requires_grad_();
  t.max().backward();
  EXPECT_EQ(t.grad()->to_vector<float>(), (std::vector<float>{0.5, 0, 0.5, 0}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].max(1) + in[0].min(0).sum(); },
                            {Tensor::from_vector(std::vector<float>{1, 4, 4, 2, 2, 1}, {2, 3})}));
}

TEST(Ops, ReduceIntegerAndBool) {
  Tensor i = rnd_int({3, 5}, 62, -50, 50);
  Tensor u = rnd_int({3, 5}, 63, 0, 256, DType::UInt8);
  Tensor b = rnd_int({3, 5}, 64, 0, 2).cast(DType::Bool);
  Tensors outs{i.sum(), i.sum(0), i.max(1), i.min(0, true), i.prod({1}), i.argmax(0), i.argmin(1), i.mean(1), i.var({0}),
               u.sum(1), u.max(0), u.min(1), u.argmin(0), u.mean(), b.sum(0), b.max(1), b.min(0), b.argmax(1),
               b.mean()};
  EXPECT_TRUE(match_all(outs));
  EXPECT_EQ(i.sum().dtype(), DType::Int64);
  EXPECT_EQ(u.sum(1).dtype(), DType::Int64);
  EXPECT_EQ(u.max(0).dtype(), DType::UInt8);
  EXPECT_EQ(b.sum(0).dtype(), DType::Int64);
  EXPECT_EQ(b.max(1).dtype(), DType::Bool);
  EXPECT_EQ(i.argmax(0).dtype(), DType::Int32);
  EXPECT_EQ(i.mean(1).dtype(), DType::Float32);
  Tensor l = Tensor::from_vector(std::vector<int64_t>{1LL << 40, 3, -(1LL << 41)}, {3});
  EXPECT_TRUE(match_all({l.sum(), l.max(), l.min(), l.argmin()}));
  EXPECT_EQ(l.sum().item<int64_t>(), -(1LL << 40) + 3);
}

TEST(Ops, ReduceHalfTypes) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor x = rnd({4, 30}, 65, -1, 1, dt);
    Tol tol = dt == DType::Float16 ? Tol{5e-3, 2e-2} : Tol{3e-2, 1e-1};  // sums of 30 rounded terms
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].sum(1); }, {x}, tol)) << dtype_name(dt);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].mean(0); }, {x}, tol)) << dtype_name(dt);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].max(1); }, {x}, tol)) << dtype_name(dt);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].softmax(1); }, {x}, tol)) << dtype_name(dt);
    EXPECT_TRUE(match_all({x.argmax(1), x.min(0), x.var({1}), x.logsumexp(1)}, tol)) << dtype_name(dt);
    EXPECT_EQ(x.sum(1).dtype(), dt);
  }
}

TEST(Ops, ReduceNonContiguous) {
  Tensor x = rnd({4, 6}, 66);
  auto f = [](std::function<Tensor(const Tensor&)> view) {
    return [view](const Tensors& in) { return view(in[0]); };
  };
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.T().sum(1); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.flip({0, 1}).max(0); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.pad({{1, 2}, {0, 1}}).mean(0); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.shrink({{1, 3}, {2, 6}}).prod({1}); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.reshape({2, 2, 6}).permute({2, 0, 1}).sum({1, 2}); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.unsqueeze(1).expand({4, 3, 6}).sum(1); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t[{Slice{std::nullopt, std::nullopt, 2}}].std({0}); }), {x}));
  // reduce of a reduce, and a reduce feeding elementwise feeding a reduce
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.sum(0).max(0); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return (t - t.mean(1, true)).square().sum(1).sqrt(); }), {x}));
  EXPECT_TRUE(check_fwd_bwd(f([](const Tensor& t) { return t.max(1, true) * t.sum(0, true); }), {x}));
}

// ---- softmax family and cumsum ----

struct AxisCase {
  const char* name;
  std::function<Tensor(const Tensor&, int64_t)> f;
  // the host's version on one line along the axis: values in, values out (logsumexp: one)
  std::function<std::vector<double>(const std::vector<double>&)> host;
};

std::vector<double> h_softmax(const std::vector<double>& v, bool log) {
  double m = *std::max_element(v.begin(), v.end()), z = 0;
  for (double x : v) z += std::exp(x - m);
  std::vector<double> r;
  for (double x : v) r.push_back(log ? x - m - std::log(z) : std::exp(x - m) / z);
  return r;
}
std::vector<double> h_lse(const std::vector<double>& v) {
  double z = 0;
  for (double x : v) z += std::exp(x);
  return {std::log(z)};
}
std::vector<double> h_cumsum(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  std::partial_sum(v.begin(), v.end(), r.begin());
  return r;
}

// Applies `line` along `axis` of a 3-D array, row-major in the result's own layout (the axis
// keeps its place; for one value per line it has size 1).
std::vector<double> along(const std::vector<double>& x, const Shape& s, int64_t axis,
                          const std::function<std::vector<double>(const std::vector<double>&)>& line) {
  axis = (axis + 3) % 3;
  std::vector<double> out(x.size());
  size_t n_out = 0;
  for (int64_t i = 0; i < s[0]; i++)
    for (int64_t j = 0; j < s[1]; j++)
      for (int64_t k = 0; k < s[2]; k++) {
        int64_t idx[3] = {i, j, k};
        if (idx[axis] != 0) continue;
        std::vector<double> v;
        for (int64_t t = 0; t < s[axis]; t++) {
          idx[axis] = t;
          v.push_back(x[(idx[0] * s[1] + idx[1]) * s[2] + idx[2]]);
        }
        std::vector<double> r = line(v);
        for (size_t t = 0; t < r.size(); t++) {
          idx[axis] = static_cast<int64_t>(t);
          Shape os = s;
          os[axis] = static_cast<int64_t>(r.size());
          out[(idx[0] * os[1] + idx[1]) * os[2] + idx[2]] = r[t];
        }
        n_out += r.size();
      }
  out.resize(n_out);
  return out;
}
void PrintTo(const AxisCase& c, std::ostream* os) { *os << c.name; }

class AlongAxis : public ::testing::TestWithParam<std::tuple<AxisCase, int64_t>> {};

TEST_P(AlongAxis, Float32) {
  auto& [c, axis] = GetParam();
  Tensor x = rnd({3, 4, 5}, 67, -3, 3);
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0], axis); }, {x}));
  auto expect = along(x.to_vector<double>(), x.shape(), axis, c.host);
  auto got = c.f(x, axis).to_vector<double>();
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], expect[i], 1e-5 * (1 + std::fabs(expect[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Ops, AlongAxis,
    ::testing::Combine(::testing::Values(AxisCase{"softmax", [](const Tensor& x, int64_t a) { return x.softmax(a); },
                                                  [](const std::vector<double>& v) { return h_softmax(v, false); }},
                                         AxisCase{"log_softmax", [](const Tensor& x, int64_t a) { return x.log_softmax(a); },
                                                  [](const std::vector<double>& v) { return h_softmax(v, true); }},
                                         AxisCase{"logsumexp", [](const Tensor& x, int64_t a) { return x.logsumexp(a); }, h_lse},
                                         AxisCase{"logsumexp_keep",
                                                  [](const Tensor& x, int64_t a) { return x.logsumexp(a, true); }, h_lse},
                                         AxisCase{"cumsum", [](const Tensor& x, int64_t a) { return x.cumsum(a); }, h_cumsum}),
                       ::testing::Values(0, 1, -1)),
    [](const auto& info) {
      int64_t a = std::get<1>(info.param);
      return std::string(std::get<0>(info.param).name) + "_" + (a < 0 ? "m" + std::to_string(-a) : std::to_string(a));
    });

TEST(Ops, SoftmaxFamilyHandChecked) {
  Tensor x = Tensor::from_vector(std::vector<float>{1000, 1001, 1002, -5, -5, -5}, {2, 3});
  double z = 1 + std::exp(1.0) + std::exp(2.0);
  auto sm = x.softmax(1).to_vector<double>();
  EXPECT_NEAR(sm[0], 1 / z, 1e-6);
  EXPECT_NEAR(sm[2], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(sm[4], 1.0 / 3, 1e-6);
  auto lse = x.logsumexp(1).to_vector<double>();
  EXPECT_NEAR(lse[0], 1000 + std::log(z), 1e-3);
  EXPECT_NEAR(lse[1], -5 + std::log(3.0), 1e-5);
  auto ls = x.log_softmax(1).to_vector<double>();
  EXPECT_NEAR(ls[0], -std::log(z), 1e-5);
  EXPECT_TRUE(match_all({x.softmax(1), x.log_softmax(0), x.logsumexp(1), x.logsumexp(0, true)}, Tol{1e-5, 1e-4}));
  // -inf entries: softmax gives 0 there, logsumexp of all -inf is -inf
  Tensor m = Tensor::from_vector(std::vector<float>{-INFINITY, 0, -INFINITY, -INFINITY}, {2, 2});
  EXPECT_TRUE(match_all({m.softmax(1).shrink({{0, 1}, {0, 2}}), m.logsumexp(1)}));
  auto lm = m.logsumexp(1).to_vector<double>();
  EXPECT_NEAR(lm[0], 0, 1e-6);
  EXPECT_EQ(lm[1], -INFINITY);
  EXPECT_EQ(Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).cumsum(1).to_vector<float>(),
            (std::vector<float>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).cumsum(0).to_vector<float>(),
            (std::vector<float>{1, 2, 3, 5, 7, 9}));
  Tensor ci = rnd_int({7}, 68, -5, 5);
  EXPECT_TRUE(match_all({ci.cumsum(0), ci.softmax(0)}));
  EXPECT_EQ(ci.cumsum(0).dtype(), DType::Int64);
}
