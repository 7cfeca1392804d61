// Random tensors from Philox 4x32-10, a counter-based generator: value i of a draw depends only
// on (seed, draw counter, i), so results are the same on every device and thread count.
#include <array>
#include <atomic>
#include <cmath>

#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

std::atomic<uint64_t> global_seed{0x853c49e6748fea9bULL};
std::atomic<uint64_t> draw_counter{0};

std::array<uint32_t, 4> philox(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = static_cast<uint64_t>(M0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

// n uniform doubles in [0, 1) with 32 bits of randomness each.
std::vector<double> uniform01(int64_t n) {
  uint64_t seed = global_seed.load();
  uint64_t draw = draw_counter.fetch_add(1);
  std::array<uint32_t, 2> key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; i += 4) {
    auto r = philox({static_cast<uint32_t>(i / 4), static_cast<uint32_t>(static_cast<uint64_t>(i / 4) >> 32),
                     static_cast<uint32_t>(draw), static_cast<uint32_t>(draw >> 32)},
                    key);
    for (int64_t j = 0; j < 4 && i + j < n; j++) out[i + j] = r[j] * (1.0 / 4294967296.0);
  }
  return out;
}

Tensor from_doubles(const std::vector<double>& v, const Shape& shape, const TensorOptions& opt) {
  return Tensor::from_data(v.data(), DType::Float64, shape, with_dtype(opt, DType::Float32));
}

void check_shape(const char* op, const Shape& shape) {
  for (auto d : shape) TG_CHECK(d >= 0, op, ": negative dimension in shape ", shape_str(shape));
}

}  // namespace

void Tensor::manual_seed(uint64_t seed) {
  global_seed = seed;
  draw_counter = 0;
}

Tensor Tensor::rand(const Shape& shape, const TensorOptions& opt) {
  check_shape("rand", shape);
  TG_CHECK(!opt.dtype || is_float(*opt.dtype), "rand: dtype must be floating point, got ", dtype_name(*opt.dtype));
  return from_doubles(uniform01(tg::prod(shape)), shape, opt);
}

Tensor Tensor::uniform(const Shape& shape, double low, double high, const TensorOptions& opt) {
  check_shape("uniform", shape);
  auto v = uniform01(tg::prod(shape));
  for (auto& x : v) x = low + (high - low) * x;
  return from_doubles(v, shape, opt);
}

Tensor Tensor::randn(const Shape& shape, const TensorOptions& opt) {
  check_shape("randn", shape);
  int64_t n = tg::prod(shape);
  auto u = uniform01(2 * n);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; i++) {  // Box-Muller
    double r = std::sqrt(-2.0 * std::log(1.0 - u[2 * i]));
    v[i] = r * std::cos(2.0 * M_PI * u[2 * i + 1]);
  }
  return from_doubles(v, shape, opt);
}

Tensor Tensor::randint(const Shape& shape, int64_t low, int64_t high, const TensorOptions& opt) {
  check_shape("randint", shape);
  TG_CHECK(low < high, "randint: low (", low, ") must be below high (", high, ")");
  auto v = uniform01(tg::prod(shape));
  for (auto& x : v) x = static_cast<double>(low + static_cast<int64_t>(std::floor(x * static_cast<double>(high - low))));
  return from_doubles(v, shape, opt);
}

}  // namespace tg
