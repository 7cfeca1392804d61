// Backend op tests, part 1: creation ops, elementwise ops (unary, binary with broadcasting,
// comparisons, logic, integer semantics), casts between all dtypes, empty tensors. Every op runs
// on the CPU device (once per CPU compiler) and is compared, forward and backward, with the
// float64 reference interpreter on the same lazy graph. A few hand-checked values test the
// reference itself.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/lazy.h"
#include "tinygrad/runtime/cpu.h"

using namespace tg;
using namespace tg::testutil;

namespace {

std::vector<double> ref_values(const Tensor& t) { return reference_eval(t.uop()).data; }
using V = std::vector<float>;
Tensor vec(std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); }
Tensor ivec(std::vector<int32_t> v, Shape s) { return Tensor::from_vector(v, s); }

void expect_values(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) {
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      EXPECT_TRUE(std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i]) << "at " << i << ": " << got[i];
    } else {
      EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
    }
  }
}

}  // namespace

// ---- the oracle itself, against known math ----

TEST(Reference, HandCheckedValues) {
  Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(ref_values(a.sum(0)), {5, 7, 9});
  expect_values(ref_values(a.sum(1, true)), {6, 15});
  expect_values(ref_values(a.max(0)), {4, 5, 6});
  expect_values(ref_values(a.prod()), {720});
  expect_values(ref_values(a.permute({1, 0})), {1, 4, 2, 5, 3, 6});
  expect_values(ref_values(a.flip({1})), {3, 2, 1, 6, 5, 4});
  expect_values(ref_values(a.pad({{1, 0}, {0, 1}})), {0, 0, 0, 0, 1, 2, 3, 0, 4, 5, 6, 0});
  expect_values(ref_values(a.shrink({{1, 2}, {1, 3}})), {5, 6});
  expect_values(ref_values(vec({1, 2}, {2, 1}).expand({2, 3})), {1, 1, 1, 2, 2, 2});
  expect_values(ref_values(vec({0, 1, 2}, {3}).exp()), {1, M_E, M_E * M_E}, 1e-6);  // 1/ln2 is a float32 literal
  expect_values(ref_values(vec({0.5f}, {1}).sin()), {std::sin(0.5)}, 1e-12);
  expect_values(ref_values(a.matmul(a.T())), {14, 32, 32, 77});
  expect_values(ref_values(vec({0, 0, 0}, {3}).softmax()), {1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-12);
  expect_values(ref_values(vec({1, 2, 3, 4}, {4}).cumsum(0)), {1, 3, 6, 10});
  expect_values(ref_values(vec({2, 4, 4, 4, 5, 5, 7, 9}, {8}).std({}, false, 0)), {2.0}, 1e-12);
}

TEST(Reference, IntegerAndCastSemantics) {
  Tensor a = ivec({7, -7, 7, -7}, {4}), b = ivec({2, 2, -2, -2}, {4});
  expect_values(ref_values(a.idiv(b)), {3, -3, -3, 3});
  expect_values(ref_values(a.mod(b)), {1, -1, 1, -1});
  expect_values(ref_values(ivec({300, -1, 256, 255}, {4}).cast(DType::UInt8)), {44, 255, 0, 255});
  expect_values(ref_values(vec({-2.7f, 2.7f, -0.5f, 0.f}, {4}).cast(DType::Int32)), {-2, 2, 0, 0});
  expect_values(ref_values(vec({-2.7f, 0.f, 1e-30f, NAN}, {4}).cast(DType::Bool)), {1, 0, 1, 1});
  Tensor big = ivec({2147483647, -2147483647 - 1}, {2});
  expect_values(ref_values(big + ivec({1, -1}, {2})), {-2147483648.0, 2147483647.0});  // wraps like C
  Tensor u = Tensor::from_vector(std::vector<uint8_t>{200, 10}, {2});
  expect_values(ref_values(u + Tensor::from_vector(std::vector<uint8_t>{100, 250}, {2})), {44, 4});
  expect_values(ref_values(ivec({12, 10}, {2}).cast(DType::Bool).logical_and(ivec({3, 0}, {2}))), {1, 0});
  expect_values(ref_values(vec({1.0f / 3.0f}, {1}).cast(DType::Float16)), {0.333251953125});
  expect_values(ref_values(vec({1.0f / 3.0f}, {1}).cast(DType::BFloat16)), {0.333984375});
  expect_values(ref_values(vec({70000.f}, {1}).cast(DType::Float16)), {INFINITY});
  expect_values(ref_values(vec({1.0f}, {1}).bitcast(DType::Int32)), {1065353216});
  // the raw primitives: IDIV/MOD on int64, CMPNE on NaN, MAX as a > b ? a : b
  auto c = [](double v, DType t) { return lazy::constant(v, t, "CPU", {}); };
  EXPECT_EQ(reference_eval(lazy::alu(Op::IDIV, c(-9, DType::Int64), c(4, DType::Int64))).data[0], -2);
  EXPECT_EQ(reference_eval(lazy::alu(Op::MOD, c(-9, DType::Int64), c(4, DType::Int64))).data[0], -1);
  EXPECT_EQ(reference_eval(lazy::alu(Op::CMPNE, c(NAN, DType::Float32), c(NAN, DType::Float32))).data[0], 1);
  EXPECT_EQ(reference_eval(lazy::alu(Op::XOR, c(6, DType::Int32), c(3, DType::Int32))).data[0], 5);
  EXPECT_EQ(reference_eval(lazy::alu(Op::SHL, c(3, DType::Int32), c(4, DType::Int32))).data[0], 48);
}

TEST(Reference, ReadsRealizedBuffers) {
  Tensor a = vec({1, 2, 3}, {3});
  Tensor b = (a * 2.0).contiguous().realize();
  EXPECT_TRUE(b.uop()->realized);
  expect_values(ref_values(b + 1.0), {3, 5, 7});
  expect_values(reference_eval((b + 1.0).uop(), {.use_realized = false}).data, {3, 5, 7});
}

TEST(Ops, DeviceHandCheckedValues) {
  Tensor x = vec({-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 0.4f, 0.6f}, {8});
  expect_values(x.round().to_vector<double>(), {-2, -2, -0, 0, 2, 2, 0, 1});
  expect_values(x.floor().to_vector<double>(), {-3, -2, -1, 0, 1, 2, 0, 0});
  expect_values(x.ceil().to_vector<double>(), {-2, -1, -0, 1, 2, 3, 1, 1});
  expect_values(vec({0, 1}, {2}).sigmoid().to_vector<double>(), {0.5, 1 / (1 + std::exp(-1.0))}, 1e-6);
  expect_values(vec({-2, 3}, {2}).pow(vec({3, 0.5f}, {2})).to_vector<double>(), {-8, std::sqrt(3.0)}, 1e-5);
  expect_values(vec({-2}, {1}).pow(0.5).to_vector<double>(), {NAN});
  expect_values(vec({1, 1}, {2}).gelu().to_vector<double>(), {0.8411919906, 0.8411919906}, 1e-6);
  expect_values(vec({-3, 0.5f, 7}, {3}).clip(-1, 2).to_vector<double>(), {-1, 0.5, 2});
  expect_values(ivec({7, -7}, {2}).idiv(ivec({2, 2}, {2})).to_vector<double>(), {3, -3});
  expect_values(ivec({300, -1}, {2}).cast(DType::UInt8).to_vector<double>(), {44, 255});
}

// ---- creation ----

TEST(Ops, Creation) {
  EXPECT_EQ(Tensor::zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0));
  EXPECT_EQ(Tensor::ones({4}, {.dtype = DType::Int32}).to_vector<int32_t>(), std::vector<int32_t>(4, 1));
  EXPECT_EQ(Tensor::full({2, 2}, 3.5).to_vector<float>(), std::vector<float>(4, 3.5));
  EXPECT_EQ(Tensor::full({3}, 7, {.dtype = DType::UInt8}).dtype(), DType::UInt8);
  EXPECT_EQ(Tensor::arange(5).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(5).dtype(), DType::Int32);
  EXPECT_EQ(Tensor::arange(1, 2, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(Tensor::arange(5, 0, -2).to_vector<float>(), (std::vector<float>{5, 3, 1}));
  EXPECT_EQ(Tensor::arange(3, 3).numel(), 0);
  EXPECT_EQ(Tensor::linspace(0, 1, 5).to_vector<float>(), (std::vector<float>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(Tensor::linspace(2, 2, 1).to_vector<float>(), (std::vector<float>{2}));
  EXPECT_EQ(Tensor::eye(3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  Tensor a = vec({1, 2, 3}, {3});
  EXPECT_EQ(a.zeros_like().to_vector<float>(), std::vector<float>(3, 0));
  EXPECT_EQ(a.ones_like().to_vector<float>(), std::vector<float>(3, 1));
  EXPECT_EQ(a.full_like(-2).to_vector<float>(), std::vector<float>(3, -2));
  EXPECT_EQ(Tensor::scalar(2.5).shape(), Shape{});
  EXPECT_TRUE(match(Tensor::eye(4) * 2.0 + Tensor::arange(0, 4, 1).reshape({4, 1})));
  EXPECT_TRUE(match(Tensor::full({3, 2}, 2, {.dtype = DType::Float16}) + Tensor::ones({3, 2}, {.dtype = DType::Float16})));
}

TEST(Ops, Random) {
  Tensor::manual_seed(7);
  auto a = Tensor::rand({4000}).to_vector<double>();
  auto n = Tensor::randn({4000}).to_vector<double>();
  auto u = Tensor::uniform({4000}, -3, 5).to_vector<double>();
  auto r = Tensor::randint({4000}, -2, 3).to_vector<double>();
  Tensor::manual_seed(7);
  EXPECT_EQ(Tensor::rand({4000}).to_vector<double>(), a);
  EXPECT_EQ(Tensor::randn({4000}).to_vector<double>(), n);
  Tensor::manual_seed(8);
  EXPECT_NE(Tensor::rand({4000}).to_vector<double>(), a);
  auto stats = [](const std::vector<double>& v) {
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= static_cast<double>(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::pair{m, std::sqrt(s / static_cast<double>(v.size()))};
  };
  for (double x : a) EXPECT_TRUE(x >= 0 && x < 1);
  for (double x : u) EXPECT_TRUE(x >= -3 && x < 5);
  std::vector<int> counts(5, 0);
  for (double x : r) {
    ASSERT_TRUE(x >= -2 && x < 3 && x == std::trunc(x)) << x;
    counts[static_cast<int>(x) + 2]++;
  }
  for (int c : counts) EXPECT_GT(c, 600);  // each of 5 values ~800 times
  auto [ma, sa] = stats(a);
  EXPECT_NEAR(ma, 0.5, 0.02);
  EXPECT_NEAR(sa, std::sqrt(1.0 / 12), 0.02);
  auto [mn, sn] = stats(n);
  EXPECT_NEAR(mn, 0, 0.05);
  EXPECT_NEAR(sn, 1, 0.05);
  auto [mu, su] = stats(u);
  EXPECT_NEAR(mu, 1, 0.15);
  EXPECT_NEAR(su, 8 / std::sqrt(12.0), 0.1);
  EXPECT_EQ(Tensor::randint({3}, 0, 5).dtype(), DType::Int32);
  EXPECT_EQ(Tensor::rand({2}, {.dtype = DType::Float16}).dtype(), DType::Float16);
}

// Note [random numbers on the device]: rand's values are Philox 4x32-10 words exactly (checked
// against a host Philox with the Random123 known answer), the same on every device.
std::array<uint32_t, 4> philox_host(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k = {k[0] + 0x9E3779B9u, k[1] + 0xBB67AE85u};
  }
  return c;
}

TEST(Ops, RandIsPhiloxOnTheDevice) {
  EXPECT_EQ(philox_host({0, 0, 0, 0}, {0, 0}), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  uint64_t seed = 0x123456789abcdefull;
  Tensor::manual_seed(seed);
  Tensor::rand({3});  // draw 0
  auto got = Tensor::rand({10}).to_vector<float>();  // draw 1
  for (uint32_t i = 0; i < 10; i++) {
    auto w = philox_host({i / 4, 0, 1, 0x80000000u}, {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    EXPECT_EQ(got[i], static_cast<float>(w[i % 4] >> 8) / 16777216.0f) << "value " << i;
  }
  // the same draw of the same seed on the CPU: the same values
  Tensor::manual_seed(seed);
  auto here = Tensor::rand({10}).to_vector<float>();
  Tensor::manual_seed(seed);
  EXPECT_EQ(Tensor::rand({10}, {.device = "CPU"}).to_vector<float>(), here);
}

TEST(Ops, Bitwise) {
  Tensor a = Tensor::from_vector(std::vector<int32_t>{0, 1, 6, -8, 255, 1 << 20}, {6});
  Tensor b = Tensor::from_vector(std::vector<int32_t>{3, 3, 5, 7, 15, -1}, {6});
  EXPECT_EQ(a.bitwise_and(b).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 4, 0, 15, 1 << 20}));
  EXPECT_EQ(a.bitwise_or(b).to_vector<int32_t>(), (std::vector<int32_t>{3, 3, 7, -1, 255, -1}));
  EXPECT_EQ(a.bitwise_xor(b).to_vector<int32_t>(), (std::vector<int32_t>{3, 2, 3, -1, 240, ~(1 << 20)}));
  EXPECT_EQ(a.shift_left(3).to_vector<int32_t>(), (std::vector<int32_t>{0, 8, 48, -64, 2040, 1 << 23}));
  EXPECT_EQ(a.shift_right(2).to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 1, -2, 63, 1 << 18}));
  EXPECT_TRUE(match_all({a.bitwise_xor(b), a.shift_left(1)}));
  testutil::expect_error([&] { a.float_().bitwise_and(b); }, {"bitwise_and: needs integer tensors"});
  testutil::expect_error([&] { a.shift_left(32); }, {"shift_left: shift by 32 bits is outside int32"});
}

// ---- unary ops, forward and backward ----

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo, hi;
  std::function<double(double)> host;  // the same math on the host, independent of the engine
};
void PrintTo(const UnaryCase& c, std::ostream* os) { *os << c.name; }

class Unary : public ::testing::TestWithParam<UnaryCase> {};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return -x; }, -2, 2, [](double x) { return -x; }},
      {"exp", [](const Tensor& x) { return x.exp(); }, -2, 2, [](double x) { return std::exp(x); }},
      {"exp2", [](const Tensor& x) { return x.exp2(); }, -2, 2, [](double x) { return std::exp2(x); }},
      {"log", [](const Tensor& x) { return x.log(); }, 0.1, 3, [](double x) { return std::log(x); }},
      {"log2", [](const Tensor& x) { return x.log2(); }, 0.1, 3, [](double x) { return std::log2(x); }},
      {"sqrt", [](const Tensor& x) { return x.sqrt(); }, 0.1, 3, [](double x) { return std::sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return x.rsqrt(); }, 0.1, 3, [](double x) { return 1 / std::sqrt(x); }},
      {"reciprocal", [](const Tensor& x) { return x.reciprocal(); }, 0.5, 3, [](double x) { return 1 / x; }},
      {"sin", [](const Tensor& x) { return x.sin(); }, -4, 4, [](double x) { return std::sin(x); }},
      {"cos", [](const Tensor& x) { return x.cos(); }, -4, 4, [](double x) { return std::cos(x); }},
      {"tan", [](const Tensor& x) { return x.tan(); }, -1.2, 1.2, [](double x) { return std::tan(x); }},
      {"tanh", [](const Tensor& x) { return x.tanh(); }, -3, 3, [](double x) { return std::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return x.sigmoid(); }, -4, 4, [](double x) { return 1 / (1 + std::exp(-x)); }},
      {"relu", [](const Tensor& x) { return x.relu(); }, -2, 2, [](double x) { return x > 0 ? x : 0; }},
      {"leaky_relu", [](const Tensor& x) { return x.leaky_relu(0.1); }, -2, 2, [](double x) { return x > 0 ? x : 0.1 * x; }},
      {"gelu", [](const Tensor& x) { return x.gelu(); }, -3, 3, [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }},
      {"silu", [](const Tensor& x) { return x.silu(); }, -3, 3, [](double x) { return x / (1 + std::exp(-x)); }},
      {"abs", [](const Tensor& x) { return x.abs(); }, -2, 2, [](double x) { return std::fabs(x); }},
      {"sign", [](const Tensor& x) { return x.sign(); }, -2, 2, [](double x) { return double((x > 0) - (x < 0)); }},
      {"square", [](const Tensor& x) { return x.square(); }, -2, 2, [](double x) { return x * x; }},
      {"trunc", [](const Tensor& x) { return x.trunc(); }, -3, 3, [](double x) { return std::trunc(x); }},
      {"floor", [](const Tensor& x) { return x.floor(); }, -3, 3, [](double x) { return std::floor(x); }},
      {"ceil", [](const Tensor& x) { return x.ceil(); }, -3, 3, [](double x) { return std::ceil(x); }},
      {"round", [](const Tensor& x) { return x.round(); }, -3, 3, [](double x) { return std::nearbyint(x); }},
      {"clip", [](const Tensor& x) { return x.clip(-0.5, 1.0); }, -2, 2, [](double x) { return std::min(1.0, std::max(-0.5, x)); }},
      {"pow_2_5", [](const Tensor& x) { return x.pow(2.5); }, 0.1, 2, [](double x) { return std::pow(x, 2.5); }},
      {"pow_3", [](const Tensor& x) { return x.pow(3); }, -2, 2, [](double x) { return x * x * x; }},
      {"pow_neg1", [](const Tensor& x) { return x.pow(-1); }, 0.5, 2, [](double x) { return 1 / x; }},
      {"pow_half", [](const Tensor& x) { return x.pow(0.5); }, 0.1, 2, [](double x) { return std::sqrt(x); }},
      {"pow_neg_base_int", [](const Tensor& x) { return x.pow(-2.0); }, -2, -0.5, [](double x) { return 1 / (x * x); }},
      {"add_scalar", [](const Tensor& x) { return 1.5 - x * 3.0 + 2.0 / x; }, 0.5, 2, [](double x) { return 1.5 - 3 * x + 2 / x; }},
      {"isnan", [](const Tensor& x) { return x.log().isnan(); }, -1, 1, [](double x) { return double(x < 0); }},
      {"isinf", [](const Tensor& x) { return (x * 0.0).reciprocal().isinf(); }, -1, 1, [](double) { return 1.0; }},
      {"logical_not", [](const Tensor& x) { return (x > 0).logical_not(); }, -1, 1, [](double x) { return double(x <= 0); }},
      {"where_scalar", [](const Tensor& x) { return (x > 0.2).where(1.5, -2.0); }, -1, 1, [](double x) { return x > 0.2 ? 1.5 : -2.0; }},
  };
  return cases;
}

