// tg::nn modules and layers: initialisation (bounds, seeded determinism), parameter and state
// naming, state-dict round trips and load errors, and layer values checked by hand
// (BatchNorm in train and eval with its running statistics, LayerNorm, RMSNorm, Embedding,
// Dropout, pooling, Sequential).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "library_device.h"
#include "test_util.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/schedule/match_matmul.h"
#include "tinygrad/schedule/schedule.h"

using namespace tg;
using namespace tg::nn;

namespace {

Tensor vec(std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); }

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "at " << i;
}

using tg::testutil::expect_error;

// Linear -> ReLU -> BatchNorm1d -> Linear, as a child "layers", plus a model-level parameter.
struct Net : Module {
  Sequential layers;
  Tensor scale;
  Net() {
    layers.emplace<Linear>(3, 4);
    layers.emplace<ReLU>();
    layers.emplace<BatchNorm1d>(4);
    layers.emplace<Linear>(4, 2, false);
    register_module("layers", layers);
    scale = Tensor::from_vector(std::vector<float>{1.5f}, {1});
    register_parameter("scale", scale);
  }
  Tensor forward(const Tensor& x) override { return layers(x) * scale; }
  std::string type_name() const override { return "Net"; }
};

}  // namespace

TEST(Init, LinearBoundsAndDeterminism) {
  Tensor::manual_seed(7);
  Linear a(16, 8);
  Tensor::manual_seed(7);
  Linear b(16, 8);
  Linear c(16, 8);  // next draws: different values
  auto wa = a.weight.to_vector<float>();
  EXPECT_EQ(a.weight.shape(), (Shape{8, 16}));
  ASSERT_TRUE(a.bias.has_value());
  EXPECT_EQ(a.bias->shape(), (Shape{8}));
  EXPECT_EQ(wa, b.weight.to_vector<float>());
  EXPECT_EQ(a.bias->to_vector<float>(), b.bias->to_vector<float>());
  EXPECT_NE(wa, c.weight.to_vector<float>());
  double bound = 1.0 / std::sqrt(16.0), lo = 1, hi = -1, sum = 0;
  for (float w : wa) {
    lo = std::min<double>(lo, w);
    hi = std::max<double>(hi, w);
    sum += w;
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.8 * bound);  // spread over the interval (128 draws)
  EXPECT_GT(hi, 0.8 * bound);
  EXPECT_NEAR(sum / 128, 0.0, 0.05);
  for (float v : a.bias->to_vector<float>()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_TRUE(a.weight.requires_grad());
  EXPECT_FALSE(Linear(2, 3, false).bias.has_value());
}

TEST(Init, Conv2dBoundsAndForward) {
  Tensor::manual_seed(1);
  Conv2d conv(4, 6, {3}, {1}, {1}, {1}, 2);
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 3}));
  double bound = 1.0 / std::sqrt(2.0 * 9.0);  // fan_in = in/groups * kh * kw
  for (float w : conv.weight.to_vector<float>()) EXPECT_LE(std::fabs(w), bound);
  for (float v : conv.bias->to_vector<float>()) EXPECT_LE(std::fabs(v), bound);
  Tensor y = conv(Tensor::ones({1, 4, 5, 5}));
  EXPECT_EQ(y.shape(), (Shape{1, 6, 5, 5}));
  // the centre pixel sees the whole kernel: sum of the group's weights + bias
  auto w = conv.weight.to_vector<float>();
  double want = conv.bias->to_vector<float>()[0];
  for (int i = 0; i < 18; i++) want += w[i];
  EXPECT_NEAR(y.to_vector<float>()[12], want, 1e-5);
  expect_error([&] { conv(Tensor::ones({1, 3, 5, 5})); }, {"Conv2d", "float32[1,3,5,5]", "[N, 4, H, W]"});
  expect_error([] { Conv2d(4, 6, {3}, {1}, {0}, {1}, 3); }, {"groups=3", "in_channels=4"});
}

TEST(Init, EmbeddingIsStandardNormal) {
  Tensor::manual_seed(3);
  Embedding e(100, 20);
  auto w = e.weight.to_vector<float>();
  double mean = std::accumulate(w.begin(), w.end(), 0.0) / w.size(), sq = 0;
  for (float v : w) sq += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(sq / w.size()), 1.0, 0.1);
}

