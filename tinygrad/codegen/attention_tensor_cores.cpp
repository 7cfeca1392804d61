// The tensor-core forms of the fused attention kernels (CUDA, bfloat16/float16): their template
// text, which codegen/attention_kernel.cpp renders with the sizes of one call.
//
// Note [tensor-core attention]: on CUDA, for bfloat16/float16 inputs and head dims that are
// multiples of 16 (AttentionSpec::tensor_cores, FLASH_ATTENTION=2), the three kernels run their
// products on the tensor cores with mma.sync.m16n8k16 (float32 accumulators). A block of 4 warps
// takes 64 query rows, 16 a warp (or twice that: Note [m-tiles a warp]), whose q fragments stay in
// registers; blocks of 64 keys and values are staged in shared memory (rows padded by 8 elements,
// so the fragment loads of a warp hit 32 different banks). S = q k^T is 8 m16n8 tiles a warp (a row
// tile); each thread holds 2 of each tile's 16 rows (g = lane / 4 and g + 8) and 2 columns of each,
// so a row's max and sum meet over the 4 threads of a quad by two shuffles. The weights P, rounded
// to the input type, are already laid out as the A fragments of P v (the C fragment of an m16n8
// tile pairs with the next tile's into one m16n8k16 A fragment), so they never leave registers. The
// running max, rescaling and logsumexp are those of Note [fused attention]. The backward kernels
// work the same way over 64 rows a block (dQ: query rows walking key blocks; dK/dV: key rows
// walking query blocks), dO rounded from float32 to the input type where it enters a product; each
// product's accumulators become the next product's A fragments (P and dS) in registers. O, dQ, dK
// and dV are written in the input type (pairs of columns packed into one 32-bit store), which is
// what their readers would round them to next (Note [the forward's output] in attention_kernel.cpp).
#include "tinygrad/codegen/attention_tensor_cores.h"

#include <array>
#include <functional>
#include <vector>

#include "tinygrad/codegen/attention_pieces.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

namespace {

// Note [tensor-core attention]: what the three tensor-core kernels share. tg_pack rounds two
// floats to the input type, the first in the low half (the lower column of a fragment pair).
constexpr const char* TENSOR_CORE_HELPERS = R"(
static __device__ __forceinline__ unsigned tg_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn." TG_MMA_T "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Note [the forward's output] (attention_kernel.cpp): x as two values of the input type, x rounded
// and the rest, packed as tg_pack packs them.
static __device__ __forceinline__ unsigned tg_split(float x) {
  const unsigned short rounded = (unsigned short)(tg_pack(x, 0.0f) & 0xffffu);
  float r;
#if TG_BF16
  r = __uint_as_float((unsigned)rounded << 16);
#else
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(rounded));
#endif
  return tg_pack(x, x - r);
}
static __device__ __forceinline__ void tg_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TG_MMA_T "." TG_MMA_T ".f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8x8 tiles of 16-bit elements from shared memory into the fragments of a warp (ldmatrix):
// lane i supplies the address of row i % 8 of tile i / 8; _t transposes each tile.
static __device__ __forceinline__ void tg_ldsm4(unsigned* r, const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(p)));
}
static __device__ __forceinline__ void tg_ldsm4_t(unsigned* r, const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(p)));
}
// Asynchronous copies into shared memory (cp.async): 16 bytes, or 4 where the source is not
// 16-byte aligned; `valid` false writes zeros. A group is committed per block; waiting for all
// but the last group leaves the newest block's copies in flight.
static __device__ __forceinline__ void tg_cp16(unsigned short* dst, const unsigned short* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void tg_cp4(unsigned short* dst, const unsigned short* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void tg_cp4f(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 4 : 0));
}
// Note [whole blocks]: 2^x by the special-function unit alone (CUDA's exp2f adds a rescaling for
// results below float32's normal range, where a weight is negligible anyway).
static __device__ __forceinline__ float tg_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
static __device__ __forceinline__ void tg_cp_commit() { asm volatile("cp.async.commit_group;"); }
static __device__ __forceinline__ void tg_cp_wait_all_but_last() { asm volatile("cp.async.wait_group 1;"); }
static __device__ __forceinline__ void tg_cp_wait_all() { asm volatile("cp.async.wait_group 0;"); }
#define KS (E + 8)
#define VS (EV + 8)
// Note [staged key blocks]: two stages where they fit in 48 KB of shared memory, else one
#define TG_STAGES (2 * 64 * (KS + VS) * 2 <= 48 * 1024 ? 2 : 1)
)";