TEST_P(Unary, Float32) {
  const auto& c = GetParam();
  Tensor x = rnd({3, 7}, 11, c.lo, c.hi);
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0]); }, {x}));
  // the composition itself, against the host's math
  auto xv = x.to_vector<double>(), y = c.f(x).to_vector<double>();
  for (size_t i = 0; i < xv.size(); i++) EXPECT_NEAR(y[i], c.host(xv[i]), 1e-6 + 1e-5 * std::fabs(y[i])) << "x=" << xv[i];
}

INSTANTIATE_TEST_SUITE_P(Ops, Unary, ::testing::ValuesIn(unary_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Other float types. Half types compute each op in float32 and round back, the reference rounds
// only at casts.
class UnaryHalf : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(UnaryHalf, ForwardBackward) {
  auto [name, dt] = GetParam();
  for (auto& c : unary_cases()) {
    if (std::string(c.name) != name) continue;
    Tensor x = rnd({2, 5}, 12, c.lo, c.hi, dt);
    EXPECT_FALSE(narrows_float64(c.f(x))) << name << " computes float64 in float32";
    EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0]); }, {x})) << name << " " << dtype_name(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryHalf,
                         ::testing::Combine(::testing::Values("exp", "log", "sqrt", "sin", "tanh", "sigmoid", "relu",
                                                              "gelu", "reciprocal", "square", "cos", "pow_2_5"),
                                            ::testing::Values(DType::Float16, DType::BFloat16, DType::Float64)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param));
                         });