TEST(Module, NamesAndListings) {
  Net net;
  std::vector<std::string> params, buffers;
  for (auto& [n, t] : net.named_parameters()) params.push_back(n);
  for (auto& [n, t] : net.named_buffers()) buffers.push_back(n);
  EXPECT_EQ(params, (std::vector<std::string>{"scale", "layers.0.weight", "layers.0.bias", "layers.2.weight",
                                              "layers.2.bias", "layers.3.weight"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"layers.2.running_mean", "layers.2.running_var",
                                               "layers.2.num_batches_tracked"}));
  EXPECT_EQ(net.num_parameters(), 1 + 12 + 4 + 4 + 4 + 8);
  auto sd = net.state_dict();
  EXPECT_EQ(sd.size(), 9u);
  EXPECT_EQ(sd.at("layers.2.num_batches_tracked").dtype(), DType::Int64);
  EXPECT_EQ(sd.at("layers.2.num_batches_tracked").shape(), Shape{});
  std::vector<std::string> mods;
  for (auto& [n, m] : net.named_modules()) mods.push_back(n + ":" + m->type_name());
  EXPECT_EQ(mods, (std::vector<std::string>{":Net", "layers:Sequential", "layers.0:Linear", "layers.1:ReLU",
                                            "layers.2:BatchNorm1d", "layers.3:Linear"}));
  // the listed pointers are the modules' own tensors
  EXPECT_EQ(net.named_parameters()[1].second, &static_cast<Linear&>(net.layers[0]).weight);
}

TEST(Module, TrainEvalReachesChildren) {
  Net net;
  EXPECT_TRUE(net.layers[2].is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.layers[2].is_training());
  net.train();
  EXPECT_TRUE(net.layers[2].is_training());
}

TEST(Module, StateDictRoundTrip) {
  Tensor x = vec({0.5f, -1, 2, 1, 0.25f, -0.5f, -2, 1, 1, 0, 3, -1}, {4, 3});
  Tensor::manual_seed(11);
  Net a;
  a(x);  // one training step of BatchNorm moves its running statistics
  a.eval();
  Tensor::manual_seed(12);
  Net b;
  b.eval();
  Tensor* w_before = b.named_parameters()[1].second;
  auto ya = a(x).to_vector<float>();
  EXPECT_NE(ya, b(x).to_vector<float>());
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(ya, b(x).to_vector<float>());
  EXPECT_EQ(b.named_parameters()[1].second, w_before);  // identity kept
  EXPECT_TRUE(w_before->requires_grad());
  EXPECT_EQ(b.state_dict().at("layers.2.num_batches_tracked").item<int64_t>(), 1);
}

TEST(Module, StateDictIsASnapshot) {
  Linear l(2, 2);
  auto sd = l.state_dict();
  auto before = sd.at("weight").to_vector<float>();
  l.weight.assign(l.weight * 2.0);
  EXPECT_EQ(sd.at("weight").to_vector<float>(), before);
  EXPECT_FALSE(sd.at("weight").requires_grad());
}

TEST(Module, LoadErrorsNameTheKeys) {
  Net net;
  auto good = net.state_dict();
  auto missing = good;
  missing.erase("layers.0.bias");
  expect_error([&] { net.load_state_dict(missing); }, {"Net", "missing keys", "'layers.0.bias'"});
  auto extra = good;
  extra.emplace("layers.9.weight", Tensor::zeros({1}));
  expect_error([&] { net.load_state_dict(extra); }, {"unexpected keys", "'layers.9.weight'"});
  auto bad_shape = good;
  bad_shape["layers.3.weight"] = Tensor::zeros({2, 5});
  expect_error([&] { net.load_state_dict(bad_shape); },
               {"mismatch for 'layers.3.weight'", "expected float32[2,4]", "got float32[2,5]"});
  auto bad_dtype = good;
  bad_dtype["scale"] = Tensor::zeros({1}, {.dtype = DType::Float64});
  expect_error([&] { net.load_state_dict(bad_dtype); }, {"'scale'", "got float64[1]"});
  // nothing was assigned by the failed loads; non-strict loads skip missing and unexpected keys
  auto w = net.state_dict().at("layers.3.weight").to_vector<float>();
  EXPECT_EQ(w, good.at("layers.3.weight").to_vector<float>());
  missing.emplace("extra", Tensor::zeros({1}));
  missing["scale"] = vec({4}, {1});
  net.load_state_dict(missing, false);
  EXPECT_EQ(net.scale.item<float>(), 4);
  expect_error([&] { net.load_state_dict(bad_shape, false); }, {"mismatch for 'layers.3.weight'"});
}

