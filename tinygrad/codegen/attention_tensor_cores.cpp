// The tensor-core forms of the fused attention kernels (CUDA, bfloat16/float16): their template
// text, which codegen/attention_kernel.cpp renders with the sizes of one call.
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
#include "tinygrad/codegen/attention_tensor_cores.h"

#include <algorithm>

#include "tinygrad/error.h"

namespace tg {

// Note [template pieces].
std::string fill(std::string_view text, std::initializer_list<std::pair<std::string_view, std::string>> values) {
  std::string out;
  for (size_t at = 0;;) {
    size_t open = text.find("${", at);
    if (open == std::string_view::npos) return out.append(text.substr(at));
    size_t close = text.find('}', open);
    TG_ASSERT(close != std::string_view::npos, "template piece: an unclosed hole");
    std::string_view name = text.substr(open + 2, close - open - 2);
    auto value = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    TG_ASSERT(value != values.end(), "template piece: no value for ${", name, "}");
    out.append(text.substr(at, open - at)).append(value->second);
    at = close + 1;
  }
}

namespace {

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

const char* template_of(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward: return FORWARD_TENSOR_CORES;
    case TemplateKernel::AttentionBackwardQ: return BACKWARD_Q_TENSOR_CORES;
    case TemplateKernel::AttentionBackwardKV: return BACKWARD_KV_TENSOR_CORES;
  }
  return "";
}

}  // namespace

std::string tensor_core_attention_source(TemplateKernel k) { return std::string(TENSOR_CORE_HELPERS) + template_of(k); }

}  // namespace tg
