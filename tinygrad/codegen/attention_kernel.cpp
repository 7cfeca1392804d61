// Fused attention kernels from a template, for CUDA and OpenCL.
//
// Note [template kernels]: a few kernels are worth writing by hand because their structure is
// beyond what the scheduler fuses: flash attention streams blocks of keys through local memory
// while it carries a running softmax, which no chain of REDUCE_AXIS nodes expresses. Such a kernel
// enters the lazy graph as one TEMPLATE_KERNEL node (ops.h) whose sources are the tensors it
// reads, each a buffer of its own, and whose arg names the template and its parameters. The
// scheduler makes it a realize point and its sources too, and gives it a schedule item whose
// graph is the same op without sources (so the kernel cache, keyed by that node, finds it again
// in the next step and holds no tensor alive); the pipeline sends that item here instead of
// through the passes (KernelChoice::Kind::Template), and the engine compiles and launches the
// source like any generated kernel: the memory pool, JIT capture and replay, tracing and DEBUG
// output see no difference. Its gradient is a rule of the template (gradient.cpp), which here
// emits the backward kernels.
//
// Note [fused attention]: FlashAttention-2's algorithm, one work-item per row. Forward: a
// work-group of BQ work-items takes BQ query rows of one (batch, head); it walks the keys in
// blocks of BK, which the group loads into local memory together; each work-item scores its row
// against the block (scores scaled by scale * log2(e), so exp is exp2), takes the block's max,
// rescales its running sum and output accumulator by exp2(old max - new max) and adds the
// block's weights and weighted values. It writes O = acc / sum and the row's logsumexp L = (max
// + log2(sum)) * ln(2), in float32, into one row [O | L] of its output. Backward (with D =
// rowsum(dO * O), computed by ordinary kernels): the dQ kernel walks key blocks as the forward
// does and recomputes each weight P = exp(s - L); dS = P * (dO . v - D); dQ = scale * sum dS k.
// The dK/dV kernel takes BKV key rows per group and walks blocks of query rows (q, dO, L, D in
// local memory): dV = sum P dO, dK = scale * sum dS q. A causal mask (key j visible from query i
// when j <= i) ends the walks early: the forward and dQ stop at the group's last row, dK/dV start
// at the group's first key. Blocks that run past L or S are loaded as zeros and masked. Nothing
// of size L x S is ever written. Inputs are read in their dtype and computed in float32; each
// work-item keeps its rows in registers, so head dims are limited to MAX_HEAD_DIM.
//
// Note [tensor-core attention]: on CUDA, for bfloat16/float16 inputs and head dims that are
// multiples of 16 (AttentionSpec::tensor_cores, FLASH_ATTENTION=2), the three kernels run their
// products on the tensor cores with mma.sync.m16n8k16 (float32 accumulators). A block of 4 warps
// takes 64 query rows, 16 a warp, whose q fragments stay in registers; blocks of 64 keys and
// values are staged in shared memory (rows padded by 8 elements, so the fragment loads of a warp
// hit 32 different banks). S = q k^T is 8 m16n8 tiles a warp; each thread holds 2 of each
// tile's 16 rows (g = lane / 4 and g + 8) and 2 columns of each, so a row's max and sum meet
// over the 4 threads of a quad by two shuffles. The weights P, rounded to the input type, are
// already laid out as the A fragments of P v (the C fragment of an m16n8 tile pairs with the
// next tile's into one m16n8k16 A fragment), so they never leave registers. The running max,
// rescaling and logsumexp are those of Note [fused attention]. The backward kernels work the
// same way over 64 rows a block (dQ: query rows walking key blocks; dK/dV: key rows walking query
// blocks), dO rounded from float32 to the input type where it enters a product; each product's
// accumulators become the next product's A fragments (P and dS) in registers.
#include "tinygrad/codegen/attention_kernel.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tinygrad/codegen/render_cuda.h"
#include "tinygrad/codegen/render_opencl.h"
#include "tinygrad/error.h"

namespace tg {

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;
constexpr int64_t ROWS_PER_GROUP = 64;  // BQ (forward, dQ) and BKV (dK/dV): work-items per group
constexpr int64_t BLOCK = 32;           // BK (forward, dQ) and the query block of dK/dV
constexpr int64_t MAX_GROUPS_Y = 65535;  // CUDA's gridDim.y limit: bh runs along y
constexpr int64_t TC_ROWS = 64;           // Note [tensor-core attention]: query rows a block
constexpr int64_t TC_THREADS = 128;       // 4 warps

std::string dialect_macros(KernelDialect d) {
  if (d == KernelDialect::CUDA)
    return "#define TG_KERNEL(n) extern \"C\" __global__ void __launch_bounds__(TG_THREADS) n\n"
           "#define TG_GLOBAL\n#define TG_LOCAL __shared__\n#define TG_BARRIER() __syncthreads()\n"
           "#define TG_GROUP_X ((int)blockIdx.x)\n#define TG_GROUP_Y ((int)blockIdx.y)\n"
           "#define TG_LID ((int)threadIdx.x)\n#define TG_EXP2(x) exp2f(x)\n#define TG_LOG2(x) log2f(x)\n"
           "#define TG_I64 long long\n"
           "static __device__ __forceinline__ float tg_bf16(unsigned short b) { return __uint_as_float((unsigned)b << 16); }\n"
           "static __device__ __forceinline__ float tg_half(unsigned short h) { float f; "
           "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n";
  return "#define TG_KERNEL(n) __kernel __attribute__((reqd_work_group_size(TG_THREADS, 1, 1))) void n\n"
         "#define TG_GLOBAL __global\n#define TG_LOCAL __local\n#define TG_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)\n"
         "#define TG_GROUP_X ((int)get_group_id(0))\n#define TG_GROUP_Y ((int)get_group_id(1))\n"
         "#define TG_LID ((int)get_local_id(0))\n#define TG_EXP2(x) exp2(x)\n#define TG_LOG2(x) log2(x)\n"
         "#define TG_I64 long\n"
         "inline float tg_bf16(ushort b) { return as_float((uint)b << 16); }\n";
}

// The element type of q, k and v in the kernel's parameters, and how one is read as float.
std::string input_macros(DType t, KernelDialect d) {
  const char* ushort = d == KernelDialect::CUDA ? "unsigned short" : "ushort";
  switch (t) {
    case DType::BFloat16: return std::string("#define TG_IN ") + ushort + "\n#define TG_LOAD(p, i) tg_bf16((p)[i])\n";
    case DType::Float16: return std::string("#define TG_IN ") + ushort + "\n#define TG_LOAD(p, i) tg_half((p)[i])\n";
    default: return "#define TG_IN float\n#define TG_LOAD(p, i) ((p)[i])\n";
  }
}

// A float literal of v in C, CUDA and OpenCL ("1.250000000e-01f": an exponent, so never "1f").
std::string float_literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9ef", v);
  return buf;
}