// Note [m-tiles a warp]: a warp may own MT tiles of 16 rows, tile mt of warp w being rows
// first + 64 mt + 16 w to + 15 of a block of 64 MT; every fragment array, accumulator and row
// statistic has an [MT] index, and each B fragment loaded from shared memory (ldmatrix) feeds MT
// mma instructions instead of one. With two tiles the forward pass reads K and V from shared
// memory half as often per product and copies each key block into it once for 128 query rows, as
// FlashAttention-2's forward kernel does; its registers go from 140 to 242 (nvcc -Xptxas -v,
// sm_90, GPT-2's head dim 64), no spills, so 2 blocks of 4 warps fit a multiprocessor instead of
// 3. dQ at two tiles spills (276 bytes) and dK/dV more (1772), so they keep one. On an H100, GPT-2's
// forward (16 x 12 heads x 1024 x 64, causal; `DEBUG=2 test_attention_cuda --gtest_filter=*Gpt2Size*`)
// took 0.180 ms a layer with two tiles against 0.203 with one, and the step 39.75 / 40.03 ms
// against 40.15 / 40.32 (two runs each). ATTENTION_FORWARD_TILES chooses (2 by default).
//
// Note [tensor-core attention]: the pieces of the three kernels, written once (Note [template
// pieces] in attention_pieces.h). A thread's two fragment rows of m-tile mt are r[mt][0] and
// r[mt][1] = r[mt][0] + 8: the first and second halves (columns 0, 1 and 2, 3) of each accumulator tile; a
// piece with ${h},
// ${e}, ${c0} and ${c1} holes is written for one half and filled for both (halves()).
std::string halves(const std::string& text) {
  std::string out;
  for (auto [h, e, c0, c1] : {std::array<const char*, 4>{"0", "e", "0", "1"}, {"1", "2 + e", "2", "3"}})
    out += fill(text, {{"h", h}, {"e", e}, {"c0", c0}, {"c1", c1}});
  return out;
}

constexpr const char* SIGNATURE =
    R"(extern "C" __global__ void __launch_bounds__(128) TG_NAME(${out_type}* ${out}, const unsigned short* q, const unsigned short* k,
                                                          const unsigned short* v${backward}) {
)";
constexpr const char* BACKWARD_PARAMS = R"(, const float* row_lse, const unsigned short* dout,
                                                          const float* dsum)";

// A backward kernel's signature: its output `out` in the input type, then q, k, v, the rows' L
// (Note [the forward's output] in attention_kernel.cpp), dO and D.
std::string backward_signature(const char* out) {
  return fill(SIGNATURE, {{"out_type", "unsigned short"}, {"out", out}, {"backward", BACKWARD_PARAMS}});
}

constexpr const char* IDS =
    R"(  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int head = blockIdx.y, first = blockIdx.x * 64 * MT;
  int r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) r[mt][0] = first + mt * 64 + warp * 16 + g, r[mt][1] = r[mt][0] + 8;
  const long long qb = (long long)head * LQ, kb = (long long)head * SK;
)";

// A side of the problem in global memory: its tensor, the macros of its rows' starts and their
// alignment (Note [strided operands] in tensor_attention.cpp), its rows.
struct Side {
  const char *src, *row, *aligned, *count;
};
constexpr Side QUERIES{"q", "Q_ROW", "Q_A16", "LQ"}, KEYS{"k", "K_ROW", "K_A16", "SK"},
    VALUES{"v", "V_ROW", "V_A16", "SK"}, OUTPUT_GRADS{"dout", "DO_ROW", "DO_A16", "LQ"};

// The A fragments `a` of the warp's own rows of `side` (width E or EV), kept in registers.
constexpr const char* ROW_FRAGMENTS = R"(#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int kk = 0; kk < ${width} / 16; kk++) {
      const int c = kk * 16 + 2 * t;
      ${a}[mt][kk][0] = r[mt][0] < ${count} ? *(const unsigned*)(${src} + ${row}(head, r[mt][0]) + c) : 0u;
      ${a}[mt][kk][1] = r[mt][1] < ${count} ? *(const unsigned*)(${src} + ${row}(head, r[mt][1]) + c) : 0u;
      ${a}[mt][kk][2] = r[mt][0] < ${count} ? *(const unsigned*)(${src} + ${row}(head, r[mt][0]) + c + 8) : 0u;
      ${a}[mt][kk][3] = r[mt][1] < ${count} ? *(const unsigned*)(${src} + ${row}(head, r[mt][1]) + c + 8) : 0u;
    }
)";

