// The tensor-core attention kernels (Note [tensor-core attention] in codegen/attention_tensor_cores.cpp)
// run on the CPU, without a GPU: their CUDA source is compiled as C++ by the system compiler
// against a small emulation of what they use (threads of a block as std::threads meeting at
// barriers, warp shuffles, and mma.sync.m16n8k16 computed from the fragments the 32 lanes
// hold, laid out as the PTX ISA documents them), then checked against attention computed
// directly in double precision: forward, dQ, dK and dV, causal and not, bfloat16, lengths
// that are no multiple of a block. (Label unit; skipped where no C++ compiler `c++` runs.)
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/knobs.h"

namespace tg {
namespace {

// What the kernels use of CUDA, for a block of 128 threads (4 warps) run by std::threads.
constexpr const char* EMULATION = R"(
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using std::min;
using std::max;
struct TgDim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local TgDim3 threadIdx, blockIdx;
static std::barrier<>* tg_block;
struct TgWarp {
  std::barrier<>* bar;
  float f[32];
  unsigned a[32][4], b[32][2];
  const unsigned short* rows[32];
};
static TgWarp tg_warps[4];
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() tg_block->arrive_and_wait()
static float __shfl_xor_sync(unsigned, float v, int mask) {
  TgWarp& w = tg_warps[threadIdx.x / 32];
  w.f[threadIdx.x % 32] = v;
  w.bar->arrive_and_wait();
  float r = w.f[(threadIdx.x % 32) ^ mask];
  w.bar->arrive_and_wait();
  return r;
}
static float tg_from_bf16(unsigned short h) { unsigned x = (unsigned)h << 16; float f; std::memcpy(&f, &x, 4); return f; }
static unsigned short tg_to_bf16(float f) {
  unsigned x; std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}
static unsigned tg_pack(float lo, float hi) { return (unsigned)tg_to_bf16(lo) | ((unsigned)tg_to_bf16(hi) << 16); }
static float tg_half_of(unsigned reg, int high) { return tg_from_bf16((unsigned short)(high ? reg >> 16 : reg & 0xffffu)); }
static unsigned tg_split(float x) { return tg_pack(x, x - tg_half_of(tg_pack(x, 0.0f), 0)); }
// D = A B + C for a 16 x 16 A and a 16 x 8 B: lane l holds A's rows l/4 and l/4 + 8, columns
// 2(l%4), +1 and +8, +9 (a[0]: row r, cols c..; a[1]: row r+8; a[2]: row r, cols c+8..; a[3]: row
// r+8, cols c+8..), B's rows 2(l%4), +1 (b0) and +8, +9 (b1) of column l/4, and C's row l/4
// (c[0], c[1]) and l/4 + 8 (c[2], c[3]) at columns 2(l%4), +1.
static void tg_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  TgWarp& w = tg_warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  std::memcpy(w.a[lane], a, sizeof w.a[lane]);
  w.b[lane][0] = b0, w.b[lane][1] = b1;
  w.bar->arrive_and_wait();
  auto A = [&](int r, int k) { return tg_half_of(w.a[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2); };
  auto B = [&](int k, int n) { return tg_half_of(w.b[n * 4 + (k % 8) / 2][k >= 8], k % 2); };
  for (int i = 0; i < 4; i++) {
    const int r = lane / 4 + (i >= 2 ? 8 : 0), n = 2 * (lane % 4) + i % 2;
    float s = c[i];
    for (int k = 0; k < 16; k++) s += A(r, k) * B(k, n);
    c[i] = s;
  }
  w.bar->arrive_and_wait();
}
// ldmatrix.m8n8.x4: lane l addresses row l % 8 of 8x8 tile l / 8 (8 contiguous 16-bit elements);
// lane l receives of tile i its row l/4, elements 2(l%4) and +1, or transposed (trans) its
// rows 2(l%4) and +1 at element l/4, the first in the low half.
static void tg_ldsm4_any(unsigned* r, const unsigned short* p, bool trans) {
  TgWarp& w = tg_warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  w.rows[lane] = p;
  w.bar->arrive_and_wait();
  for (int i = 0; i < 4; i++) {
    unsigned lo, hi;
    if (trans) {
      lo = w.rows[i * 8 + 2 * (lane % 4)][lane / 4];
      hi = w.rows[i * 8 + 2 * (lane % 4) + 1][lane / 4];
    } else {
      lo = w.rows[i * 8 + lane / 4][2 * (lane % 4)];
      hi = w.rows[i * 8 + lane / 4][2 * (lane % 4) + 1];
    }
    r[i] = lo | (hi << 16);
  }
  w.bar->arrive_and_wait();
}
// cp.async, synchronously: a copy of `bytes` bytes, or zeros where the row is past the end.
static void tg_cp_any(void* dst, const void* src, bool valid, int bytes) {
  if (valid) std::memcpy(dst, src, bytes);
  else std::memset(dst, 0, bytes);
}
static void tg_cp16(unsigned short* dst, const unsigned short* src, bool valid) { tg_cp_any(dst, src, valid, 16); }
static void tg_cp4(unsigned short* dst, const unsigned short* src, bool valid) { tg_cp_any(dst, src, valid, 4); }
static void tg_cp4f(float* dst, const float* src, bool valid) { tg_cp_any(dst, src, valid, 4); }
static float tg_exp2(float x) { return std::exp2(x); }
static void tg_cp_commit() {}
static void tg_cp_wait_all_but_last() {}
static void tg_cp_wait_all() {}
static void tg_ldsm4(unsigned* r, const unsigned short* p) { tg_ldsm4_any(r, p, false); }
static void tg_ldsm4_t(unsigned* r, const unsigned short* p) { tg_ldsm4_any(r, p, true); }
)";

// Runs kernel `name` on a grid of gx x gy blocks of 128 threads.
constexpr const char* LAUNCHER = R"(
extern "C" void tg_launch_NAME(int gx, int gy, void** args) {
  for (int by = 0; by < gy; by++)
    for (int bx = 0; bx < gx; bx++) {
      std::barrier<> block(128);
      for (int w = 0; w < 4; w++) tg_warps[w].bar = new std::barrier<>(32);
      tg_block = &block;
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < 128; t++)
        threads.emplace_back([=] {
          threadIdx.x = t;
          blockIdx.x = bx, blockIdx.y = by;
          CALL;
        });
      for (auto& t : threads) t.join();
      for (int w = 0; w < 4; w++) delete tg_warps[w].bar;
    }
}
)";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// A kernel's source without its CUDA helpers (the emulation defines them), and its launcher.
std::string emulated_kernel(const AttentionSpec& spec) {
  TemplateSource t = render_attention(spec, KernelDialect::CUDA);
  std::string src = t.source;
  size_t helpers = src.find("static __device__ __forceinline__ unsigned tg_pack");
  size_t after = src.find("#define KS");
  EXPECT_NE(helpers, std::string::npos);
  EXPECT_NE(after, std::string::npos);
  src = "#undef TG_NAME\n" + src.substr(0, helpers) + src.substr(after);
  std::string call =
      spec.kernel == TemplateKernel::AttentionForward
          ? "NAME((unsigned short*)args[0], (const unsigned short*)args[1], (const unsigned short*)args[2], "
            "(const unsigned short*)args[3])"
          : "NAME((unsigned short*)args[0], (const unsigned short*)args[1], (const unsigned short*)args[2], "
            "(const unsigned short*)args[3], (const float*)args[4], (const unsigned short*)args[5], "
            "(const float*)args[6])";
  std::string launcher = replace_all(LAUNCHER, "CALL", call);
  return src + replace_all(launcher, "NAME", t.kernel.name);
}