std::string define(const char* name, const std::string& value) { return std::string("#define ") + name + " " + value + "\n"; }
std::string define(const char* name, int64_t value) { return define(name, std::to_string(value)); }

std::string size_macros(const AttentionSpec& s) {
  return define("TG_THREADS", ROWS_PER_GROUP) + define("BLOCK", BLOCK) + define("LQ", s.l) + define("SK", s.s) +
         define("E", s.e) + define("EV", s.ev) + define("CAUSAL", s.causal ? 1 : 0) +
         define("SCALE", float_literal(s.scale)) + define("SCALE_LOG2", float_literal(s.scale / std::log(2.0))) +
         define("LOG2E", float_literal(1.0 / std::log(2.0))) + define("LN2", float_literal(std::log(2.0))) +
         define("NEG_BIG", "(-3.0e38f)");
}

// Note [fused attention]: the forward pass.
constexpr const char* FORWARD = R"(
TG_KERNEL(TG_NAME)(TG_GLOBAL float* out, TG_GLOBAL const TG_IN* q, TG_GLOBAL const TG_IN* k, TG_GLOBAL const TG_IN* v) {
  TG_LOCAL float ks[BLOCK * E];
  TG_LOCAL float vs[BLOCK * EV];
  const int tid = TG_LID, head = TG_GROUP_Y, first = TG_GROUP_X * TG_THREADS, row = first + tid;
  const TG_I64 qrow = (TG_I64)head * LQ + (row < LQ ? row : LQ - 1);
  const TG_I64 kbase = (TG_I64)head * SK;
  float qr[E], acc[EV];
  for (int d = 0; d < E; d++) qr[d] = TG_LOAD(q, qrow * E + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) acc[d] = 0.0f;
  float m = NEG_BIG, sum = 0.0f;
  const int kend = CAUSAL ? min(SK, first + TG_THREADS) : SK;
  for (int k0 = 0; k0 < kend; k0 += BLOCK) {
    TG_BARRIER();
    for (int i = tid; i < BLOCK * E; i += TG_THREADS) {
      const int j = k0 + i / E;
      ks[i] = j < SK ? TG_LOAD(k, (kbase + j) * E + i % E) : 0.0f;
    }
    for (int i = tid; i < BLOCK * EV; i += TG_THREADS) {
      const int j = k0 + i / EV;
      vs[i] = j < SK ? TG_LOAD(v, (kbase + j) * EV + i % EV) : 0.0f;
    }
    TG_BARRIER();
    int n = min(BLOCK, SK - k0);
    if (CAUSAL) n = min(n, row - k0 + 1);
    float s[BLOCK];
    float mb = m;
    for (int j = 0; j < BLOCK; j++) {
      float x = 0.0f;
      for (int d = 0; d < E; d++) x += qr[d] * ks[j * E + d];
      s[j] = j < n ? x : NEG_BIG;
      mb = fmax(mb, s[j]);
    }
    const float alpha = TG_EXP2(m - mb);
    sum *= alpha;
    for (int d = 0; d < EV; d++) acc[d] *= alpha;
    for (int j = 0; j < BLOCK; j++) {
      const float p = j < n ? TG_EXP2(s[j] - mb) : 0.0f;
      sum += p;
      for (int d = 0; d < EV; d++) acc[d] += p * vs[j * EV + d];
    }
    m = mb;
  }
  if (row < LQ) {
    const TG_I64 o = ((TG_I64)head * LQ + row) * (EV + 1);
    for (int d = 0; d < EV; d++) out[o + d] = acc[d] / sum;
    out[o + EV] = (m + TG_LOG2(sum)) * LN2;
  }
}
)";

