// Numerical gradient checks: for a representative set of ops and compositions, the autograd
// gradient (realized on the CPU device) must match central differences of the same function,
// both computed in float64 on the device. Inputs avoid kinks and ties (relu at 0, equal maxima)
// by more than the step, so the finite differences are well defined.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "ops_util.h"

using namespace tg;
using namespace tg::testutil;

namespace {

using Fn = std::function<Tensor(const Tensors&)>;
using Values = std::vector<std::vector<double>>;

struct Input {
  Shape shape;
  std::vector<double> v;
};

Input uniform(const Shape& s, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Input in{s, std::vector<double>(static_cast<size_t>(prod(s)))};
  for (auto& x : in.v) x = d(gen);
  return in;
}
// Shuffled values on a grid of spacing 0.1 (plus a little noise): no ties, no near-ties.
Input spread(const Shape& s, uint32_t seed) {
  Input in{s, std::vector<double>(static_cast<size_t>(prod(s)))};
  for (size_t i = 0; i < in.v.size(); i++) in.v[i] = (static_cast<double>(i) - in.v.size() / 2.0) * 0.1 + 0.013;
  std::shuffle(in.v.begin(), in.v.end(), std::mt19937(seed));
  return in;
}

Tensors make(const std::vector<Input>& ins, const Values& vals) {
  Tensors ts;
  for (size_t i = 0; i < ins.size(); i++) ts.push_back(Tensor::from_vector(vals[i], ins[i].shape));
  return ts;
}

// The scalar loss sum(f(x) * w) with fixed weights w.
Tensor loss_of(const Fn& f, const Tensors& xs) {
  Tensor out = f(xs);
  Input w = uniform(out.shape(), 999, 0.5, 1.5);
  return (out.cast(DType::Float64) * Tensor::from_vector(w.v, out.shape())).sum();
}

::testing::AssertionResult gradcheck(const Fn& f, const std::vector<Input>& ins, double h = 1e-6, double rtol = 1e-5,
                                     double atol = 1e-6) {
  Values vals;
  for (auto& in : ins) vals.push_back(in.v);
  Tensors xs = make(ins, vals);
  for (auto& x : xs) x.requires_grad_();
  // a float64 check is only meaningful when the whole graph stays in float64
  EXPECT_FALSE(narrows_float64(f(xs))) << "the graph casts float64 down to a narrower float";
  Tensors grads = loss_of(f, xs).gradients(xs);
  Tensor::realize_all(grads);
  std::ostringstream err;
  int bad = 0;
  for (size_t i = 0; i < ins.size(); i++) {
    auto analytic = grads[i].to_vector<double>();
    for (size_t j = 0; j < vals[i].size(); j++) {
      double orig = vals[i][j];
      vals[i][j] = orig + h;
      double up = loss_of(f, make(ins, vals)).item<double>();
      vals[i][j] = orig - h;
      double down = loss_of(f, make(ins, vals)).item<double>();
      vals[i][j] = orig;
      double numeric = (up - down) / (2 * h);
      if (std::fabs(numeric - analytic[j]) > atol + rtol * std::fabs(numeric)) {
        if (bad++ < 5)
          err << "input " << i << " element " << j << ": autograd " << analytic[j] << ", numerical " << numeric << "\n";
      }
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatching elements\n" << err.str();
}

struct GradCase {
  const char* name;
  Fn f;
  std::vector<Input> inputs;
};
void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

Tensor labels() { return Tensor::from_vector(std::vector<int32_t>{2, 0, 3}, {3}); }
Tensor gidx() { return Tensor::from_vector(std::vector<int32_t>{2, 0, 1, 1, 3, 0}, {2, 3}); }

const std::vector<GradCase>& cases() {
  static const std::vector<GradCase> c = {
      // elementwise
      {"exp_log", [](const Tensors& x) { return x[0].exp() + x[1].log(); }, {uniform({2, 3}, 1), uniform({2, 3}, 2, 0.2, 3)}},
      {"sin_cos", [](const Tensors& x) { return x[0].sin() * x[0].cos(); }, {uniform({5}, 3, -3, 3)}},
      {"tanh", [](const Tensors& x) { return x[0].tanh(); }, {uniform({2, 4}, 4, -3, 3)}},
      {"sigmoid", [](const Tensors& x) { return x[0].sigmoid(); }, {uniform({2, 4}, 5, -4, 4)}},
      {"gelu", [](const Tensors& x) { return x[0].gelu(); }, {uniform({2, 4}, 6, -3, 3)}},
      {"silu", [](const Tensors& x) { return x[0].silu(); }, {uniform({6}, 7, -3, 3)}},
      {"relu_leaky", [](const Tensors& x) { return x[0].relu() + x[0].leaky_relu(0.2); }, {spread({7}, 8)}},
      {"sqrt_rsqrt", [](const Tensors& x) { return x[0].sqrt() + x[0].rsqrt(); }, {uniform({5}, 9, 0.3, 3)}},
      {"div", [](const Tensors& x) { return x[0] / x[1]; }, {uniform({2, 3}, 10), uniform({3}, 11, 0.5, 2)}},
      {"pow_tensor", [](const Tensors& x) { return x[0].pow(x[1]); }, {uniform({4}, 12, 0.3, 2), uniform({4}, 13, -2, 2)}},
      {"pow_scalar", [](const Tensors& x) { return x[0].pow(2.7) + x[0].pow(-1.5); }, {uniform({4}, 14, 0.3, 2)}},
      {"maximum_where", [](const Tensors& x) { return x[0].maximum(x[1]) + (x[0] > x[1]).where(x[0] * x[1], x[1]); },
       {spread({6}, 15), uniform({6}, 16, -0.04, 0.04)}},
      {"abs_clip", [](const Tensors& x) { return x[0].abs() + x[0].clip(-0.5, 0.7) * 3.0; }, {spread({8}, 17)}},
      // reductions
      {"sum_mean", [](const Tensors& x) { return x[0].sum(1) * x[0].mean(0).sum(); }, {uniform({3, 4}, 18)}},
      {"max_min", [](const Tensors& x) { return x[0].max(0) - x[0].min(1).sum(); }, {spread({3, 4}, 19)}},
      {"prod", [](const Tensors& x) { return x[0].prod({1}); }, {uniform({2, 4}, 20, 0.5, 1.5)}},
      {"var_std", [](const Tensors& x) { return x[0].var({1}) + x[0].std({0}).sum(); }, {uniform({3, 4}, 21)}},
      {"softmax", [](const Tensors& x) { return x[0].softmax(1); }, {uniform({3, 4}, 22, -3, 3)}},
      {"log_softmax", [](const Tensors& x) { return x[0].log_softmax(0); }, {uniform({3, 4}, 23, -3, 3)}},
      {"logsumexp", [](const Tensors& x) { return x[0].logsumexp(-1); }, {uniform({3, 4}, 24, -3, 3)}},
      {"cumsum", [](const Tensors& x) { return x[0].cumsum(1).square(); }, {uniform({2, 5}, 25)}},
      // movement chains
      {"pad_shrink_flip_permute",
       [](const Tensors& x) {
         return x[0].pad({{1, 2}, {0, 1}}, 0.5).flip({0}).permute({1, 0}).shrink({{1, 4}, {0, 4}}).square();
       },
       {uniform({3, 4}, 26)}},
      {"reshape_expand",
       [](const Tensors& x) { return x[0].reshape({2, 1, 3}).expand({2, 4, 3}) * x[1].reshape({1, 4, 1}); },
       {uniform({6}, 27), uniform({4}, 28)}},
      {"slice_negative_step", [](const Tensors& x) { return x[0][{Slice{std::nullopt, std::nullopt, -2}, Slice{3, 0, -1}}].exp(); },
       {uniform({5, 4}, 29)}},
      {"cat_stack_split",
       [](const Tensors& x) {
         auto p = Tensor::cat({x[0], x[1].sin()}, 1).split(2, 1);
         return Tensor::stack({p[0], p[1] * p[1]}, 0);
       },
       {uniform({2, 3}, 30), uniform({2, 1}, 31)}},
      {"repeat", [](const Tensors& x) { return x[0].repeat({2, 3}).sin(); }, {uniform({2, 2}, 32)}},
      {"gather", [](const Tensors& x) { return x[0].gather(1, gidx()).square(); }, {uniform({2, 4}, 33)}},
      {"index_select", [](const Tensors& x) { return x[0].index_select(0, gidx().reshape({6})).sin(); }, {uniform({4, 2}, 34)}},
      {"scatter_add",
       [](const Tensors& x) { return x[0].scatter_add(1, gidx(), x[1]).square(); },
       {uniform({2, 4}, 46), uniform({2, 3}, 47)}},
      {"embedding_rows",  // repeated rows: their gradients add up in one row
       [](const Tensors& x) { return x[0].index_select(0, gidx().reshape({6})).square().sum(1); },
       {uniform({4, 2}, 48)}},
      // linear algebra and networks
      {"matmul", [](const Tensors& x) { return x[0].matmul(x[1]); }, {uniform({2, 3, 4}, 35), uniform({4, 2}, 36)}},
      {"matmul_vec", [](const Tensors& x) { return x[0].matmul(x[1]).tanh(); }, {uniform({3}, 37), uniform({3, 2}, 38)}},
      {"mlp",
       [](const Tensors& x) { return x[0].linear(x[1], x[2]).tanh().linear(x[3]).log_softmax(); },
       {uniform({2, 3}, 39), uniform({4, 3}, 40, -1, 1), uniform({4}, 41), uniform({2, 4}, 42, -1, 1)}},
      {"conv2d", [](const Tensors& x) { return x[0].conv2d(x[1], x[2]); },
       {uniform({1, 2, 4, 4}, 43), uniform({2, 2, 3, 3}, 44, -1, 1), uniform({2}, 45)}},
      {"conv2d_stride_pad", [](const Tensors& x) { return x[0].conv2d(x[1], std::nullopt, {2}, {1}); },
       {uniform({1, 1, 5, 5}, 46), uniform({2, 1, 3, 3}, 47, -1, 1)}},
      {"conv2d_dilation_groups", [](const Tensors& x) { return x[0].conv2d(x[1], std::nullopt, {1}, {0}, {2}, 2); },
       {uniform({1, 2, 5, 5}, 48), uniform({2, 1, 2, 2}, 49, -1, 1)}},
      {"conv2d_odd",
       [](const Tensors& x) { return x[0].conv2d(x[1], x[2], {2, 1}, {2, 0}, {1, 2}, 2).tanh(); },
       {uniform({2, 4, 6, 7}, 60), uniform({4, 2, 3, 2}, 61, -1, 1), uniform({4}, 62)}},
      {"conv2d_twice", [](const Tensors& x) { return x[0].conv2d(x[1], std::nullopt, {1}, {1}).relu().conv2d(x[2]); },
       {uniform({1, 2, 5, 5}, 63), uniform({3, 2, 3, 3}, 64, -1, 1), uniform({1, 3, 2, 2}, 65, -1, 1)}},
      {"max_pool2d", [](const Tensors& x) { return x[0].max_pool2d({2}); }, {spread({1, 2, 4, 4}, 50)}},
      {"max_pool2d_odd", [](const Tensors& x) { return x[0].max_pool2d({2, 3}); }, {spread({1, 2, 5, 7}, 66)}},
      {"max_pool2d_overlap", [](const Tensors& x) { return x[0].max_pool2d({3}, {1}, {1}); }, {spread({1, 1, 4, 4}, 51)}},
      {"avg_pool2d", [](const Tensors& x) { return x[0].avg_pool2d({2}, {1}, {1}).square(); }, {uniform({1, 2, 3, 3}, 52)}},
      {"layernorm", [](const Tensors& x) { return x[0].layernorm() * x[1] + x[2]; },
       {uniform({3, 5}, 53), uniform({5}, 54), uniform({5}, 55)}},
      {"attention", [](const Tensors& x) { return x[0].scaled_dot_product_attention(x[1], x[2]); },
       {uniform({2, 3, 2}, 67), uniform({2, 4, 2}, 68), uniform({2, 4, 3}, 69)}},
      {"attention_causal", [](const Tensors& x) { return x[0].scaled_dot_product_attention(x[1], x[2], true); },
       {uniform({1, 2, 4, 3}, 70), uniform({1, 2, 4, 3}, 71), uniform({1, 2, 4, 3}, 72)}},
      {"cross_entropy", [](const Tensors& x) { return x[0].sparse_categorical_crossentropy(labels()); },
       {uniform({3, 4}, 56, -3, 3)}},
      {"cross_entropy_smoothing", [](const Tensors& x) { return x[0].sparse_categorical_crossentropy(labels(), 0.2); },
       {uniform({3, 4}, 57, -3, 3)}},
      {"bce_logits_mse",
       [](const Tensors& x) { return x[0].binary_crossentropy_logits(x[1].sigmoid()) + x[0].mse(x[1]); },
       {uniform({2, 3}, 58, -3, 3), uniform({2, 3}, 59)}},
  };
  return c;
}

}  // namespace

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, Float64) {
  auto& c = GetParam();
  EXPECT_TRUE(gradcheck(c.f, c.inputs));
}

INSTANTIATE_TEST_SUITE_P(Grad, GradCheck, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The checker itself: a wrong gradient is caught (detach hides x from autograd in one term).
TEST(GradCheck, DetectsWrongGradient) {
  Fn wrong = [](const Tensors& x) { return x[0] * x[0].detach(); };
  EXPECT_FALSE(gradcheck(wrong, {uniform({3}, 60, 0.5, 2)}));
}