TEST(Module, RegistrationErrors) {
  struct Bad : Module {
    Tensor a, b;
    explicit Bad(int which) {
      register_parameter("a", a);
      if (which == 0) register_buffer("a", b);
      if (which == 1) register_parameter("x.y", b);
    }
  };
  expect_error([] { Bad(0); }, {"buffer name 'a'", "already registered"});
  expect_error([] { Bad(1); }, {"'x.y'", "must not contain '.'"});
  Bad ok(2);
  expect_error([&] { ok(Tensor::ones({1})); }, {"no forward", "float32[1]"});
  expect_error([] { Linear(3, 2)(Tensor::ones({2, 4})); }, {"Linear", "float32[2,4]", "in_features=3"});
}

TEST(Layers, LinearForwardAndGrad) {
  Linear l(2, 1);
  l.weight.assign(vec({2, -1}, {1, 2}));
  l.bias->assign(vec({0.5f}, {1}));
  Tensor x = vec({1, 2, 3, 4}, {2, 2});
  Tensor y = l(x);
  expect_near(y.to_vector<float>(), {0.5, 2.5});
  y.sum().backward();
  expect_near(l.weight.grad()->to_vector<float>(), {4, 6});
  expect_near(l.bias->grad()->to_vector<float>(), {2});
}

// Note [bias in the compute dtype]: forward_rounded gives y in the compute dtype, the bias rounded
// to it and added to the float32 sums before their rounding; on a device whose products run
// through its library that is one library product with the bias in its epilogue (beside the
// bias's rounding, a kernel of its own), with no pass over the output after it. Without a compute
// dtype it is forward().
TEST(Layers, LinearForwardRoundedAddsTheRoundedBiasInTheProduct) {
  auto bf = [](float v) { return bfloat_to_float(float_to_bfloat(v)); };
  Tensor::manual_seed(4);
  Linear l(40, 8);
  Tensor x = Tensor::uniform({16, 40}, -1, 1).realize();
  EXPECT_EQ(l.forward_rounded(x).to_vector<float>(), l(x).to_vector<float>());
  auto xs = x.to_vector<float>(), ws = l.weight.to_vector<float>(), bs = l.bias->to_vector<float>();
  l.set_compute_dtype(DType::BFloat16);
  Tensor y = l.forward_rounded(x);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  auto got = y.to_vector<float>();
  for (int n = 0; n < 16; n++)
    for (int o = 0; o < 8; o++) {
      float acc = 0;
      for (int k = 0; k < 40; k++) acc += bf(xs[n * 40 + k]) * bf(ws[o * 40 + k]);
      // within a bfloat16 ulp of the terms: the generated kernel rounds the sum before adding the
      // rounded bias, the library's epilogue after
      float want = bf(acc + bf(bs[o]));
      EXPECT_NEAR(got[n * 8 + o], want, (std::fabs(acc) + std::fabs(bs[o])) / 128 + 1e-6) << n << "," << o;
    }

  const std::string& dev = testutil::library_device();
  for (Tensor* p : l.parameters()) *p = p->to(dev).realize();
  std::vector<ScheduleItem> items = create_schedule({l.forward_rounded(x.to(dev).realize()).uop()});
  ASSERT_EQ(items.size(), 2u);  // the bias rounded, the product
  std::vector<DType> dtypes;
  for (auto& b : items[1].buffers) dtypes.push_back(b->dtype());
  std::optional<MatmulSpec> product = match_matmul(items[1].ast, dtypes);
  ASSERT_TRUE(product);
  EXPECT_TRUE(product->bias);
  EXPECT_EQ(product->name(), "matmul_bfloat16_16x8x40_bias");
}