// Note [fused attention]: dQ, recomputing the weights from q, k and L.
constexpr const char* BACKWARD_Q = R"(
TG_KERNEL(TG_NAME)(TG_GLOBAL float* dq, TG_GLOBAL const TG_IN* q, TG_GLOBAL const TG_IN* k, TG_GLOBAL const TG_IN* v,
                   TG_GLOBAL const float* fwd, TG_GLOBAL const float* dout, TG_GLOBAL const float* dsum) {
  TG_LOCAL float ks[BLOCK * E];
  TG_LOCAL float vs[BLOCK * EV];
  const int tid = TG_LID, head = TG_GROUP_Y, first = TG_GROUP_X * TG_THREADS, row = first + tid;
  const TG_I64 qrow = (TG_I64)head * LQ + (row < LQ ? row : LQ - 1);
  const TG_I64 kbase = (TG_I64)head * SK;
  float qr[E], dor[EV], acc[E];
  for (int d = 0; d < E; d++) qr[d] = TG_LOAD(q, qrow * E + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) dor[d] = dout[qrow * EV + d];
  for (int d = 0; d < E; d++) acc[d] = 0.0f;
  const float lse = fwd[qrow * (EV + 1) + EV] * LOG2E, delta = dsum[qrow];
  const int kend = CAUSAL ? min(SK, first + TG_THREADS) : SK;
  for (int k0 = 0; k0 < kend; k0 += BLOCK) {
    TG_BARRIER();
    for (int i = tid; i < BLOCK * E; i += TG_THREADS) {
      const int j = k0 + i / E;
      ks[i] = j < SK ? TG_LOAD(k, (kbase + j) * E + i % E) : 0.0f;
    }
    for (int i = tid; i < BLOCK * EV; i += TG_THREADS) {
      const int j = k0 + i / EV;
      vs[i] = j < SK ? TG_LOAD(v, (kbase + j) * EV + i % EV) : 0.0f;
    }
    TG_BARRIER();
    int n = min(BLOCK, SK - k0);
    if (CAUSAL) n = min(n, row - k0 + 1);
    for (int j = 0; j < n; j++) {
      float x = 0.0f, dp = 0.0f;
      for (int d = 0; d < E; d++) x += qr[d] * ks[j * E + d];
      for (int d = 0; d < EV; d++) dp += dor[d] * vs[j * EV + d];
      const float ds = TG_EXP2(x - lse) * (dp - delta);
      for (int d = 0; d < E; d++) acc[d] += ds * ks[j * E + d];
    }
  }
  if (row < LQ)
    for (int d = 0; d < E; d++) dq[((TG_I64)head * LQ + row) * E + d] = acc[d] * SCALE;
}
)";

// Note [fused attention]: dK and dV, one key row per work-item, walking blocks of query rows.
constexpr const char* BACKWARD_KV = R"(
TG_KERNEL(TG_NAME)(TG_GLOBAL float* dkv, TG_GLOBAL const TG_IN* q, TG_GLOBAL const TG_IN* k, TG_GLOBAL const TG_IN* v,
                   TG_GLOBAL const float* fwd, TG_GLOBAL const float* dout, TG_GLOBAL const float* dsum) {
  TG_LOCAL float qs[BLOCK * E];
  TG_LOCAL float dos[BLOCK * EV];
  TG_LOCAL float lses[BLOCK];
  TG_LOCAL float deltas[BLOCK];
  const int tid = TG_LID, head = TG_GROUP_Y, first = TG_GROUP_X * TG_THREADS, key = first + tid;
  const TG_I64 krow = (TG_I64)head * SK + (key < SK ? key : SK - 1);
  const TG_I64 qbase = (TG_I64)head * LQ;
  float kr[E], vr[EV], dk[E], dv[EV];
  for (int d = 0; d < E; d++) kr[d] = TG_LOAD(k, krow * E + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) vr[d] = TG_LOAD(v, krow * EV + d);
  for (int d = 0; d < E; d++) dk[d] = 0.0f;
  for (int d = 0; d < EV; d++) dv[d] = 0.0f;
  const int qstart = CAUSAL ? first / BLOCK * BLOCK : 0;
  for (int q0 = qstart; q0 < LQ; q0 += BLOCK) {
    TG_BARRIER();
    for (int i = tid; i < BLOCK * E; i += TG_THREADS) {
      const int r = q0 + i / E;
      qs[i] = r < LQ ? TG_LOAD(q, (qbase + r) * E + i % E) : 0.0f;
    }
    for (int i = tid; i < BLOCK * EV; i += TG_THREADS) {
      const int r = q0 + i / EV;
      dos[i] = r < LQ ? dout[(qbase + r) * EV + i % EV] : 0.0f;
    }
    for (int i = tid; i < BLOCK; i += TG_THREADS) {
      const int r = q0 + i;
      lses[i] = r < LQ ? fwd[(qbase + r) * (EV + 1) + EV] * LOG2E : 0.0f;
      deltas[i] = r < LQ ? dsum[qbase + r] : 0.0f;
    }
    TG_BARRIER();
    const int n = min(BLOCK, LQ - q0);
    for (int i = CAUSAL ? max(0, key - q0) : 0; i < n; i++) {
      float x = 0.0f, dp = 0.0f;
      for (int d = 0; d < E; d++) x += qs[i * E + d] * kr[d];
      for (int d = 0; d < EV; d++) dp += dos[i * EV + d] * vr[d];
      const float p = TG_EXP2(x - lses[i]), ds = p * (dp - deltas[i]);
      for (int d = 0; d < EV; d++) dv[d] += p * dos[i * EV + d];
      for (int d = 0; d < E; d++) dk[d] += ds * qs[i * E + d];
    }
  }
  if (key < SK) {
    const TG_I64 o = ((TG_I64)head * SK + key) * (E + EV);
    for (int d = 0; d < E; d++) dkv[o + d] = dk[d] * SCALE;
    for (int d = 0; d < EV; d++) dkv[o + E + d] = dv[d];
  }
}
)";

// Note [tensor-core attention]: what the three tensor-core kernels share. tg_pack rounds two
// floats to the input type, the first in the low half (the lower column of a fragment pair).
constexpr const char* TENSOR_CORE_HELPERS = R"(
static __device__ __forceinline__ unsigned tg_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn." TG_MMA_T "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
static __device__ __forceinline__ void tg_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TG_MMA_T "." TG_MMA_T ".f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#define KS (E + 8)
#define VS (EV + 8)
)";