using Launch = void (*)(int, int, void**);

// The three kernels of `spec` compiled into one shared object.
class EmulatedKernels {
 public:
  explicit EmulatedKernels(const AttentionSpec& spec) {
    std::string src = EMULATION;
    for (auto k : {TemplateKernel::AttentionForward, TemplateKernel::AttentionBackwardQ, TemplateKernel::AttentionBackwardKV}) {
      AttentionSpec s = spec;
      s.kernel = k;
      src += emulated_kernel(s);
      LinearKernel rendered = render_attention(s, KernelDialect::CUDA).kernel;
      names_.push_back(rendered.name);
      blocks_.push_back(static_cast<int>(rendered.global_size[0] / rendered.local_size[0]));
    }
    static int built = 0;  // a path of its own: a library with thread_locals stays loaded after dlclose
    auto dir = std::filesystem::temp_directory_path() /
               ("tg_attention_emulated_" + std::to_string(::getpid()) + "_" + std::to_string(built++));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "k.cpp") << src;
    std::string cmd = "c++ -std=c++20 -O1 -fno-strict-aliasing -w -shared -fPIC -pthread -o " + (dir / "k.so").string() +
                      " " + (dir / "k.cpp").string() + " 2> " + (dir / "log").string();
    ok_ = std::system(cmd.c_str()) == 0;
    if (ok_) lib_ = dlopen((dir / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!ok_ || !lib_) {
      std::ifstream log(dir / "log");
      log_ = std::string(std::istreambuf_iterator<char>(log), {});
    }
    std::filesystem::remove_all(dir);
  }
  ~EmulatedKernels() {
    if (lib_) dlclose(lib_);
  }
  bool ok() const { return ok_ && lib_; }
  const std::string& log() const { return log_; }
  Launch launch(int kernel) const {
    return reinterpret_cast<Launch>(dlsym(lib_, ("tg_launch_" + names_[static_cast<size_t>(kernel)]).c_str()));
  }
  // The blocks along x that the kernel is launched with (its rendered global size).
  int blocks(int kernel) const { return blocks_[static_cast<size_t>(kernel)]; }