// Compositions keep a float input's dtype (float64 stays exact, half types stay half).
TEST(Ops, FloatDtypeIsKept) {
  for (DType dt : {DType::Float16, DType::BFloat16, DType::Float64}) {
    Tensor x = rnd({4}, 13, 0.5, 1.5, dt);
    for (auto& c : unary_cases()) {
      Tensor y = c.f(x);
      if (is_float(y.dtype()) && std::string(c.name) != "where_scalar") {  // where(double, double): float32
        EXPECT_EQ(y.dtype(), dt) << c.name << " on " << dtype_name(dt);
      }
    }
  }
  Tensor one = Tensor::from_vector(std::vector<double>{1.0}, {1});
  EXPECT_NEAR(one.exp().item<double>(), M_E, 1e-14);
  EXPECT_NEAR(one.tanh().item<double>(), std::tanh(1.0), 1e-14);
  EXPECT_NEAR(one.cos().item<double>(), std::cos(1.0), 1e-14);
}

TEST(Ops, UnaryOnIntegers) {
  Tensor i = ivec({-3, -1, 0, 2, 5}, {5});
  EXPECT_TRUE(match_all({-i, i.abs(), i.sign(), i.square(), i.exp(), i.sqrt().isnan(), i.float_().sin(), i.trunc(),
                         i.clip(-1, 3), i.cast(DType::Bool).logical_not()}));
  EXPECT_EQ(i.abs().dtype(), DType::Int32);
  EXPECT_EQ(i.exp().dtype(), DType::Float32);
  Tensor b = Tensor::from_vector(std::vector<int32_t>{0, 1, 1}, {3}).cast(DType::Bool);
  EXPECT_TRUE(match_all({-b, b.abs(), b.logical_not()}));
}