std::string row_fragments(const char* a, const Side& side, const char* width) {
  return fill(ROW_FRAGMENTS,
              {{"a", a}, {"src", side.src}, {"row", side.row}, {"count", side.count}, {"width", width}});
}

std::string zero_tile(const std::string& acc, const char* tile = "n") {
  return fill("${acc}[mt][${n}][0] = ${acc}[mt][${n}][1] = ${acc}[mt][${n}][2] = ${acc}[mt][${n}][3] = 0.0f;",
              {{"acc", acc}, {"n", tile}});
}

// Accumulator tiles `acc`, `tiles` of them a row tile, set to zero.
constexpr const char* ZERO_TILES = R"(#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int n = 0; n < ${tiles}; n++) ${zero}
)";
std::string zero_tiles(const char* acc, const char* tiles) {
  return fill(ZERO_TILES, {{"tiles", tiles}, {"zero", zero_tile(acc)}});
}

// Note [staged key blocks]: the blocks every kernel walks (k and v for the forward and dQ; q, dO
// and the rows' L and D for dK/dV) are copied into shared memory by cp.async, two stages deep:
// while a block is multiplied, the next one is on its way (the copies of a block synchronously,
// then the products, left the tensor cores idle while each block arrived). Two stages of head dim
// 128 (68 KB) exceed the 48 KB of static shared memory a block may declare; those kernels keep
// one stage (TG_STAGES). The walk's pointers (ks and vs, or qs, dos, lses and deltas) name the
// current stage; 16-byte copies where both tensors are 16-byte aligned and so is every row's
// start in them (Q_A16 and the others: Note [strided operands] in tensor_attention.cpp), 4-byte
// ones otherwise. dO arrives in the input type (the gradient rule
// rounds it: Note [fused attention in the graph] in tensor_attention.cpp).
constexpr const char* STAGE_BLOCK = R"(    for (int i = threadIdx.x; i < 64 * (${width} / ${per}); i += 128) {
      const int j = i / (${width} / ${per}), c = i % (${width} / ${per}) * ${per};
      const bool in = ${block} + j < ${count};
      tg_cp${bytes}(${into} + j * ${pitch} + c, in ? ${src} + ${row}(head, ${block} + j) + c : ${src}, in);
    }
)";

// Block `block` of `side`'s rows (width elements each) into `into`, `pitch` elements a row.
std::string stage_block(const Side& side, const char* block, const std::string& into, const char* pitch,
                        const char* width) {
  auto copies = [&](const char* per, const char* bytes) {
    return fill(STAGE_BLOCK, {{"per", per},
                              {"bytes", bytes},
                              {"block", block},
                              {"count", side.count},
                              {"src", side.src},
                              {"row", side.row},
                              {"into", into},
                              {"pitch", pitch},
                              {"width", width}});
  };
  return "    if (aligned) {\n" + copies("8", "16") + "    } else {\n" + copies("2", "4") + "    }\n";
}

// The L and D of the 64 query rows from `block` into stage `stage` (zeros past the last row).
constexpr const char* STAGE_LSE_DELTA = R"(    if (threadIdx.x < 64) {
      const int j = ${block} + threadIdx.x;
      const bool in = j < LQ;
      tg_cp4f(lse_stages + ${stage} * 64 + threadIdx.x, in ? ${lse} : row_lse, in);
      tg_cp4f(delta_stages + ${stage} * 64 + threadIdx.x, in ? ${delta} : dsum, in);
    }
)";

// What one block of a walk stages, committed as one copy group: a function of the block's first
// row and its stage (both expressions).
using Staging = std::string (*)(const char* block, const char* stage);

std::string stage_keys(const char* block, const char* stage) {
  std::string ks = std::string("ks_stages + ") + stage + " * 64 * KS", vs = std::string("vs_stages + ") + stage + " * 64 * VS";
  return stage_block(KEYS, block, ks, "KS", "E") + stage_block(VALUES, block, vs, "VS", "EV") + "    tg_cp_commit();\n";
}