// Note [tensor-core attention]: the forward pass.
constexpr const char* FORWARD_TENSOR_CORES = R"(
extern "C" __global__ void __launch_bounds__(128) TG_NAME(float* out, const unsigned short* q, const unsigned short* k,
                                                          const unsigned short* v) {
  __shared__ __align__(16) unsigned short ks[64 * KS];
  __shared__ __align__(16) unsigned short vs[64 * VS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int head = blockIdx.y, first = blockIdx.x * 64;
  const int r0 = first + warp * 16 + g, r1 = r0 + 8;
  const long long qb = (long long)head * LQ, kb = (long long)head * SK;
  unsigned qa[E / 16][4];
#pragma unroll
  for (int kk = 0; kk < E / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    qa[kk][0] = r0 < LQ ? *(const unsigned*)(q + (qb + r0) * E + c) : 0u;
    qa[kk][1] = r1 < LQ ? *(const unsigned*)(q + (qb + r1) * E + c) : 0u;
    qa[kk][2] = r0 < LQ ? *(const unsigned*)(q + (qb + r0) * E + c + 8) : 0u;
    qa[kk][3] = r1 < LQ ? *(const unsigned*)(q + (qb + r1) * E + c + 8) : 0u;
  }
  float o[EV / 8][4];
#pragma unroll
  for (int n = 0; n < EV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = NEG_BIG, m1 = NEG_BIG, l0 = 0.0f, l1 = 0.0f;
  const int kend = CAUSAL ? min(SK, first + 64) : SK;
  for (int k0 = 0; k0 < kend; k0 += 64) {
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * (E / 2); i += 128) {
      const int j = i / (E / 2), c = i % (E / 2) * 2;
      *(unsigned*)(ks + j * KS + c) = k0 + j < SK ? *(const unsigned*)(k + (kb + k0 + j) * E + c) : 0u;
    }
    for (int i = threadIdx.x; i < 64 * (EV / 2); i += 128) {
      const int j = i / (EV / 2), c = i % (EV / 2) * 2;
      *(unsigned*)(vs + j * VS + c) = k0 + j < SK ? *(const unsigned*)(v + (kb + k0 + j) * EV + c) : 0u;
    }
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const unsigned short* kr = ks + (n * 8 + g) * KS + 2 * t;
#pragma unroll
      for (int kk = 0; kk < E / 16; kk++)
        tg_mma(s[n], qa[kk], *(const unsigned*)(kr + kk * 16), *(const unsigned*)(kr + kk * 16 + 8));
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = k0 + n * 8 + 2 * t + e;
        s[n][e] = col < SK && (!CAUSAL || col <= r0) ? s[n][e] * SCALE_LOG2 : NEG_BIG;
        s[n][2 + e] = col < SK && (!CAUSAL || col <= r1) ? s[n][2 + e] * SCALE_LOG2 : NEG_BIG;
        mx0 = fmaxf(mx0, s[n][e]);
        mx1 = fmaxf(mx1, s[n][2 + e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float a0 = exp2f(m0 - mx0), a1 = exp2f(m1 - mx1);
    l0 *= a0;
    l1 *= a1;
#pragma unroll
    for (int n = 0; n < EV / 8; n++) o[n][0] *= a0, o[n][1] *= a0, o[n][2] *= a1, o[n][3] *= a1;
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s[n][0] = exp2f(s[n][0] - mx0), s[n][1] = exp2f(s[n][1] - mx0);
      s[n][2] = exp2f(s[n][2] - mx1), s[n][3] = exp2f(s[n][3] - mx1);
      l0 += s[n][0] + s[n][1];
      l1 += s[n][2] + s[n][3];
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const unsigned pa[4] = {tg_pack(s[2 * kk][0], s[2 * kk][1]), tg_pack(s[2 * kk][2], s[2 * kk][3]),
                              tg_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), tg_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const unsigned short* vr = vs + (kk * 16 + 2 * t) * VS + g;
#pragma unroll
      for (int n = 0; n < EV / 8; n++) {
        const unsigned b0 = (unsigned)vr[n * 8] | ((unsigned)vr[n * 8 + VS] << 16);
        const unsigned b1 = (unsigned)vr[n * 8 + 8 * VS] | ((unsigned)vr[n * 8 + 9 * VS] << 16);
        tg_mma(o[n], pa, b0, b1);
      }
    }
    m0 = mx0;
    m1 = mx1;
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (r0 < LQ) {
    float* row = out + (qb + r0) * (EV + 1);
#pragma unroll
    for (int n = 0; n < EV / 8; n++) row[n * 8 + 2 * t] = o[n][0] / l0, row[n * 8 + 2 * t + 1] = o[n][1] / l0;
    if (t == 0) row[EV] = (m0 + log2f(l0)) * LN2;
  }
  if (r1 < LQ) {
    float* row = out + (qb + r1) * (EV + 1);
#pragma unroll
    for (int n = 0; n < EV / 8; n++) row[n * 8 + 2 * t] = o[n][2] / l1, row[n * 8 + 2 * t + 1] = o[n][3] / l1;
    if (t == 0) row[EV] = (m1 + log2f(l1)) * LN2;
  }
}
)";

// Note [tensor-core attention]: dQ. As the forward pass, with dO's fragments (rounded from
// float32) beside q's: S = q k^T and dP = dO v^T per key block, dS = P * (dP - D) with P =
// exp(S - L), and dQ += dS k with dS as the A fragments.
constexpr const char* BACKWARD_Q_TENSOR_CORES = R"(
extern "C" __global__ void __launch_bounds__(128) TG_NAME(float* dq, const unsigned short* q, const unsigned short* k,
                                                          const unsigned short* v, const float* fwd, const float* dout,
                                                          const float* dsum) {
  __shared__ __align__(16) unsigned short ks[64 * KS];
  __shared__ __align__(16) unsigned short vs[64 * VS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int head = blockIdx.y, first = blockIdx.x * 64;
  const int r0 = first + warp * 16 + g, r1 = r0 + 8;
  const long long qb = (long long)head * LQ, kb = (long long)head * SK;
  unsigned qa[E / 16][4], da[EV / 16][4];
#pragma unroll
  for (int kk = 0; kk < E / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    qa[kk][0] = r0 < LQ ? *(const unsigned*)(q + (qb + r0) * E + c) : 0u;
    qa[kk][1] = r1 < LQ ? *(const unsigned*)(q + (qb + r1) * E + c) : 0u;
    qa[kk][2] = r0 < LQ ? *(const unsigned*)(q + (qb + r0) * E + c + 8) : 0u;
    qa[kk][3] = r1 < LQ ? *(const unsigned*)(q + (qb + r1) * E + c + 8) : 0u;
  }
#pragma unroll
  for (int kk = 0; kk < EV / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    const float* d0 = dout + (qb + (r0 < LQ ? r0 : 0)) * EV + c;
    const float* d1 = dout + (qb + (r1 < LQ ? r1 : 0)) * EV + c;
    da[kk][0] = r0 < LQ ? tg_pack(d0[0], d0[1]) : 0u;
    da[kk][1] = r1 < LQ ? tg_pack(d1[0], d1[1]) : 0u;
    da[kk][2] = r0 < LQ ? tg_pack(d0[8], d0[9]) : 0u;
    da[kk][3] = r1 < LQ ? tg_pack(d1[8], d1[9]) : 0u;
  }
  const float lse0 = r0 < LQ ? fwd[(qb + r0) * (EV + 1) + EV] * LOG2E : 0.0f;
  const float lse1 = r1 < LQ ? fwd[(qb + r1) * (EV + 1) + EV] * LOG2E : 0.0f;
  const float dd0 = r0 < LQ ? dsum[qb + r0] : 0.0f, dd1 = r1 < LQ ? dsum[qb + r1] : 0.0f;
  float acc[E / 8][4];
#pragma unroll
  for (int n = 0; n < E / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const int kend = CAUSAL ? min(SK, first + 64) : SK;
  for (int k0 = 0; k0 < kend; k0 += 64) {
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * (E / 2); i += 128) {
      const int j = i / (E / 2), c = i % (E / 2) * 2;
      *(unsigned*)(ks + j * KS + c) = k0 + j < SK ? *(const unsigned*)(k + (kb + k0 + j) * E + c) : 0u;
    }
    for (int i = threadIdx.x; i < 64 * (EV / 2); i += 128) {
      const int j = i / (EV / 2), c = i % (EV / 2) * 2;
      *(unsigned*)(vs + j * VS + c) = k0 + j < SK ? *(const unsigned*)(v + (kb + k0 + j) * EV + c) : 0u;
    }
    __syncthreads();
    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
      const unsigned short* kr = ks + (n * 8 + g) * KS + 2 * t;
      const unsigned short* vr = vs + (n * 8 + g) * VS + 2 * t;
#pragma unroll
      for (int kk = 0; kk < E / 16; kk++)
        tg_mma(s[n], qa[kk], *(const unsigned*)(kr + kk * 16), *(const unsigned*)(kr + kk * 16 + 8));
#pragma unroll
      for (int kk = 0; kk < EV / 16; kk++)
        tg_mma(dp[n], da[kk], *(const unsigned*)(vr + kk * 16), *(const unsigned*)(vr + kk * 16 + 8));
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = k0 + n * 8 + 2 * t + e;
        const float p0 = col < SK && (!CAUSAL || col <= r0) ? exp2f(s[n][e] * SCALE_LOG2 - lse0) : 0.0f;
        const float p1 = col < SK && (!CAUSAL || col <= r1) ? exp2f(s[n][2 + e] * SCALE_LOG2 - lse1) : 0.0f;
        s[n][e] = p0 * (dp[n][e] - dd0);
        s[n][2 + e] = p1 * (dp[n][2 + e] - dd1);
      }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const unsigned sa[4] = {tg_pack(s[2 * kk][0], s[2 * kk][1]), tg_pack(s[2 * kk][2], s[2 * kk][3]),
                              tg_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), tg_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const unsigned short* kc = ks + (kk * 16 + 2 * t) * KS + g;
#pragma unroll
      for (int n = 0; n < E / 8; n++) {
        const unsigned b0 = (unsigned)kc[n * 8] | ((unsigned)kc[n * 8 + KS] << 16);
        const unsigned b1 = (unsigned)kc[n * 8 + 8 * KS] | ((unsigned)kc[n * 8 + 9 * KS] << 16);
        tg_mma(acc[n], sa, b0, b1);
      }
    }
  }
  if (r0 < LQ)
#pragma unroll
    for (int n = 0; n < E / 8; n++) {
      dq[(qb + r0) * E + n * 8 + 2 * t] = acc[n][0] * SCALE;
      dq[(qb + r0) * E + n * 8 + 2 * t + 1] = acc[n][1] * SCALE;
    }
  if (r1 < LQ)
#pragma unroll
    for (int n = 0; n < E / 8; n++) {
      dq[(qb + r1) * E + n * 8 + 2 * t] = acc[n][2] * SCALE;
      dq[(qb + r1) * E + n * 8 + 2 * t + 1] = acc[n][3] * SCALE;
    }
}
)";