// ---- binary ops with broadcasting ----

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> f;
  double lo, hi;
  std::function<double(double, double)> host;  // the math on the host (mod: floored, as Python)
};
void PrintTo(const BinaryCase& c, std::ostream* os) { *os << c.name; }

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, -2, 2, [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -2, 2, [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -2, 2, [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, 0.5, 2, [](double a, double b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); }, -2, 2, [](double a, double b) { return std::max(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); }, -2, 2, [](double a, double b) { return std::min(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return a.pow(b); }, 0.2, 2, [](double a, double b) { return std::pow(a, b); }},
      {"mod", [](const Tensor& a, const Tensor& b) { return a.mod(b + 3.0); }, -2, 2, [](double a, double b) { return a - std::floor(a / (b + 3)) * (b + 3); }},
      {"where", [](const Tensor& a, const Tensor& b) { return (a > b).where(a * 2.0, b); }, -2, 2, [](double a, double b) { return a > b ? 2 * a : b; }},
  };
  return cases;
}

using Shapes = std::pair<Shape, Shape>;
class Binary : public ::testing::TestWithParam<std::tuple<BinaryCase, Shapes>> {};

TEST_P(Binary, Float32) {
  auto& [c, shapes] = GetParam();
  Tensor a = rnd(shapes.first, 21, c.lo, c.hi), b = rnd(shapes.second, 22, c.lo, c.hi);
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0], in[1]); }, {a, b}));
  Tensor y = c.f(a, b);
  auto av = a.broadcast_to(y.shape()).to_vector<double>(), bv = b.broadcast_to(y.shape()).to_vector<double>();
  auto yv = y.to_vector<double>();
  for (size_t i = 0; i < yv.size(); i++)
    EXPECT_NEAR(yv[i], c.host(av[i], bv[i]), 1e-6 + 1e-5 * std::fabs(yv[i])) << av[i] << ", " << bv[i];
}