std::string stage_queries(const char* block, const char* stage) {
  std::string qs = std::string("qs_stages + ") + stage + " * 64 * QS", ds = std::string("dos_stages + ") + stage + " * 64 * DS";
  return stage_block(QUERIES, block, qs, "QS", "E") + stage_block(OUTPUT_GRADS, block, ds, "DS", "EV") +
         fill(STAGE_LSE_DELTA, {{"block", block},
                                {"stage", stage},
                                {"lse", lse_address("STAT(head, j)")},
                                {"delta", delta_address("STAT(head, j)")}}) +
         "    tg_cp_commit();\n";
}

// The walk over blocks of 64 rows from ${from} to ${to}, staged (the body follows and closes it).
constexpr const char* STAGED_WALK = R"(${bound}  const bool aligned = ${first_aligned} && ${second_aligned} &&
                       (((unsigned long long)${first_src} | (unsigned long long)${second_src}) & 15) == 0;
#if TG_STAGES == 2
  if (${from} < ${to}) {
${stage_first}  }
#endif
  for (int ${block} = ${from}, stage = 0; ${block} < ${to}; ${block} += 64, stage ^= TG_STAGES - 1) {
    __syncthreads();
#if TG_STAGES == 2
    if (${block} + 64 < ${to}) {
${stage_next}    } else {
      tg_cp_commit();
    }
    tg_cp_wait_all_but_last();
#else
${stage_this}    tg_cp_wait_all();
#endif
    __syncthreads();
${pointers})";

// Note [the two walks] (attention_kernel.cpp), on tensor cores: the forward and dQ walk blocks of
// 64 keys, dK/dV blocks of 64 query rows, staged (Note [staged key blocks]); `col` is an
// element's column in the block, visible (with ${h} a half) whether the mask lets the pair through.
struct Walk {
  const char *bound, *block, *from, *to;  // a line before the walk, the block's first row, its range
  Side first, second;                     // the tensors whose alignment picks the copies' width
  Staging staging;
  const char* pointers;  // the current stage's pointers, declared
  const char *col, *visible;
  const char* whole;  // Note [whole blocks]: declares `whole`, true where every pair of the block is visible
};
constexpr Walk KEY_WALK{"  const int kend = CAUSAL ? min(SK, first + 64 * MT) : SK;\n",
                        "k0",
                        "0",
                        "kend",
                        KEYS,
                        VALUES,
                        stage_keys,
                        "    const unsigned short* ks = ks_stages + stage * 64 * KS;\n"
                        "    const unsigned short* vs = vs_stages + stage * 64 * VS;\n",
                        "        const int col = k0 + n * 8 + 2 * t + e;\n",
                        "col < SK && (!CAUSAL || col <= r[mt][${h}])",
                        "    const bool whole = k0 + 64 <= SK && (!CAUSAL || k0 + 63 <= first);\n"};
constexpr Walk QUERY_WALK{
    "  const int qfrom = CAUSAL ? first : 0;\n",
    "q0",
    "qfrom",
    "LQ",
    QUERIES,
    OUTPUT_GRADS,
    stage_queries,
    "    const unsigned short* qs = qs_stages + stage * 64 * QS;\n"
    "    const unsigned short* dos = dos_stages + stage * 64 * DS;\n"
    "    const float* lses = lse_stages + stage * 64;\n"
    "    const float* deltas = delta_stages + stage * 64;\n",
    "        const int col = n * 8 + 2 * t + e, qi = q0 + col;\n",
    "qi < LQ && (!CAUSAL || r[mt][${h}] <= qi)",
    "    const bool whole = q0 + 64 <= LQ && (!CAUSAL || first + 64 * MT - 1 <= q0);\n"};

std::string staged_walk(const Walk& w) {
  std::string next = std::string(w.block) + " + 64";
  return fill(STAGED_WALK, {{"bound", w.bound},
                            {"first_src", w.first.src},
                            {"second_src", w.second.src},
                            {"first_aligned", w.first.aligned},
                            {"second_aligned", w.second.aligned},
                            {"from", w.from},
                            {"to", w.to},
                            {"block", w.block},
                            {"stage_first", w.staging(w.from, "0")},
                            {"stage_next", w.staging(next.c_str(), "(stage ^ 1)")},
                            {"stage_this", w.staging(w.block, "0")},
                            {"pointers", w.pointers}});
}