// Note [tensor-core attention]: dK and dV. 16 key rows a warp, their k and v fragments in
// registers; per block of 64 query rows (q, dO rounded from float32, L and D in shared memory)
// S^T = k q^T and dP^T = v dO^T, P^T = exp(S^T - L), dS^T = P^T * (dP^T - D); then dV += P^T dO
// and dK += dS^T q with P^T and dS^T as the A fragments.
constexpr const char* BACKWARD_KV_TENSOR_CORES = R"(
#define QS (E + 8)
#define DS (EV + 8)
extern "C" __global__ void __launch_bounds__(128) TG_NAME(float* dkv, const unsigned short* q, const unsigned short* k,
                                                          const unsigned short* v, const float* fwd, const float* dout,
                                                          const float* dsum) {
  __shared__ __align__(16) unsigned short qs[64 * QS];
  __shared__ __align__(16) unsigned short dos[64 * DS];
  __shared__ float lses[64];
  __shared__ float deltas[64];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int head = blockIdx.y, first = blockIdx.x * 64;
  const int r0 = first + warp * 16 + g, r1 = r0 + 8;
  const long long qb = (long long)head * LQ, kb = (long long)head * SK;
  unsigned ka[E / 16][4], va[EV / 16][4];
#pragma unroll
  for (int kk = 0; kk < E / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    ka[kk][0] = r0 < SK ? *(const unsigned*)(k + (kb + r0) * E + c) : 0u;
    ka[kk][1] = r1 < SK ? *(const unsigned*)(k + (kb + r1) * E + c) : 0u;
    ka[kk][2] = r0 < SK ? *(const unsigned*)(k + (kb + r0) * E + c + 8) : 0u;
    ka[kk][3] = r1 < SK ? *(const unsigned*)(k + (kb + r1) * E + c + 8) : 0u;
  }
#pragma unroll
  for (int kk = 0; kk < EV / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    va[kk][0] = r0 < SK ? *(const unsigned*)(v + (kb + r0) * EV + c) : 0u;
    va[kk][1] = r1 < SK ? *(const unsigned*)(v + (kb + r1) * EV + c) : 0u;
    va[kk][2] = r0 < SK ? *(const unsigned*)(v + (kb + r0) * EV + c + 8) : 0u;
    va[kk][3] = r1 < SK ? *(const unsigned*)(v + (kb + r1) * EV + c + 8) : 0u;
  }
  float dk[E / 8][4], dv[EV / 8][4];
#pragma unroll
  for (int n = 0; n < E / 8; n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
#pragma unroll
  for (int n = 0; n < EV / 8; n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  for (int q0 = CAUSAL ? first : 0; q0 < LQ; q0 += 64) {
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * (E / 2); i += 128) {
      const int j = i / (E / 2), c = i % (E / 2) * 2;
      *(unsigned*)(qs + j * QS + c) = q0 + j < LQ ? *(const unsigned*)(q + (qb + q0 + j) * E + c) : 0u;
    }
    for (int i = threadIdx.x; i < 64 * (EV / 2); i += 128) {
      const int j = i / (EV / 2), c = i % (EV / 2) * 2;
      const float* d = dout + (qb + q0 + j) * EV + c;
      *(unsigned*)(dos + j * DS + c) = q0 + j < LQ ? tg_pack(d[0], d[1]) : 0u;
    }
    if (threadIdx.x < 64) {
      const int j = q0 + threadIdx.x;
      lses[threadIdx.x] = j < LQ ? fwd[(qb + j) * (EV + 1) + EV] * LOG2E : 0.0f;
      deltas[threadIdx.x] = j < LQ ? dsum[qb + j] : 0.0f;
    }
    __syncthreads();
    float st[8][4], dpt[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) {
      st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
      dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
      const unsigned short* qr = qs + (n * 8 + g) * QS + 2 * t;
      const unsigned short* dr = dos + (n * 8 + g) * DS + 2 * t;
#pragma unroll
      for (int kk = 0; kk < E / 16; kk++)
        tg_mma(st[n], ka[kk], *(const unsigned*)(qr + kk * 16), *(const unsigned*)(qr + kk * 16 + 8));
#pragma unroll
      for (int kk = 0; kk < EV / 16; kk++)
        tg_mma(dpt[n], va[kk], *(const unsigned*)(dr + kk * 16), *(const unsigned*)(dr + kk * 16 + 8));
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = n * 8 + 2 * t + e, qi = q0 + col;
        const float p0 = qi < LQ && (!CAUSAL || r0 <= qi) ? exp2f(st[n][e] * SCALE_LOG2 - lses[col]) : 0.0f;
        const float p1 = qi < LQ && (!CAUSAL || r1 <= qi) ? exp2f(st[n][2 + e] * SCALE_LOG2 - lses[col]) : 0.0f;
        st[n][e] = p0;
        st[n][2 + e] = p1;
        dpt[n][e] = p0 * (dpt[n][e] - deltas[col]);
        dpt[n][2 + e] = p1 * (dpt[n][2 + e] - deltas[col]);
      }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const unsigned pa[4] = {tg_pack(st[2 * kk][0], st[2 * kk][1]), tg_pack(st[2 * kk][2], st[2 * kk][3]),
                              tg_pack(st[2 * kk + 1][0], st[2 * kk + 1][1]), tg_pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const unsigned sa[4] = {tg_pack(dpt[2 * kk][0], dpt[2 * kk][1]), tg_pack(dpt[2 * kk][2], dpt[2 * kk][3]),
                              tg_pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                              tg_pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
      const unsigned short* dc = dos + (kk * 16 + 2 * t) * DS + g;
      const unsigned short* qc = qs + (kk * 16 + 2 * t) * QS + g;
#pragma unroll
      for (int n = 0; n < EV / 8; n++) {
        const unsigned b0 = (unsigned)dc[n * 8] | ((unsigned)dc[n * 8 + DS] << 16);
        const unsigned b1 = (unsigned)dc[n * 8 + 8 * DS] | ((unsigned)dc[n * 8 + 9 * DS] << 16);
        tg_mma(dv[n], pa, b0, b1);
      }
#pragma unroll
      for (int n = 0; n < E / 8; n++) {
        const unsigned b0 = (unsigned)qc[n * 8] | ((unsigned)qc[n * 8 + QS] << 16);
        const unsigned b1 = (unsigned)qc[n * 8 + 8 * QS] | ((unsigned)qc[n * 8 + 9 * QS] << 16);
        tg_mma(dk[n], sa, b0, b1);
      }
    }
  }
  if (r0 < SK) {
    float* row = dkv + (kb + r0) * (E + EV);
#pragma unroll
    for (int n = 0; n < E / 8; n++) row[n * 8 + 2 * t] = dk[n][0] * SCALE, row[n * 8 + 2 * t + 1] = dk[n][1] * SCALE;
#pragma unroll
    for (int n = 0; n < EV / 8; n++) row[E + n * 8 + 2 * t] = dv[n][0], row[E + n * 8 + 2 * t + 1] = dv[n][1];
  }
  if (r1 < SK) {
    float* row = dkv + (kb + r1) * (E + EV);
#pragma unroll
    for (int n = 0; n < E / 8; n++) row[n * 8 + 2 * t] = dk[n][2] * SCALE, row[n * 8 + 2 * t + 1] = dk[n][3] * SCALE;
#pragma unroll
    for (int n = 0; n < EV / 8; n++) row[E + n * 8 + 2 * t] = dv[n][2], row[E + n * 8 + 2 * t + 1] = dv[n][3];
  }
}
)";

const char* tensor_core_template_of(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward: return FORWARD_TENSOR_CORES;
    case TemplateKernel::AttentionBackwardQ: return BACKWARD_Q_TENSOR_CORES;
    case TemplateKernel::AttentionBackwardKV: return BACKWARD_KV_TENSOR_CORES;
  }
  return "";
}