INSTANTIATE_TEST_SUITE_P(Ops, Binary,
                         ::testing::Combine(::testing::ValuesIn(binary_cases()),
                                            ::testing::Values(Shapes{{3, 4}, {3, 4}},    // same shape
                                                              Shapes{{3, 1}, {1, 4}},    // size-1 dims
                                                              Shapes{{2, 3, 4}, {4}},    // missing dims
                                                              Shapes{{}, {2, 3}})),      // scalar
                         [](const auto& info) {
                           auto& s = std::get<1>(info.param);
                           std::string n = std::string(std::get<0>(info.param).name) + "_";
                           for (auto d : s.first) n += std::to_string(d);
                           n += "_";
                           for (auto d : s.second) n += std::to_string(d);
                           return n;
                         });

TEST(Ops, BinaryHalfTypes) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    for (auto& c : binary_cases()) {
      Tensor a = rnd({2, 3}, 23, c.lo, c.hi, dt), b = rnd({3}, 24, c.lo, c.hi, dt);
      EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0], in[1]); }, {a, b}))
          << c.name << " " << dtype_name(dt);
    }
  }
  // float16 + bfloat16 promotes to float32; half + float32 to float32
  Tensor h = rnd({3}, 25, -1, 1, DType::Float16), b = rnd({3}, 26, -1, 1, DType::BFloat16);
  EXPECT_EQ((h + b).dtype(), DType::Float32);
  EXPECT_TRUE(match_all({h + b, h * rnd({3}, 27)}));
}