// Note [compute dtype]: Linear and Conv2d multiply bfloat16-rounded operands (products and sums
// in float32), round the result to bfloat16 and return float32; the bias, the gradients the
// optimizer sees and the master weights stay float32.
TEST(Layers, ComputeDtypeRunsLinearAndConvInBFloat16) {
  auto bf = [](float v) { return bfloat_to_float(float_to_bfloat(v)); };
  Net net;
  net.set_compute_dtype(DType::BFloat16);
  for (auto& [name, m] : net.named_modules()) EXPECT_EQ(m->compute_dtype(), DType::BFloat16) << name;
  expect_error([&] { net.set_compute_dtype(DType::Int32); }, {"Net", "compute dtype", "int32"});

  Tensor::manual_seed(3);
  Linear l(40, 8);
  Tensor x = Tensor::uniform({16, 40}, -1, 1);
  auto xs = x.to_vector<float>(), ws = l.weight.to_vector<float>(), bs = l.bias->to_vector<float>();
  auto y32 = l(x).to_vector<float>();
  l.set_compute_dtype(DType::BFloat16);
  Tensor y = l(x);
  EXPECT_EQ(y.dtype(), DType::Float32);
  auto y16 = y.to_vector<float>();
  double max_diff = 0;
  for (int n = 0; n < 16; n++)
    for (int o = 0; o < 8; o++) {
      float acc = 0, mag = 0;
      for (int k = 0; k < 40; k++) {
        acc += bf(xs[n * 40 + k]) * bf(ws[o * 40 + k]);
        mag += std::fabs(xs[n * 40 + k] * ws[o * 40 + k]);
      }
      float want = bf(acc) + bs[o], got = y16[n * 8 + o];
      EXPECT_NEAR(got, want, std::fabs(acc) / 128 + 1e-6) << n << "," << o;  // one bf16 ulp
      double d = std::fabs(got - y32[n * 8 + o]);
      EXPECT_LE(d, 3 * mag / 256 + 1e-6) << n << "," << o;  // within bfloat16's rounding of the terms
      max_diff = std::max(max_diff, d);
    }
  EXPECT_GT(max_diff, 1e-4);  // really rounded: float32 alone differs by ~1e-7

  // gradients back in float32; the weight gradient is the sum of the rounded inputs, rounded
  y.sum().backward();
  ASSERT_TRUE(l.weight.grad() && l.bias->grad());
  EXPECT_EQ(l.weight.grad()->dtype(), DType::Float32);
  auto gw = l.weight.grad()->to_vector<float>();
  for (int k = 0; k < 40; k++) {
    float sum = 0;
    for (int n = 0; n < 16; n++) sum += bf(xs[n * 40 + k]);
    EXPECT_NEAR(gw[k], bf(sum), std::fabs(sum) / 128 + 1e-6) << k;
  }
  expect_near(l.bias->grad()->to_vector<float>(), std::vector<double>(8, 16.0));
  // the update lands on float32 master weights: values between bfloat16's
  Adam opt(l.parameters(), 1e-4);
  opt.step();
  EXPECT_EQ(l.weight.dtype(), DType::Float32);
  int off_grid = 0;
  for (float w : l.weight.to_vector<float>()) off_grid += bf(w) != w;
  EXPECT_GT(off_grid, 300);

  Conv2d c(3, 4, {3}, {1}, {1});
  Tensor img = Tensor::uniform({2, 3, 6, 6}, -1, 1);
  auto r32 = c(img).to_vector<float>();
  c.set_compute_dtype(DType::BFloat16);
  Tensor r = c(img);
  EXPECT_EQ(r.dtype(), DType::Float32);
  Tensor rounded = img.cast(DType::BFloat16).cast(DType::Float32)
                       .conv2d(c.weight.cast(DType::BFloat16).cast(DType::Float32), std::nullopt, {1}, {1});
  auto want = rounded.to_vector<float>(), bias = c.bias->to_vector<float>(), got = r.to_vector<float>();
  double conv_diff = 0;
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_NEAR(got[i], bf(want[i]) + bias[(i / 36) % 4], std::fabs(want[i]) / 128 + 1e-6) << i;
    conv_diff = std::max(conv_diff, static_cast<double>(std::fabs(got[i] - r32[i])));
  }
  EXPECT_GT(conv_diff, 1e-4);
  r.sum().backward();
  EXPECT_EQ(c.weight.grad()->dtype(), DType::Float32);
}