const char* template_of(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward: return FORWARD;
    case TemplateKernel::AttentionBackwardQ: return BACKWARD_Q;
    case TemplateKernel::AttentionBackwardKV: return BACKWARD_KV;
  }
  return "";
}

const char* kernel_word(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward: return "attention";
    case TemplateKernel::AttentionBackwardQ: return "attention_dq";
    case TemplateKernel::AttentionBackwardKV: return "attention_dkv";
  }
  return "";
}

// "attention_8_256_256_64c": bh, L, S, the head dim, and c when causal.
std::string kernel_name(const AttentionSpec& s) {
  return std::string(kernel_word(s.kernel)) + "_" + std::to_string(s.bh) + "_" + std::to_string(s.l) + "_" +
         std::to_string(s.s) + "_" + std::to_string(s.e) + (s.causal ? "c" : "") + (s.tensor_cores ? "_tc" : "");
}

// Rows each group takes: query rows (forward, dQ) or key rows (dK/dV).
int64_t rows_of(const AttentionSpec& s) { return s.kernel == TemplateKernel::AttentionBackwardKV ? s.s : s.l; }

std::vector<KernelParam> params_of(const AttentionSpec& s) {
  std::vector<KernelParam> p{{DType::Float32, true}, {s.dtype, false}, {s.dtype, false}, {s.dtype, false}};
  if (s.kernel != TemplateKernel::AttentionForward)
    for (int i = 0; i < 3; i++) p.push_back({DType::Float32, false});
  return p;
}

}  // namespace