TEST(Ops, PowEdgeCases) {
  Tensor base = vec({-2, -2, -2, 0, 0, 2, -1.5f, 3}, {8});
  Tensor ex = vec({2, 3, 0.5f, 0, 2, -1, 3, 0}, {8});
  EXPECT_TRUE(match(base.pow(ex)));
  expect_values(base.pow(ex).to_vector<double>(), {4, -8, NAN, 1, 0, 0.5, -3.375, 1}, 1e-5);
}

// ---- comparisons and logic (inputs with exact ties) ----

TEST(Ops, Comparisons) {
  Tensor a = vec({-1, 0, 1, 2, 2, 3}, {2, 3}), b = vec({0, 0, 2}, {3});
  Tensors outs{a < b, a > b, a.lt(b), a.le(b), a.gt(b), a.ge(b), a.eq(b), a.ne(b), a == b, a < 1.0, a > 1.0};
  EXPECT_TRUE(match_all(outs));
  for (auto& o : outs) EXPECT_EQ(o.dtype(), DType::Bool);
  EXPECT_EQ(a.le(b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
  Tensor i = ivec({-1, 0, 5}, {3}), j = ivec({0, 0, 4}, {3});
  EXPECT_TRUE(match_all({i < j, i.ge(j), i.eq(j), i.ne(j), i.lt(a.shrink({{0, 1}, {0, 3}}).reshape({3}))}));
  Tensor u = Tensor::from_vector(std::vector<uint8_t>{0, 200, 255}, {3});
  EXPECT_TRUE(match_all({u < Tensor::from_vector(std::vector<uint8_t>{1, 100, 255}, {3}), u.gt(i)}));
  Tensor nan = vec({NAN, 1}, {2});
  EXPECT_TRUE(match_all({nan.eq(nan), nan.ne(nan), nan < 1.0, nan.isnan()}));
}

TEST(Ops, Logical) {
  Tensor p = vec({0, 0, 1, 1}, {4}) > 0.5, q = vec({0, 1, 0, 1}, {4}) > 0.5;
  Tensors outs{p.logical_and(q), p.logical_or(q), p.logical_xor(q), p.logical_not(), p + q, p * q, p.maximum(q),
               p.minimum(q), p.where(vec({1, 2, 3, 4}, {4}), vec({-1}, {1}))};
  EXPECT_TRUE(match_all(outs));
  EXPECT_EQ(p.logical_xor(q).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1, 0}));
  // logical ops on non-bool inputs treat nonzero as true
  Tensor x = ivec({0, 3, -2, 0}, {4}), y = vec({0.5f, 0, 1, 0}, {4});
  EXPECT_TRUE(match_all({x.logical_and(y), x.logical_or(y), x.logical_xor(y), x.logical_not()}));
  // where broadcasting the condition and both branches, and its gradient
  Tensor c = vec({1, -1, 1}, {3}) > 0;
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.where(in[0], in[1]); },
                            {rnd({2, 3}, 31), rnd({2, 1}, 32)}));
}

// ---- integer semantics ----

TEST(Ops, IntegerArithmetic) {
  Tensor a = ivec({7, -7, 7, -7, 0, 100}, {6}), b = ivec({2, 2, -2, -2, 3, 7}, {6});
  EXPECT_TRUE(match_all({a + b, a - b, a * b, a.idiv(b), a.mod(b), a.maximum(b), a.minimum(b), a / b, a * 2.5}));
  EXPECT_EQ(a.idiv(b).dtype(), DType::Int32);
  EXPECT_EQ((a / b).dtype(), DType::Float32);
  EXPECT_EQ((a * 2.5).dtype(), DType::Float32);
  EXPECT_EQ(a.idiv(b).to_vector<int32_t>(), (std::vector<int32_t>{3, -3, -3, 3, 0, 14}));
  EXPECT_EQ(a.mod(b).to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 1, -1, 0, 2}));
  Tensor big = ivec({2147483647, -2147483647 - 1}, {2});
  EXPECT_TRUE(match_all({big + ivec({1, -1}, {2}), big * ivec({2, 3}, {2})}));  // wraps mod 2^32
  Tensor u = Tensor::from_vector(std::vector<uint8_t>{200, 10, 255}, {3});
  Tensor v = Tensor::from_vector(std::vector<uint8_t>{100, 250, 255}, {3});
  EXPECT_TRUE(match_all({u + v, u * v, u - v, u.maximum(v), u.minimum(v), u.idiv(v), u.mod(v)}));
  EXPECT_EQ((u + v).to_vector<uint8_t>(), (std::vector<uint8_t>{44, 4, 254}));
  Tensor l = Tensor::from_vector(std::vector<int64_t>{5000000000LL, -3, 1LL << 40}, {3});
  Tensor m = Tensor::from_vector(std::vector<int64_t>{3, 2, 1LL << 20}, {3});
  EXPECT_TRUE(match_all({l + m, l * m, l.idiv(m), l.mod(m), l + a.shrink({{0, 3}})}));
  EXPECT_EQ((l + a.shrink({{0, 3}})).dtype(), DType::Int64);
}