 private:
  std::vector<std::string> names_;
  std::vector<int> blocks_;
  bool ok_ = false;
  void* lib_ = nullptr;
  std::string log_;
};

uint16_t to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Attention computed directly (double), from the bfloat16 values of q, k, v and float32 dO.
struct Direct {
  std::vector<double> o, lse, dq, dk, dv;
};
Direct direct(const AttentionSpec& s, const std::vector<float>& q, const std::vector<float>& k,
              const std::vector<float>& v, const std::vector<float>& dout) {
  Direct r;
  r.o.assign(size_t(s.bh * s.l * s.ev), 0), r.lse.assign(size_t(s.bh * s.l), 0);
  r.dq.assign(size_t(s.bh * s.l * s.e), 0), r.dk.assign(size_t(s.bh * s.s * s.e), 0), r.dv.assign(size_t(s.bh * s.s * s.ev), 0);
  for (int64_t h = 0; h < s.bh; h++)
    for (int64_t i = 0; i < s.l; i++) {
      std::vector<double> p(size_t(s.s), 0);
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      auto visible = [&](int64_t j) { return !s.causal || j <= i; };
      for (int64_t j = 0; j < s.s; j++) {
        if (!visible(j)) continue;
        double x = 0;
        for (int64_t d = 0; d < s.e; d++) x += double(q[size_t((h * s.l + i) * s.e + d)]) * k[size_t((h * s.s + j) * s.e + d)];
        p[size_t(j)] = x * s.scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (int64_t j = 0; j < s.s; j++) sum += visible(j) ? std::exp(p[size_t(j)] - mx) : 0;
      for (int64_t j = 0; j < s.s; j++) p[size_t(j)] = visible(j) ? std::exp(p[size_t(j)] - mx) / sum : 0;
      r.lse[size_t(h * s.l + i)] = mx + std::log(sum);
      double delta = 0;
      for (int64_t d = 0; d < s.ev; d++) {
        double o = 0;
        for (int64_t j = 0; j < s.s; j++) o += p[size_t(j)] * v[size_t((h * s.s + j) * s.ev + d)];
        r.o[size_t((h * s.l + i) * s.ev + d)] = o;
        delta += o * dout[size_t((h * s.l + i) * s.ev + d)];
      }
      for (int64_t j = 0; j < s.s; j++) {
        double dp = 0;
        for (int64_t d = 0; d < s.ev; d++) dp += double(dout[size_t((h * s.l + i) * s.ev + d)]) * v[size_t((h * s.s + j) * s.ev + d)];
        double ds = p[size_t(j)] * (dp - delta) * s.scale;
        for (int64_t d = 0; d < s.e; d++) {
          r.dq[size_t((h * s.l + i) * s.e + d)] += ds * k[size_t((h * s.s + j) * s.e + d)];
          r.dk[size_t((h * s.s + j) * s.e + d)] += ds * q[size_t((h * s.l + i) * s.e + d)];
        }
        for (int64_t d = 0; d < s.ev; d++)
          r.dv[size_t((h * s.s + j) * s.ev + d)] += p[size_t(j)] * dout[size_t((h * s.l + i) * s.ev + d)];
      }
    }
  return r;
}

// The largest difference relative to the largest magnitude of `want`.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

std::vector<uint16_t> bf16_values(int64_t n, uint32_t seed, std::vector<float>& rounded) {
  std::vector<float> x = testutil::rnd_values(n, seed, -1, 1);
  std::vector<uint16_t> h(x.size());
  rounded.resize(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = to_bf16(x[i]), rounded[i] = from_bf16(h[i]);
  return h;
}

// Note [strided operands] in tensor_attention.cpp: a dense operand ([bh, rows, width]) placed in
// a buffer by the spec's layout; elements it does not have are NaN, so a read of one shows.
std::vector<uint16_t> place(const AttentionSpec& spec, AttentionOperand x,
                            const std::vector<uint16_t>& dense) {
  std::vector<uint16_t> buffer(size_t(spec.row_start(x, spec.bh - 1, spec.rows(x) - 1) + spec.width(x)),
                               0x7fc0);
  for (int64_t y = 0; y < spec.bh; y++)
    for (int64_t r = 0; r < spec.rows(x); r++)
      for (int64_t c = 0; c < spec.width(x); c++)
        buffer[size_t(spec.row_start(x, y, r) + c)] =
            dense[size_t((y * spec.rows(x) + r) * spec.width(x) + c)];
  return buffer;
}

void check_case(const AttentionSpec& spec) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no system C++ compiler (c++) to build the emulation";
  EmulatedKernels kernels(spec);
  ASSERT_TRUE(kernels.ok()) << kernels.log();
  std::vector<float> qf, kf, vf;
  auto q = bf16_values(spec.bh * spec.l * spec.e, 1, qf), k = bf16_values(spec.bh * spec.s * spec.e, 2, kf),
       v = bf16_values(spec.bh * spec.s * spec.ev, 3, vf);
  std::vector<float> dout;  // dO as the kernels take it: rounded to bfloat16 (Note [fused attention in the graph])
  auto dout_bf16 = bf16_values(spec.bh * spec.l * spec.ev, 4, dout);
  Direct want = direct(spec, qf, kf, vf, dout);
  std::vector<uint16_t> qp = place(spec, AttentionOperand::Q, q), kp = place(spec, AttentionOperand::K, k),
                        vp = place(spec, AttentionOperand::V, v),
                        dp = place(spec, AttentionOperand::OutputGrad, dout_bf16);

  const int groups_y = static_cast<int>(spec.bh);
  // Note [the forward's output]: O in bfloat16 in [batch, L, heads, Ev] order, then each row's
  // logsumexp as a rounded value and the rest
  std::vector<uint16_t> fwd(size_t(spec.bh * spec.l * (spec.ev + 2)), 0x7fc0);
  void* fargs[] = {fwd.data(), qp.data(), kp.data(), vp.data()};
  kernels.launch(0)(kernels.blocks(0), groups_y, fargs);
  std::vector<float> o, lse, row_lse(size_t(spec.bh * spec.l));
  for (int64_t y = 0; y < spec.bh; y++)
    for (int64_t r = 0; r < spec.l; r++) {
      for (int64_t d = 0; d < spec.ev; d++)
        o.push_back(from_bf16(fwd[size_t(spec.output_row_start(y, r) + d)]));
      const auto at = size_t(spec.lse_start(y, r));
      lse.push_back(from_bf16(fwd[at]) + from_bf16(fwd[at + 1]));
      row_lse[size_t(spec.stat_index(y, r))] = lse.back();
    }
  EXPECT_LT(relative_error(o, want.o), 2e-2) << "O";
  EXPECT_LT(relative_error(lse, want.lse), 1e-5) << "logsumexp";  // to about 2^-16 in two halves

  std::vector<float> dsum(size_t(spec.bh * spec.l));  // D = rowsum(dO * O), as the graph computes it
  for (int64_t y = 0; y < spec.bh; y++)
    for (int64_t r = 0; r < spec.l; r++)
      for (int64_t d = 0; d < spec.ev; d++) {
        const auto at = size_t((y * spec.l + r) * spec.ev + d);
        dsum[size_t(spec.stat_index(y, r))] += dout[at] * o[at];
      }
  // dQ, dK and dV come in bfloat16 (AttentionSpec::output_dtype)
  std::vector<uint16_t> dq16(size_t(spec.bh * spec.l * spec.e)),
      dkv(size_t(spec.bh * spec.s * (spec.e + spec.ev)));
  void* qargs[] = {dq16.data(), qp.data(), kp.data(), vp.data(), row_lse.data(), dp.data(), dsum.data()};
  kernels.launch(1)(kernels.blocks(1), groups_y, qargs);
  void* kvargs[] = {dkv.data(), qp.data(), kp.data(), vp.data(), row_lse.data(), dp.data(), dsum.data()};
  kernels.launch(2)(kernels.blocks(2), groups_y, kvargs);
  std::vector<float> dq, dk, dv;
  for (uint16_t x : dq16) dq.push_back(from_bf16(x));
  for (int64_t r = 0; r < spec.bh * spec.s; r++) {
    for (int64_t d = 0; d < spec.e; d++) dk.push_back(from_bf16(dkv[size_t(r * (spec.e + spec.ev) + d)]));
    for (int64_t d = 0; d < spec.ev; d++)
      dv.push_back(from_bf16(dkv[size_t(r * (spec.e + spec.ev) + spec.e + d)]));
  }
  EXPECT_LT(relative_error(dq, want.dq), 3e-2) << "dQ";
  EXPECT_LT(relative_error(dk, want.dk), 3e-2) << "dK";
  EXPECT_LT(relative_error(dv, want.dv), 3e-2) << "dV";
}

// 160 rows: blocks below the diagonal are whole (Note [whole blocks]), in the forward pass and dQ
// (key block 0 for query blocks 1 and 2) and in dK/dV (query blocks 1 and 2 for key block 0)
TEST(TensorCoreAttentionEmulated, CausalMatchesDirect) {
  check_case(AttentionSpec{TemplateKernel::AttentionForward, 2, 160, 160, 32, 32, DType::BFloat16, true, 0.17, true});
}

TEST(TensorCoreAttentionEmulated, NotCausalLongerKeysMatchesDirect) {
  check_case(AttentionSpec{TemplateKernel::AttentionForward, 1, 70, 130, 16, 48, DType::BFloat16, false, 0.25, true});
}

// GPT's layout (Note [strided operands]): q, k and v the thirds of one [B, T, 3, H, hd] buffer,
// dO a [B, T, H, hd] one; rows 16-byte aligned, so staged 16 bytes at a time.
TEST(TensorCoreAttentionEmulated, OperandsInGptLayoutMatchDirect) {
  const int64_t b = 2, t = 100, h = 3, hd = 32;
  AttentionSpec spec{
      TemplateKernel::AttentionForward, b * h, t, t, hd, hd, DType::BFloat16, true, 0.17, true, h};
  for (int64_t part = 0; part < 3; part++)
    spec.layouts[size_t(part)] = OperandLayout{part * h * hd, t * 3 * h * hd, hd, 3 * h * hd};
  spec.layouts[size_t(AttentionOperand::OutputGrad)] = OperandLayout{0, t * h * hd, hd, h * hd};
  check_case(spec);
}

// Rows 4 bytes apart from 16-byte alignment (an offset of 2 elements): the 4-byte copies.
TEST(TensorCoreAttentionEmulated, OperandsAtUnalignedRowsMatchDirect) {
  const int64_t h = 2, e = 16;
  AttentionSpec spec{
      TemplateKernel::AttentionForward, h, 70, 70, e, e, DType::BFloat16, false, 0.25, true, h};
  for (int64_t part = 0; part < 3; part++)
    spec.layouts[size_t(part)] = OperandLayout{2 + part * e, 0, 3 * 70 * e, 3 * e};
  check_case(spec);
}

// One row tile a warp in the forward pass (Note [m-tiles a warp]; the default is two, blocks of
// 128 query rows, where at 160 causal rows the first block's first tile sees nothing of its
// second key block and the second block's rows end inside its first tile): blocks of 64.
TEST(TensorCoreAttentionEmulated, ForwardWithOneRowTileAWarpMatchesDirect) {
  testutil::KnobScope tiles(knobs::ATTENTION_FORWARD_TILES, 1);
  check_case(AttentionSpec{TemplateKernel::AttentionForward, 2, 160, 160, 32, 32, DType::BFloat16, true, 0.17,
                           true});
  check_case(AttentionSpec{TemplateKernel::AttentionForward, 1, 70, 130, 16, 48, DType::BFloat16, false, 0.25,
                           true});
}

// Head dim 128: one stage of key blocks (Note [staged key blocks]: two would exceed 48 KB).
TEST(TensorCoreAttentionEmulated, WideHeadsWithOneStageMatchDirect) {
  check_case(AttentionSpec{TemplateKernel::AttentionForward, 1, 90, 150, 128, 128, DType::BFloat16, true, 0.09, true});
}

}  // namespace
}  // namespace tg