std::vector<int64_t> AttentionSpec::encode() const {
  return {static_cast<int64_t>(kernel), bh, l, s, e, ev, static_cast<int64_t>(dtype), causal ? 1 : 0,
          std::bit_cast<int64_t>(scale), tensor_cores ? 1 : 0};
}

AttentionSpec AttentionSpec::decode(const std::vector<int64_t>& a) {
  TG_ASSERT(a.size() == 10, "attention kernel arg has ", a.size(), " entries");
  return AttentionSpec{static_cast<TemplateKernel>(a[0]), a[1], a[2], a[3], a[4], a[5], static_cast<DType>(a[6]),
                       a[7] != 0, std::bit_cast<double>(a[8]), a[9] != 0};
}

Shape AttentionSpec::output_shape() const {
  switch (kernel) {
    case TemplateKernel::AttentionForward: return {bh, l, ev + 1};
    case TemplateKernel::AttentionBackwardQ: return {bh, l, e};
    case TemplateKernel::AttentionBackwardKV: return {bh, s, e + ev};
  }
  return {};
}

std::optional<KernelDialect> kernel_dialect(const Renderer& renderer) {
  if (dynamic_cast<const CUDARenderer*>(&renderer)) return KernelDialect::CUDA;
  if (dynamic_cast<const OpenCLRenderer*>(&renderer)) return KernelDialect::OpenCL;
  return std::nullopt;
}

bool attention_kernel_takes(const AttentionSpec& s, KernelDialect d) {
  bool dtype_ok = s.dtype == DType::Float32 || s.dtype == DType::BFloat16 ||
                  (s.dtype == DType::Float16 && d == KernelDialect::CUDA);
  bool tensor_cores_ok =
      !s.tensor_cores || (d == KernelDialect::CUDA && is_half(s.dtype) && s.e % 16 == 0 && s.ev % 16 == 0);
  return dtype_ok && tensor_cores_ok && s.e >= 1 && s.e <= MAX_HEAD_DIM && s.ev >= 1 && s.ev <= MAX_HEAD_DIM &&
         s.l >= 1 && s.s >= 1 && s.bh >= 1 && s.bh <= MAX_GROUPS_Y && s.l < (int64_t{1} << 30) &&
         s.s < (int64_t{1} << 30);
}