// ---- casts between all dtypes ----

namespace {
const std::vector<DType> ALL_DTYPES = {DType::Bool,    DType::UInt8,    DType::Int32,  DType::Int64,
                                       DType::Float16, DType::BFloat16, DType::Float32};

// Values of `from` whose conversion to `to` is defined in C (float -> unsigned out of range is
// undefined, so float sources feeding uint8 stay in [0, 255]).
std::vector<double> cast_inputs(DType from, DType to) {
  switch (from) {
    case DType::Bool: return {0, 1, 1, 0};
    case DType::UInt8: return {0, 1, 7, 128, 200, 255};
    case DType::Int32: return {-70000, -300, -129, -1, 0, 1, 127, 255, 256, 300, 70000, 2147483647};
    case DType::Int64: return {-5000000000.0, -300, -1, 0, 1, 255, 256, 300, 70000, 5000000000.0};
    default:
      if (to == DType::UInt8) return {0, 0.3, 1.5, 2.5, 100.9, 200.2, 255};
      if (to == DType::Int32 || to == DType::Int64) return {-1000.75, -2.5, -1, -0.4, 0, 0.3, 1.5, 2.5, 100.9, 1000.75};
      return {-70000.5, -1000.75, -2.5, -1, -0.4, 0, 1e-3, 0.3, 1.5, 2.5, 100.9, 1000.75, 3.3e38};
  }
}
}  // namespace

class Cast : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(Cast, AgainstReference) {
  auto [from, to] = GetParam();
  auto v = cast_inputs(from, to);
  Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, {.dtype = from});
  Tensor y = x.cast(to);
  EXPECT_EQ(y.dtype(), to);
  EXPECT_TRUE(match(y, Tol{0, 0})) << dtype_name(from) << " -> " << dtype_name(to);
}

INSTANTIATE_TEST_SUITE_P(Ops, Cast, ::testing::Combine(::testing::ValuesIn(ALL_DTYPES), ::testing::ValuesIn(ALL_DTYPES)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
                                  dtype_name(std::get<1>(info.param));
                         });

TEST(Ops, CastChainsAndGradient) {
  Tensor x = rnd({2, 4}, 41, -3, 3);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].cast(DType::Float16).exp().cast(DType::Float32); }, {x},
                            Tol{5e-3, 5e-3}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].cast(DType::BFloat16).square().float_() * 2.0; }, {x},
                            Tol{3e-2, 3e-2}));
  EXPECT_TRUE(match_all({x.cast(DType::Int32).cast(DType::Float32) * x, (x * 100.0).cast(DType::UInt8).cast(DType::Int64),
                         x.bitcast(DType::Int32), x.cast(DType::Float16).bitcast(DType::BFloat16)}));
}

// ---- empty tensors ----

TEST(Ops, EmptyTensors) {
  Tensor e = Tensor::zeros({0, 3}), f = rnd({2, 0, 4}, 51);
  Tensors outs{e + 1.0, e.exp(), e.sum(0), e.sum(1), e.prod({0}), e.max(1), e.reshape({3, 0}), e.permute({1, 0}),
               f.sum({1}), f.sum(), f.mean(1).isnan(), e.pad({{1, 1}, {0, 0}}), Tensor::cat({e, rnd({2, 3}, 52)}),
               f.expand({2, 0, 4}) * f, e.cast(DType::Int32), e.T().matmul(e)};
  EXPECT_TRUE(match_all(outs));
  EXPECT_EQ(e.sum(0).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(e.prod({0}).to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(e.sum(1).shape(), Shape{0});
  EXPECT_EQ(e.T().matmul(e).to_vector<float>(), std::vector<float>(9, 0));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return (in[0] * 2.0).sum(0); }, {e}));
}

// ---- the rest of the Tensor API: host access, devices, autograd plumbing ----