// A product of the warp's A fragments `a` with a staged block's rows (in `smem`), into the 8
// tiles of `acc`: S = q k^T and dP = dO v^T (or their transposes in dK/dV).
//
// Note [fragments by ldmatrix]: B fragments come from shared memory by ldmatrix, which loads four
// 8x8 tiles of 16-bit elements for the whole warp in one instruction (each lane addresses one
// 8-element row), laid out as the mma's fragments: here the block's rows are the product's n,
// so one ldmatrix gives the fragments of two neighbouring output tiles (lanes 0-15 address tile
// n's 8 rows at columns kk * 16 and kk * 16 + 8; lanes 16-31 tile n + 1's). Loading each
// fragment register by itself took 2 (here) to 4 (transposed, 16-bit) loads per mma.
struct BlockProduct { const char *acc, *a, *smem, *pitch, *width; };

constexpr const char* BLOCK_PRODUCT = R"(#pragma unroll
      for (int kk = 0; kk < ${width} / 16; kk++) {
        unsigned b[4];
        tg_ldsm4(b, ${smem} + ((n + (lane >> 4)) * 8 + (lane & 7)) * ${pitch} + kk * 16 + (lane & 8));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          tg_mma(${acc}[mt][n], ${a}[mt][kk], b[0], b[1]);
          tg_mma(${acc}[mt][n + 1], ${a}[mt][kk], b[2], b[3]);
        }
      }
)";

constexpr const char* BLOCK_PRODUCTS = R"(    float ${tiles};
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
${zero}      }
${products}    }
)";

std::string block_products(const std::vector<BlockProduct>& ps) {
  std::string tiles, zero, products;
  for (const auto& p : ps) {
    TemplateValues v{{"acc", p.acc}, {"a", p.a}, {"smem", p.smem}, {"pitch", p.pitch}, {"width", p.width}};
    tiles += (tiles.empty() ? "" : ", ") + std::string(p.acc) + "[MT][8][4]";
    zero += "        " + zero_tile(p.acc) + "\n        " + zero_tile(p.acc, "n + 1") + "\n";
    products += fill(BLOCK_PRODUCT, v);
  }
  return fill(BLOCK_PRODUCTS, {{"tiles", tiles}, {"zero", zero}, {"products", products}});
}

// A product of accumulator tiles `from`, packed into A fragments `a` in registers, with a staged
// block's columns (in `smem`), added into `acc`: O += P v, dQ += dS k, dV += P^T dO and dK += dS^T
// q. Here the block's rows are the product's k, so its B fragments are its 8x8 tiles transposed
// (Note [fragments by ldmatrix]); one ldmatrix.trans gives those of two neighbouring output tiles
// (lanes 0-15 address rows kk * 16 to kk * 16 + 15 at tile n's columns, lanes 16-31 at n + 1's).
struct RegisterProduct { const char *a, *from, *smem, *pitch, *width, *acc; };

constexpr const char* PACK = R"(      unsigned ${a}[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        ${a}[mt][0] = tg_pack(${s}[mt][2 * kk][0], ${s}[mt][2 * kk][1]);
        ${a}[mt][1] = tg_pack(${s}[mt][2 * kk][2], ${s}[mt][2 * kk][3]);
        ${a}[mt][2] = tg_pack(${s}[mt][2 * kk + 1][0], ${s}[mt][2 * kk + 1][1]);
        ${a}[mt][3] = tg_pack(${s}[mt][2 * kk + 1][2], ${s}[mt][2 * kk + 1][3]);
      }
)";
constexpr const char* REGISTER_PRODUCT = R"(#pragma unroll
      for (int n = 0; n < ${width} / 8; n += 2) {
        unsigned b[4];
        tg_ldsm4_t(b, ${smem} + (kk * 16 + (lane & 15)) * ${pitch} + (n + (lane >> 4)) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          tg_mma(${acc}[mt][n], ${a}[mt], b[0], b[1]);
          tg_mma(${acc}[mt][n + 1], ${a}[mt], b[2], b[3]);
        }
      }
)";