TEST(Layers, BatchNorm2dTrainAndEval) {
  // x[N=2, C=2, H=1, W=2]: channel 0 holds {1, 2, 3, 6}, channel 1 holds {0, 0, 4, 4}
  Tensor x = vec({1, 2, 0, 0, 3, 6, 4, 4}, {2, 2, 1, 2});
  BatchNorm2d bn(2);
  Tensor y = bn(x);
  // channel 0: mean 3, biased var (4+1+0+9)/4 = 3.5, unbiased 14/3; channel 1: mean 2, var 4, unbiased 16/3
  double s0 = 1 / std::sqrt(3.5 + 1e-5), s1 = 1 / std::sqrt(4 + 1e-5);
  expect_near(y.to_vector<float>(), {-2 * s0, -1 * s0, -2 * s1, -2 * s1, 0, 3 * s0, 2 * s1, 2 * s1});
  expect_near(bn.running_mean->to_vector<float>(), {0.3, 0.2});
  expect_near(bn.running_var->to_vector<float>(), {0.9 + 0.1 * 14 / 3.0, 0.9 + 0.1 * 16 / 3.0});
  EXPECT_EQ(bn.num_batches_tracked->item<int64_t>(), 1);
  // a second batch (x + 1): mean moves by 0.1 * (batch mean), var again with the unbiased batch var
  bn(x + 1.0);
  double rm0 = 0.9 * 0.3 + 0.1 * 4, rm1 = 0.9 * 0.2 + 0.1 * 3;
  double rv0 = 0.9 * (0.9 + 0.1 * 14 / 3.0) + 0.1 * 14 / 3.0, rv1 = 0.9 * (0.9 + 0.1 * 16 / 3.0) + 0.1 * 16 / 3.0;
  expect_near(bn.running_mean->to_vector<float>(), {rm0, rm1});
  expect_near(bn.running_var->to_vector<float>(), {rv0, rv1});
  EXPECT_EQ(bn.num_batches_tracked->item<int64_t>(), 2);
  // eval: running statistics, and they stay put
  bn.eval();
  bn.weight->assign(vec({2, 1}, {2}));
  bn.bias->assign(vec({0, -1}, {2}));
  auto ye = bn(x).to_vector<float>();
  std::vector<float> xs{1, 2, 0, 0, 3, 6, 4, 4};
  for (size_t i = 0; i < xs.size(); i++) {
    int c = (i / 2) % 2;
    double want = c == 0 ? 2 * (xs[i] - rm0) / std::sqrt(rv0 + 1e-5) : (xs[i] - rm1) / std::sqrt(rv1 + 1e-5) - 1;
    EXPECT_NEAR(ye[i], want, 1e-5) << i;
  }
  EXPECT_EQ(bn.num_batches_tracked->item<int64_t>(), 2);
}

TEST(Layers, BatchNorm1dGradAndErrors) {
  BatchNorm1d bn(2);
  Tensor x = vec({1, 0, 3, 4}, {2, 2});
  Tensor y = bn(x);  // each channel has two values: normalised to -1, +1 (up to eps)
  double s = 1 / std::sqrt(1 + 1e-5), s1 = 2 / std::sqrt(4 + 1e-5);
  expect_near(y.to_vector<float>(), {-s, -s1, s, s1});
  (y * vec({1, 2, 3, 4}, {2, 2})).sum().backward();
  expect_near(bn.weight->grad()->to_vector<float>(), {-s + 3 * s, -2 * s1 + 4 * s1});
  expect_near(bn.bias->grad()->to_vector<float>(), {4, 6});
  expect_error([&] { bn(Tensor::ones({2, 3})); }, {"BatchNorm1d", "float32[2,3]", "C=2"});
  expect_error([&] { bn(Tensor::ones({1, 2})); }, {"more than one value per channel"});
  BatchNorm1d plain(2, 1e-5, 0.1, false, false);
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_TRUE(plain.named_buffers().empty());
  plain.eval();  // no running stats: batch statistics in eval too
  expect_near(plain(x).to_vector<float>(), {-s, -s1, s, s1});
}

// The input gradient flows through the batch statistics (which the forward realizes early):
// d/dx sum(u * y) = (u - mean(u) - xhat * mean(u * xhat)) / sigma per channel.
TEST(Layers, BatchNormInputGradThroughBatchStats) {
  BatchNorm1d bn(1);
  std::vector<double> xs{1, 2, 4}, u{1, -2, 0.5};
  Tensor x = Tensor::from_vector(xs, {3, 1}, {.dtype = DType::Float32}).requires_grad_();
  (bn(x) * Tensor::from_vector(u, {3, 1}, {.dtype = DType::Float32})).sum().backward();
  double mu = 7.0 / 3, var = 0;
  for (double v : xs) var += (v - mu) * (v - mu) / 3;
  double sigma = std::sqrt(var + 1e-5), mean_u = 0, mean_ux = 0;
  std::vector<double> xhat;
  for (size_t i = 0; i < 3; i++) {
    xhat.push_back((xs[i] - mu) / sigma);
    mean_u += u[i] / 3;
    mean_ux += u[i] * xhat[i] / 3;
  }
  std::vector<double> want;
  for (size_t i = 0; i < 3; i++) want.push_back((u[i] - mean_u - xhat[i] * mean_ux) / sigma);
  expect_near(x.grad()->to_vector<float>(), want, 1e-4);
}