bool attention_tensor_cores_take(const AttentionSpec& s, KernelDialect d) {
  AttentionSpec tc = s;
  tc.tensor_cores = true;
  return attention_kernel_takes(tc, d);
}

TemplateSource render_attention(const AttentionSpec& s, KernelDialect d) {
  TG_ASSERT(attention_kernel_takes(s, d), "attention kernel for sizes it does not take");
  TemplateSource out;
  LinearKernel& k = out.kernel;
  k.name = kernel_name(s);
  k.params = params_of(s);
  if (s.tensor_cores) {  // Note [tensor-core attention]
    k.global_size = {(rows_of(s) + TC_ROWS - 1) / TC_ROWS * TC_THREADS, s.bh};
    k.local_size = {TC_THREADS, 1};
    out.source = size_macros(s) + define("TG_NAME", k.name) +
                 define("TG_MMA_T", s.dtype == DType::BFloat16 ? "\"bf16\"" : "\"f16\"") + TENSOR_CORE_HELPERS +
                 tensor_core_template_of(s.kernel);
    return out;
  }
  int64_t groups = (rows_of(s) + ROWS_PER_GROUP - 1) / ROWS_PER_GROUP;
  k.global_size = {groups * ROWS_PER_GROUP, s.bh};
  k.local_size = {ROWS_PER_GROUP, 1};
  out.source = dialect_macros(d) + input_macros(s.dtype, d) + size_macros(s) + define("TG_NAME", k.name) +
               template_of(s.kernel);
  return out;
}

namespace {

// Row i's scaled scores over the keys of head h; -inf where masked.
std::vector<double> scores(const AttentionSpec& s, const std::vector<double>& q, const std::vector<double>& k, int64_t h,
                           int64_t i) {
  std::vector<double> x(static_cast<size_t>(s.s), -std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < s.s; j++) {
    if (s.causal && j > i) continue;
    double dot = 0;
    for (int64_t d = 0; d < s.e; d++)
      dot += q[static_cast<size_t>((h * s.l + i) * s.e + d)] * k[static_cast<size_t>((h * s.s + j) * s.e + d)];
    x[static_cast<size_t>(j)] = dot * s.scale;
  }
  return x;
}

double logsumexp(const std::vector<double>& x) {
  double mx = *std::max_element(x.begin(), x.end()), sum = 0;
  for (double v : x) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

// The weights exp(x - lse) of scores x.
std::vector<double> weights(std::vector<double> x, double lse) {
  for (double& v : x) v = std::exp(v - lse);
  return x;
}

}  // namespace

// Note [fused attention]: the three kernels' results, from the same inputs (the backward ones
// read L from the forward output and D as given).
std::vector<double> template_kernel_reference(const std::vector<int64_t>& arg,
                                              const std::vector<const std::vector<double>*>& in) {
  AttentionSpec s = AttentionSpec::decode(arg);
  const std::vector<double>&q = *in.at(0), &k = *in.at(1), &v = *in.at(2);
  std::vector<double> out(static_cast<size_t>(prod(s.output_shape())), 0.0);
  auto at = [](int64_t row, int64_t width, int64_t col) { return static_cast<size_t>(row * width + col); };
  for (int64_t h = 0; h < s.bh; h++)
    for (int64_t i = 0; i < s.l; i++) {
      const int64_t row = h * s.l + i;
      if (s.kernel == TemplateKernel::AttentionForward) {
        std::vector<double> x = scores(s, q, k, h, i);
        double lse = logsumexp(x);
        std::vector<double> p = weights(x, lse);
        for (int64_t d = 0; d < s.ev; d++)
          for (int64_t j = 0; j < s.s; j++) out[at(row, s.ev + 1, d)] += p[static_cast<size_t>(j)] * v[at(h * s.s + j, s.ev, d)];
        out[at(row, s.ev + 1, s.ev)] = lse;
        continue;
      }
      const std::vector<double>&fwd = *in.at(3), &dout = *in.at(4), &dsum = *in.at(5);
      std::vector<double> p = weights(scores(s, q, k, h, i), fwd[at(row, s.ev + 1, s.ev)]);
      for (int64_t j = 0; j < s.s; j++) {
        double dp = 0, pj = p[static_cast<size_t>(j)];
        for (int64_t d = 0; d < s.ev; d++) dp += dout[at(row, s.ev, d)] * v[at(h * s.s + j, s.ev, d)];
        double ds = pj * (dp - dsum[static_cast<size_t>(row)]) * s.scale;
        if (s.kernel == TemplateKernel::AttentionBackwardQ) {
          for (int64_t d = 0; d < s.e; d++) out[at(row, s.e, d)] += ds * k[at(h * s.s + j, s.e, d)];
          continue;
        }
        const int64_t key = h * s.s + j;
        for (int64_t d = 0; d < s.e; d++) out[at(key, s.e + s.ev, d)] += ds * q[at(row, s.e, d)];
        for (int64_t d = 0; d < s.ev; d++) out[at(key, s.e + s.ev, s.e + d)] += pj * dout[at(row, s.ev, d)];
      }
    }
  return out;
}

TemplateSource render_template_kernel(const UOp& kernel, const Renderer& renderer) {
  TG_ASSERT(kernel.op == Op::TEMPLATE_KERNEL, "render_template_kernel of ", op_name(kernel.op));
  std::optional<KernelDialect> d = kernel_dialect(renderer);
  TG_ASSERT(d, "a template kernel was scheduled for a device without a template dialect");
  return render_attention(AttentionSpec::decode(kernel.arg_ints()), *d);
}

}  // namespace tg