TEST(Ops, TensorApi) {
  int32_t raw[6] = {1, -2, 3, -4, 5, -6};
  Tensor a = Tensor::from_data(raw, DType::Int32, {2, 3}, {.dtype = DType::Float32});
  EXPECT_EQ(a.dtype(), DType::Float32);
  EXPECT_EQ(a.describe(), "float32[2,3] on " + default_device());
  EXPECT_EQ(a.to_vector<float>(), (V{1, -2, 3, -4, 5, -6}));
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3, -4, 5, -6}));
  EXPECT_EQ(Tensor::from_data(raw, DType::Int32, {6}).dtype(), DType::Int32);
  EXPECT_EQ((a > 0.0).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(a.sum().item<int32_t>(), -3);
  EXPECT_EQ(a.cast(DType::Int64).sum().item<int64_t>(), -3);
  EXPECT_EQ(a.ndim(), 2);
  EXPECT_EQ(a.numel(), 6);
  EXPECT_EQ(a.shape(-1), 3);
  Tensor e = Tensor::empty({2, 3}, {.dtype = DType::Int32});
  EXPECT_EQ(e.shape(), (Shape{2, 3}));
  e.assign(a.cast(DType::Int32));
  EXPECT_EQ(e.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, -4, 5, -6}));
  // through the CPU and back (copies both ways when the suite runs on another device)
  Tensor moved = a.to("CPU").to(default_device()) * a.contiguous();
  EXPECT_TRUE(match_all({moved, a.to("cpu"), a.contiguous().T()}));
  EXPECT_TRUE(match(a.pool_windows({2}, {1}, {1})));
  EXPECT_EQ(vec({1, 2, 3, 4}, {4}).pool_windows({2}, {1}, {1}).to_vector<float>(), (V{1, 2, 2, 3, 3, 4}));
  EXPECT_EQ(vec({1, 2, 3, 4, 5}, {5}).pool_windows({2}, {2}, {2}).to_vector<float>(), (V{1, 3, 3, 5}));
  EXPECT_EQ(a.scalar_like(2).dtype(), DType::Float32);
  EXPECT_EQ(e.scalar_like(2).dtype(), DType::Int32);
  EXPECT_EQ(e.scalar_like(2.5).dtype(), DType::Float32);
  EXPECT_TRUE(match_all({a < 1.0, a > -1.0, 2.0 - a, 2.0 / (a + 10.0), 3.0 * a, a / 4.0, -a}));
}

TEST(Ops, AutogradPlumbing) {
  Tensor x = rnd({3}, 81).requires_grad_();
  EXPECT_TRUE(x.requires_grad());
  Tensor w = rnd({3}, 82);
  (x * w).sum().backward();
  EXPECT_TRUE(match(*x.grad()));
  EXPECT_EQ(x.grad()->to_vector<float>(), w.to_vector<float>());
  (x * x).backward(w);  // explicit seed: grad += 2 x w
  EXPECT_TRUE(match(*x.grad()));
  auto xv = x.to_vector<float>(), wv = w.to_vector<float>(), g = x.grad()->to_vector<float>();
  for (int i = 0; i < 3; i++) EXPECT_NEAR(g[i], wv[i] + 2 * xv[i] * wv[i], 1e-5);
  x.zero_grad();
  EXPECT_FALSE(x.grad().has_value());
  x.set_grad(w);
  EXPECT_EQ(x.grad()->uop(), w.uop());
  {
    NoGradGuard guard;
    EXPECT_TRUE(NoGradGuard::enabled());
    EXPECT_FALSE((x * 2.0).requires_grad());
  }
  EXPECT_FALSE(NoGradGuard::enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
  // a tensor that does not reach the loss gets zeros; detach stops the gradient
  Tensor u = rnd({2}, 83).requires_grad_();
  auto gs = (x.detach() * x).sum().gradients({x, u});
  EXPECT_TRUE(match_all(gs));
  EXPECT_EQ(gs[1].to_vector<float>(), (V{0, 0}));
  EXPECT_EQ(gs[0].to_vector<float>(), x.to_vector<float>());
}

// ---- regressions: bugs found by this suite, kept so they stay fixed ----

// A number with a bool tensor computes in integers, as NumPy and PyTorch do: `mask + 1` counts.
TEST(Regression, BoolTensorPlusScalar) {
  Tensor b = vec({1, -1}, {2}) > 0.0;  // [true, false]
  EXPECT_EQ((b + 1.0).to_vector<int32_t>(), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ((b * 1.0).to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ((b - 1.0).to_vector<int32_t>(), (std::vector<int32_t>{0, -1}));
  EXPECT_EQ((1.0 - b).to_vector<int32_t>(), (std::vector<int32_t>{0, 1}));
}

// BITCAST of a constant: the C renderer must not take the address of a literal.
TEST(Regression, BitcastOfConstant) {
  EXPECT_EQ(Tensor::full({2}, 1.0).bitcast(DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{1065353216, 1065353216}));
}

// float16 constants are rounded to float16 before the float32 arithmetic of half kernels:
// 70000 is inf as a float16, so 0.5h * 70000 is inf, not 35008.
TEST(Regression, Float16ConstantsRoundToHalf) {
  Tensor h = Tensor::from_vector(std::vector<float>{0.5f}, {1}, {.dtype = DType::Float16});
  Tensor y = h * 70000.0;
  EXPECT_EQ(y.dtype(), DType::Float16);
  EXPECT_TRUE(match(y));
  EXPECT_EQ(y.item<float>(), INFINITY);
}

// pow goes through exp2(y * log2|x|); at x = 0 the value and the gradient must not be NaN:
// d/dx x^2.5 at 0 is 0 (PyTorch gives 0 too).
TEST(Regression, PowGradientAtZero) {
  Tensor x = vec({0, 1}, {2}).requires_grad_();
  EXPECT_EQ(x.pow(2.5).sum().gradients({x})[0].to_vector<float>(), (V{0, 2.5}));
  EXPECT_EQ(x.pow(vec({2, 2}, {2})).sum().gradients({x})[0].to_vector<float>(), (V{0, 2}));
}