std::string register_products(const std::vector<RegisterProduct>& ps) {
  std::string packs, products;
  for (const auto& p : ps) {
    TemplateValues v{{"a", p.a}, {"s", p.from}, {"smem", p.smem}, {"pitch", p.pitch}, {"width", p.width}, {"acc", p.acc}};
    packs += fill(PACK, v);
    products += fill(REGISTER_PRODUCT, v);
  }
  return "#pragma unroll\n    for (int kk = 0; kk < 4; kk++) {\n" + packs + products + "    }\n";
}

// Each element of the 8 tiles a thread holds: tile n, column pair element e (both halves inside).
constexpr const char* EACH_ELEMENT = R"(#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
)";

// The backward kernels' weights P = exp2(S - L), zero where masked, and dS = P * (dP - D); `lse`
// and `delta` may name the half (${h}).
std::string weights(const std::string& visible, const std::string& s, const std::string& lse) {
  return halves("        const float p${h} = " + visible + " ? tg_exp2(" + s +
                "[mt][n][${e}] * SCALE_LOG2 - " + lse + ") : 0.0f;\n");
}
std::string ds_lines(const std::string& ds, const std::string& dp, const std::string& delta) {
  return halves("        " + ds + "[mt][n][${e}] = p${h} * (" + dp + "[mt][n][${e}] - " + delta + ");\n");
}

// Note [whole blocks]: only the blocks on a causal mask's diagonal and the last one past the end
// of the rows have pairs that the mask hides. A block wholly visible (`whole`, the same in every
// thread) runs the element loop without the column arithmetic and the compare and select of the
// mask, which cost about as many instructions per score as the rest of the softmax. `body`
// is the loop's text for visibility ${visible}: true, or the walk's mask. With tg_exp2 beside
// it, GPT-2's attention (16 x 12 heads x 1024 x 64, causal) on an H100: forward 0.204 -> 0.175
// ms, dQ 0.220 -> 0.199 ms, dK/dV 0.352 -> 0.286 ms a layer.
std::string element_loops(const Walk& w, const std::function<std::string(const std::string&)>& body) {
  return std::string(w.whole) + "    if (whole) {\n" + EACH_ELEMENT + w.col + body("true") + "      }\n    } else {\n" +
         EACH_ELEMENT + w.col + body(w.visible) + "      }\n    }\n";
}

// A kernel's stores of its results: `text`, a piece written for one half of a row tile's
// fragments, for both halves of each of the warp's MT tiles.
constexpr const char* EACH_TILE_OUT = R"(#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
${out}  }
)";
std::string tiles_out(const char* text) { return fill(EACH_TILE_OUT, {{"out", halves(text)}}); }

// Note [tensor-core attention]: the forward pass.
constexpr const char* FORWARD = R"(
${signature}  __shared__ __align__(16) unsigned short ks_stages[TG_STAGES * 64 * KS];
  __shared__ __align__(16) unsigned short vs_stages[TG_STAGES * 64 * VS];
${ids}  unsigned qa[MT][E / 16][4];
${q_fragments}  float o[MT][EV / 8][4];
${zero_o}  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = NEG_BIG, l[mt][0] = l[mt][1] = 0.0f;
${walk}${scores}    float mx[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) mx[mt][0] = m[mt][0], mx[mt][1] = m[mt][1];
${scaled_max}#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 1));
        mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 2));
      }
      const float a0 = tg_exp2(m[mt][0] - mx[mt][0]), a1 = tg_exp2(m[mt][1] - mx[mt][1]);
      l[mt][0] *= a0;
      l[mt][1] *= a1;
#pragma unroll
      for (int n = 0; n < EV / 8; n++) o[mt][n][0] *= a0, o[mt][n][1] *= a0, o[mt][n][2] *= a1, o[mt][n][3] *= a1;
#pragma unroll
      for (int n = 0; n < 8; n++) {
        s[mt][n][0] = tg_exp2(s[mt][n][0] - mx[mt][0]), s[mt][n][1] = tg_exp2(s[mt][n][1] - mx[mt][0]);
        s[mt][n][2] = tg_exp2(s[mt][n][2] - mx[mt][1]), s[mt][n][3] = tg_exp2(s[mt][n][3] - mx[mt][1]);
        l[mt][0] += s[mt][n][0] + s[mt][n][1];
        l[mt][1] += s[mt][n][2] + s[mt][n][3];
      }
      m[mt][0] = mx[mt][0];
      m[mt][1] = mx[mt][1];
    }