TEST(Layers, LayerNormAndRMSNorm) {
  Tensor x = vec({1, 2, 3, -1, 0, 5}, {2, 3});
  LayerNorm ln({3});
  // row 0: mean 2, var 2/3; row 1: mean 4/3, var ((7/3)^2+(4/3)^2+(11/3)^2)/3 = 62/9/3
  double s0 = 1 / std::sqrt(2.0 / 3 + 1e-5), v1 = (49.0 + 16 + 121) / 27, s1 = 1 / std::sqrt(v1 + 1e-5);
  expect_near(ln(x).to_vector<float>(), {-s0, 0, s0, -7.0 / 3 * s1, -4.0 / 3 * s1, 11.0 / 3 * s1}, 1e-4);
  ln.weight->assign(vec({1, 2, 3}, {3}));
  ln.bias->assign(vec({0, 0, 1}, {3}));
  expect_near(ln(x).to_vector<float>(), {-s0, 0, 3 * s0 + 1, -7.0 / 3 * s1, -8.0 / 3 * s1, 11.0 * s1 + 1}, 1e-4);
  LayerNorm ln2({2, 3}, 1e-5, false);
  EXPECT_TRUE(ln2.named_parameters().empty());
  EXPECT_EQ(ln2(x).shape(), (Shape{2, 3}));
  expect_error([&] { ln(Tensor::ones({3, 2})); }, {"LayerNorm", "float32[3,2]", "[3]"});

  RMSNorm rms(3, 1e-6);
  double r0 = 1 / std::sqrt(14.0 / 3 + 1e-6), r1 = 1 / std::sqrt(26.0 / 3 + 1e-6);
  rms.weight.assign(vec({1, 1, 2}, {3}));
  expect_near(rms(x).to_vector<float>(), {r0, 2 * r0, 6 * r0, -r1, 0, 10 * r1});
}

TEST(Layers, EmbeddingLooksUpRows) {
  Embedding e(4, 2);
  e.weight.assign(vec({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}));
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{3, 0, 1, 1}, {2, 2});
  Tensor y = e(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{30, 31, 0, 1, 10, 11, 10, 11}));
  y.sum().backward();  // row counts: 1, 2, 0, 1
  EXPECT_EQ(e.weight.grad()->to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 0, 0, 1, 1}));
  Tensor one = Tensor::from_vector(std::vector<int64_t>{2}, {});
  EXPECT_EQ(e(one).to_vector<float>(), (std::vector<float>{20, 21}));
  expect_error([&] { e(Tensor::ones({2})); }, {"Embedding", "integer", "float32[2]"});
}

TEST(Layers, DropoutOnlyInTraining) {
  Tensor::manual_seed(5);
  Dropout d(0.25);
  Tensor x = Tensor::ones({1000});
  auto y = d(x).to_vector<float>();
  int zeros = 0;
  for (float v : y) {
    if (v == 0) zeros++;
    else EXPECT_NEAR(v, 1 / 0.75, 1e-6);
  }
  EXPECT_NEAR(zeros / 1000.0, 0.25, 0.05);
  d.eval();
  EXPECT_EQ(d(x).to_vector<float>(), x.to_vector<float>());
  expect_error([] { Dropout(1.0); }, {"Dropout", "[0, 1)"});
}

TEST(Layers, SequentialPoolingFlatten) {
  Sequential net(std::make_unique<MaxPool2d>(std::vector<int64_t>{2}), std::make_unique<Flatten>());
  Tensor x = vec({1, 2, 5, 6, 3, 4, 7, 8, 0, 0, 0, 9, 0, 0, 0, 0}, {1, 1, 4, 4});
  Tensor y = net(x);
  EXPECT_EQ(y.shape(), (Shape{1, 4}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4, 8, 0, 9}));
  AvgPool2d avg({2});
  EXPECT_EQ(avg(x).to_vector<float>(), (std::vector<float>{2.5, 6.5, 0, 2.25}));
  Sequential act;
  act.emplace<GELU>();
  act.emplace<SiLU>();
  act.emplace<Identity>();
  Tensor z = vec({-1, 0, 2}, {3});
  expect_near(act(z).to_vector<float>(), [&] {
    std::vector<double> out;
    for (double v : {-1.0, 0.0, 2.0}) {
      double g = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      out.push_back(g / (1 + std::exp(-g)));
    }
    return out;
  }(), 1e-4);
  EXPECT_EQ(act.size(), 3u);
  expect_error([&] { act[3]; }, {"Sequential", "index 3", "3 layers"});
}
