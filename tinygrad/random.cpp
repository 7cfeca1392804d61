// Random tensors from Philox 4x32-10, a counter-based generator: value i of a draw depends only
// on (seed, draw counter, i), so results are the same on every device and thread count.
//
// Note [random numbers on the device]: rand is computed by the kernels that read it: Philox over
// the counter (i/4, draw) with the seed as key, written in int64 tensor arithmetic (each 32-bit
// word held in an int64; a 32 x 32-bit product split at 16 bits so no intermediate passes 2^49).
// The seed and the draw counter live in a realized int64 tensor per device (`DeviceDraws`), read
// by the draw's kernel and advanced by an assign after every draw. A step captured by the JIT
// reads that tensor as state and replays its assign, so every replay draws new values, the ones
// the same calls would have drawn without the JIT. Device draws set the top bit of the counter's
// last word, so they never repeat a host draw's counters. randn, uniform and randint stay host
// draws: they initialise parameters, before any step is captured.
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "tinygrad/device.h"
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

// ---- Note [random numbers on the device] ----

constexpr int64_t WORD = 0xFFFFFFFFll;
constexpr int64_t DEVICE_STREAM = int64_t{1} << 31;  // top bit of the counter's last word

// Per device: an int64 [2] tensor {seed, draws so far}, realized.
struct DeviceDraws {
  std::mutex mu;
  std::map<std::string, Tensor> state;
};
DeviceDraws& device_draws() {
  static DeviceDraws* d = new DeviceDraws();
  return *d;
}

Tensor draw_state_value(uint64_t seed, int64_t draws, const std::string& device) {
  return Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(seed), draws}, {2}, {.device = device});
}

// The {seed, draw} pair this draw uses (lazy, read from the device's state before the assign that
// advances it).
Tensor next_draw(const std::string& device) {
  auto& d = device_draws();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.state.find(device);
  if (it == d.state.end())
    it = d.state.emplace(device, draw_state_value(global_seed.load(), 0, device).realize()).first;
  Tensor& state = it->second;
  Tensor current = TensorAccess::result(state.uop(), {});
  state.assign(current + Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}, {.device = device}));
  return current;
}

// The high and low 32-bit words of m * x for a constant m < 2^32 and words x (Philox's mulhilo).
std::pair<Tensor, Tensor> mul_hi_lo(int64_t m, const Tensor& x) {
  Tensor a = x.bitwise_and(x.scalar_like(0xFFFF)) * static_cast<double>(m);  // < 2^48
  Tensor b = x.shift_right(16) * static_cast<double>(m);                    // < 2^48
  Tensor t = a + b.bitwise_and(b.scalar_like(0xFFFF)).shift_left(16);       // < 2^49
  return {b.shift_right(16) + t.shift_right(32), t.bitwise_and(t.scalar_like(static_cast<double>(WORD)))};
}

// Philox 4x32-10 of the counters (c0..c3, int64 words) under the key (k0, k1).
std::array<Tensor, 4> philox_words(std::array<Tensor, 4> c, Tensor k0, Tensor k1) {
  constexpr int64_t M0 = 0xD2511F53ll, M1 = 0xCD9E8D57ll, W0 = 0x9E3779B9ll, W1 = 0xBB67AE85ll;
  for (int round = 0; round < 10; round++) {
    auto [hi0, lo0] = mul_hi_lo(M0, c[0]);
    auto [hi1, lo1] = mul_hi_lo(M1, c[2]);
    c = {hi1.bitwise_xor(c[1]).bitwise_xor(k0), lo1, hi0.bitwise_xor(c[3]).bitwise_xor(k1), lo0};
    k0 = (k0 + static_cast<double>(W0)).bitwise_and(k0.scalar_like(static_cast<double>(WORD)));
    k1 = (k1 + static_cast<double>(W1)).bitwise_and(k1.scalar_like(static_cast<double>(WORD)));
  }
  return c;
}

// n uniform float32 values in [0, 1), computed on `device` (Note [random numbers on the device]):
// value 4j + w is word w of Philox((j, j >> 32, draw, (draw >> 32) | 2^31), seed), its top 24 bits
// over 2^24.
Tensor device_uniform01(int64_t n, const std::string& device) {
  Tensor draw = next_draw(device);
  Tensor seed = draw.shrink({{0, 1}}), count = draw.shrink({{1, 2}});
  Tensor word = seed.scalar_like(static_cast<double>(WORD));
  int64_t m = (n + 3) / 4;
  Tensor i = Tensor::arange(0, static_cast<double>(m), 1, {.dtype = DType::Int64, .device = device});
  Tensor zero = i.scalar_like(0);
  std::array<Tensor, 4> ctr{i.bitwise_and(i.scalar_like(static_cast<double>(WORD))), i.shift_right(32),
                            (count.bitwise_and(word) + zero), (count.shift_right(32).bitwise_and(word) + zero)
                                                                  .bitwise_or(zero + static_cast<double>(DEVICE_STREAM))};
  auto r = philox_words(ctr, seed.bitwise_and(word), seed.shift_right(32).bitwise_and(word));
  Tensor bits = Tensor::stack({r[0], r[1], r[2], r[3]}, 1).reshape({4 * m}).shrink({{0, n}});
  return bits.shift_right(8).cast(DType::Float32) * std::ldexp(1.0, -24);  // 24 bits: exact, below 1
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
  auto& d = device_draws();
  std::lock_guard<std::mutex> lock(d.mu);
  for (auto& [device, state] : d.state) state.assign(draw_state_value(seed, 0, device).realize());
}

Tensor Tensor::rand(const Shape& shape, const TensorOptions& opt) {
  check_shape("rand", shape);
  TG_CHECK(!opt.dtype || is_float(*opt.dtype), "rand: dtype must be floating point, got ", dtype_name(*opt.dtype));
  std::string device = canonical_device(opt.device.empty() ? default_device() : opt.device);
  TG_CHECK(device.find(',') == std::string::npos, "rand: tensors over several devices (", device,
           ") cannot draw random numbers yet");
  NoGradGuard no_grad;
  Tensor u = device_uniform01(tg::prod(shape), device).reshape(shape);
  Tensor r = u.cast(opt.dtype.value_or(DType::Float32));
  r.realize();  // one kernel, however many read it; the tensor is its buffer (no lazy graph behind it)
  return TensorAccess::result(lazy::buffer(TensorAccess::buffer(r), shape), {});
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