${pv}  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
    }
${out}}
)";

// Note [the forward's output] (attention_kernel.cpp): O in the input type, then L in two halves.
constexpr const char* FORWARD_OUT = R"(    if (r[mt][${h}] < LQ) {
      unsigned short* row = out + O_ROW(head, r[mt][${h}]);
      const float inv = 1.0f / l[mt][${h}];
#pragma unroll
      for (int n = 0; n < EV / 8; n++)
        *(unsigned*)(row + n * 8 + 2 * t) = tg_pack(o[mt][n][${c0}] * inv, o[mt][n][${c1}] * inv);
      if (t == 0)
        *(unsigned*)(out + LSE_AT(head, r[mt][${h}])) = tg_split((m[mt][${h}] + log2f(l[mt][${h}])) * LN2);
    }
)";

std::string forward() {
  return fill(
      FORWARD,
      {{"signature", fill(SIGNATURE, {{"out_type", "unsigned short"}, {"out", "out"}, {"backward", ""}})},
       {"ids", IDS},
       {"q_fragments", row_fragments("qa", QUERIES, "E")},
       {"zero_o", zero_tiles("o", "EV / 8")},
       {"walk", staged_walk(KEY_WALK)},
       {"scores", block_products({{"s", "qa", "ks", "KS", "E"}})},
       {"scaled_max", element_loops(KEY_WALK,
                                    [](const std::string& visible) {
                                      return halves("        s[mt][n][${e}] = " + visible +
                                                    " ? s[mt][n][${e}] * SCALE_LOG2 : NEG_BIG;\n") +
                                             "        mx[mt][0] = fmaxf(mx[mt][0], s[mt][n][e]);\n"
                                             "        mx[mt][1] = fmaxf(mx[mt][1], s[mt][n][2 + e]);\n";
                                    })},
       {"pv", register_products({{"pa", "s", "vs", "VS", "EV", "o"}})},
       {"out", tiles_out(FORWARD_OUT)}});
}

// Note [tensor-core attention]: dQ. As the forward pass, with dO's fragments (rounded from
// float32) beside q's: S = q k^T and dP = dO v^T per key block, dS = P * (dP - D) with P =
// exp(S - L), and dQ += dS k with dS as the A fragments.
constexpr const char* BACKWARD_Q = R"(
${signature}  __shared__ __align__(16) unsigned short ks_stages[TG_STAGES * 64 * KS];
  __shared__ __align__(16) unsigned short vs_stages[TG_STAGES * 64 * VS];
${ids}  unsigned qa[MT][E / 16][4], da[MT][EV / 16][4];
${q_fragments}${d_fragments}  float lse[MT][2], dd[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      lse[mt][h] = r[mt][h] < LQ ? ${lse} : 0.0f;
      dd[mt][h] = r[mt][h] < LQ ? ${delta} : 0.0f;
    }
  float acc[MT][E / 8][4];
${zero_acc}${walk}${products}${weights_ds}${ds_k}  }
${out}}
)";

constexpr const char* BACKWARD_Q_OUT = R"(    if (r[mt][${h}] < LQ)
#pragma unroll
      for (int n = 0; n < E / 8; n++)
        *(unsigned*)(dq + (qb + r[mt][${h}]) * E + n * 8 + 2 * t) =
            tg_pack(acc[mt][n][${c0}] * SCALE, acc[mt][n][${c1}] * SCALE);
)";

std::string backward_q() {
  return fill(BACKWARD_Q,
              {{"signature", backward_signature("dq")},
               {"ids", IDS},
               {"q_fragments", row_fragments("qa", QUERIES, "E")},
               {"d_fragments", row_fragments("da", OUTPUT_GRADS, "EV")},
               {"lse", lse_read("STAT(head, r[mt][h])")},
               {"delta", delta_read("STAT(head, r[mt][h])")},
               {"zero_acc", zero_tiles("acc", "E / 8")},
               {"walk", staged_walk(KEY_WALK)},
               {"products", block_products({{"s", "qa", "ks", "KS", "E"}, {"dp", "da", "vs", "VS", "EV"}})},
               {"weights_ds", element_loops(KEY_WALK,
                                            [](const std::string& visible) {
                                              return weights(visible, "s", "lse[mt][${h}]") +
                                                     ds_lines("s", "dp", "dd[mt][${h}]");
                                            })},
               {"ds_k", register_products({{"sa", "s", "ks", "KS", "E", "acc"}})},
               {"out", tiles_out(BACKWARD_Q_OUT)}});
}

// Note [tensor-core attention]: dK and dV. 16 key rows a warp, their k and v fragments in
// registers; per block of 64 query rows (q, dO rounded from float32, L and D in shared memory)
// S^T = k q^T and dP^T = v dO^T, P^T = exp(S^T - L), dS^T = P^T * (dP^T - D); then dV += P^T dO
// and dK += dS^T q with P^T and dS^T as the A fragments.
constexpr const char* BACKWARD_KV = R"(
#define QS (E + 8)
#define DS (EV + 8)
${signature}  __shared__ __align__(16) unsigned short qs_stages[TG_STAGES * 64 * QS];
  __shared__ __align__(16) unsigned short dos_stages[TG_STAGES * 64 * DS];
  __shared__ float lse_stages[TG_STAGES * 64];
  __shared__ float delta_stages[TG_STAGES * 64];
${ids}  unsigned ka[MT][E / 16][4], va[MT][EV / 16][4];
${k_fragments}${v_fragments}  float dk[MT][E / 8][4], dv[MT][EV / 8][4];
${zero_dk}${zero_dv}${walk}${products}${weights_ds}${dv_dk}  }
${out}}
)";

constexpr const char* BACKWARD_KV_OUT = R"(    if (r[mt][${h}] < SK) {
      unsigned short* row = dkv + (kb + r[mt][${h}]) * (E + EV);
#pragma unroll
      for (int n = 0; n < E / 8; n++)
        *(unsigned*)(row + n * 8 + 2 * t) = tg_pack(dk[mt][n][${c0}] * SCALE, dk[mt][n][${c1}] * SCALE);
#pragma unroll
      for (int n = 0; n < EV / 8; n++) *(unsigned*)(row + E + n * 8 + 2 * t) = tg_pack(dv[mt][n][${c0}], dv[mt][n][${c1}]);
    }
)";

std::string backward_kv() {
  return fill(
      BACKWARD_KV,
      {{"signature", backward_signature("dkv")},
       {"ids", IDS},
       {"k_fragments", row_fragments("ka", KEYS, "E")},
       {"v_fragments", row_fragments("va", VALUES, "EV")},
       {"zero_dk", zero_tiles("dk", "E / 8")},
       {"zero_dv", zero_tiles("dv", "EV / 8")},
       {"walk", staged_walk(QUERY_WALK)},
       {"products", block_products({{"st", "ka", "qs", "QS", "E"}, {"dpt", "va", "dos", "DS", "EV"}})},
       {"weights_ds", element_loops(QUERY_WALK,
                                    [](const std::string& visible) {
                                      return weights(visible, "st", "lses[col] * LOG2E") +
                                             "        st[mt][n][e] = p0;\n        st[mt][n][2 + e] = p1;\n" +
                                             ds_lines("dpt", "dpt", "deltas[col]");
                                    })},
       {"dv_dk",
        register_products({{"pa", "st", "dos", "DS", "EV", "dv"}, {"sa", "dpt", "qs", "QS", "E", "dk"}})},
       {"out", tiles_out(BACKWARD_KV_OUT)}});
}

std::string template_of(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward:
      return forward();
    case TemplateKernel::AttentionBackwardQ:
      return backward_q();
    case TemplateKernel::AttentionBackwardKV:
      return backward_kv();
  }
  return "";
}

}  // namespace

int64_t tensor_core_m_tiles(TemplateKernel k) {
  if (k != TemplateKernel::AttentionForward) return 1;  // Note [m-tiles a warp]: two would spill
  const int tiles = knobs::ATTENTION_FORWARD_TILES;
  TG_CHECK(tiles == 1 || tiles == 2, "ATTENTION_FORWARD_TILES must be 1 or 2, got ", tiles);
  return tiles;
}

std::string tensor_core_attention_source(TemplateKernel k) {
  return "#define MT " + std::to_string(tensor_core_m_tiles(k)) + "\n" + TENSOR_CORE_HELPERS + template_of(k);
}

}  // namespace tg
