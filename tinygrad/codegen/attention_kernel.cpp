// Fused attention kernels from a template, for CUDA and OpenCL; the tensor-core forms are in
// attention_tensor_cores.cpp (Note [tensor-core attention]), the double-precision reference in
// attention_reference.cpp.
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
// output see no difference. Its gradient is a rule of the template: a CUSTOM_GRAD around the
// node (CustomGrad::ATTENTION in gradient.h) emits the backward kernels.
//
// Note [fused attention]: FlashAttention-2's algorithm, one work-item per row. Forward: a
// work-group of BQ work-items takes BQ query rows of one (batch, head); it walks the keys in
// blocks of BK, which the group loads into local memory together; each work-item scores its row
// against the block (scores scaled by scale * log2(e), so exp is exp2), takes the block's max,
// rescales its running sum and output accumulator by exp2(old max - new max) and adds the
// block's weights and weighted values. It writes O = acc / sum and the row's logsumexp L = (max
// + log2(sum)) * ln(2) (Note [the forward's output]). Backward (with D = rowsum(dO * O) and L in
// float32, computed by ordinary kernels): the dQ kernel walks key blocks as the forward
// does and recomputes each weight P = exp(s - L); dS = P * (dO . v - D); dQ = scale * sum dS k.
// The dK/dV kernel takes BKV key rows per group and walks blocks of query rows (q, dO, L, D in
// local memory): dV = sum P dO, dK = scale * sum dS q. A causal mask (key j visible from query i
// when j <= i) ends the walks early: the forward and dQ stop at the group's last row, dK/dV start
// at the group's first key. Blocks that run past L or S are loaded as zeros and masked. Nothing
// of size L x S is ever written. Inputs are read in their dtype and computed in float32; each
// work-item keeps its rows in registers, so head dims are limited to MAX_HEAD_DIM.
//
// Note [the forward's output]: one buffer in the input type holds O in [batch, L, heads, Ev]
// order, which is the layout of the attention's result where a model merges its heads back
// ([B, T, H * hd]), so the next product reads it in place; then each row's logsumexp L. The
// lazy graph gives a node one output, so both share the buffer. A half type cannot hold L to the
// precision the backward pass needs (the weights are exp(s - L): an error of 0.03 in a bfloat16
// L of 8 is a 3% error in every weight of the row), so L takes two elements there: L rounded to
// the type and the rest, L - rounded(L), whose sum holds L to about 2^-16 of its size. The
// gradient rule adds the two into a float32 [batch, L, heads] buffer, beside D in the same
// order, which the backward kernels read (STAT(y, r)). Before this layout the forward wrote
// [bh, L, Ev + 1] in float32 and a copy kernel made c_proj's bfloat16 input of it: GPT-2 124M
// on an H100 spent 0.38 ms of its step on those copies, and each layer kept both 51 MB and 25 MB
// buffers for its backward pass where the one buffer is now 25.5 MB.
#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/codegen/attention_tensor_cores.h"

#include <bit>
#include <cmath>
#include <cstdio>

#include "tinygrad/codegen/attention_pieces.h"
#include "tinygrad/codegen/render_cuda.h"
#include "tinygrad/codegen/render_opencl.h"
#include "tinygrad/error.h"

namespace tg {

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;
constexpr int64_t ROWS_PER_GROUP = 64;  // BQ (forward, dQ) and BKV (dK/dV): work-items per group
constexpr int64_t BLOCK = 32;           // BK (forward, dQ) and the query block of dK/dV
constexpr int64_t MAX_GROUPS_Y = 65535;  // CUDA's gridDim.y limit: bh runs along y

std::string dialect_macros(KernelDialect d) {
  if (d == KernelDialect::CUDA)
    return "#define TG_KERNEL(n) extern \"C\" __global__ void __launch_bounds__(TG_THREADS) n\n"
           "#define TG_GLOBAL\n#define TG_LOCAL __shared__\n#define TG_BARRIER() __syncthreads()\n"
           "#define TG_GROUP_X ((int)blockIdx.x)\n#define TG_GROUP_Y ((int)blockIdx.y)\n"
           "#define TG_LID ((int)threadIdx.x)\n#define TG_EXP2(x) exp2f(x)\n#define TG_LOG2(x) log2f(x)\n"
           "#define TG_I64 long long\n"
           "static __device__ __forceinline__ float tg_bf16(unsigned short b) { return "
           "__uint_as_float((unsigned)b << 16); }\n"
           "static __device__ __forceinline__ float tg_half(unsigned short h) { float f; "
           "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
           "static __device__ __forceinline__ unsigned short tg_to_bf16(float f) { unsigned short b; "
           "asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(b) : \"f\"(f)); return b; }\n"
           "static __device__ __forceinline__ unsigned short tg_to_half(float f) { unsigned short h; "
           "asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
  return "#define TG_KERNEL(n) __kernel __attribute__((reqd_work_group_size(TG_THREADS, 1, 1))) void n\n"
         "#define TG_GLOBAL __global\n#define TG_LOCAL __local\n#define TG_BARRIER() "
         "barrier(CLK_LOCAL_MEM_FENCE)\n"
         "#define TG_GROUP_X ((int)get_group_id(0))\n#define TG_GROUP_Y ((int)get_group_id(1))\n"
         "#define TG_LID ((int)get_local_id(0))\n#define TG_EXP2(x) exp2(x)\n#define TG_LOG2(x) log2(x)\n"
         "#define TG_I64 long\n"
         "inline float tg_bf16(ushort b) { return as_float((uint)b << 16); }\n"
         "inline ushort tg_to_bf16(float f) { uint x = as_uint(f); "
         "return isnan(f) ? (ushort)0x7fc0 : (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); }\n";
}

// The element type of q, k, v and the forward's output in the kernel's parameters: how one is
// read as float (TG_LOAD), how a float is stored as one (TG_STORE), and a float rounded to it.
std::string input_macros(DType t, KernelDialect d) {
  const std::string ushort = d == KernelDialect::CUDA ? "unsigned short" : "ushort";
  auto half = [&](const std::string& from, const std::string& to) {
    return "#define TG_IN " + ushort + "\n#define TG_LOAD(p, i) " + from +
           "((p)[i])\n#define TG_STORE(p, i, x) ((p)[i] = " + to + "(x))\n#define TG_ROUNDED(x) " + from +
           "(" + to + "(x))\n";
  };
  switch (t) {
    case DType::BFloat16:
      return half("tg_bf16", "tg_to_bf16");
    case DType::Float16:
      return half("tg_half", "tg_to_half");
    default:
      return "#define TG_IN float\n#define TG_LOAD(p, i) ((p)[i])\n#define TG_STORE(p, i, x) ((p)[i] = (x))\n"
             "#define TG_ROUNDED(x) (x)\n";
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

// Note [strided operands] (tensor_attention.cpp): Q_ROW(y, r), K_ROW, V_ROW and DO_ROW give the
// element where row r of problem y starts in the operand's buffer; Q_A16 (and the others) is 1
// where every such start is a multiple of 16 bytes, so that rows are copied 16 bytes at a time.
std::string layout_macros(const AttentionSpec& s, KernelDialect d) {
  const std::string i64 = d == KernelDialect::CUDA ? "(long long)" : "(long)";
  const std::pair<AttentionOperand, std::string> names[] = {{AttentionOperand::Q, "Q"},
                                                            {AttentionOperand::K, "K"},
                                                            {AttentionOperand::V, "V"},
                                                            {AttentionOperand::OutputGrad, "DO"}};
  std::string out;
  for (const auto& [x, name] : names) {
    OperandLayout l = s.layout(x);
    int64_t bytes = itemsize(x == AttentionOperand::OutputGrad ? s.output_grad_dtype() : s.dtype);
    bool a16 = true;
    for (int64_t v : {l.offset, l.batch, l.head, l.row}) a16 &= v * bytes % 16 == 0;
    auto term = [&](const std::string& index, int64_t stride) {
      return " + " + i64 + index + " * " + std::to_string(stride);
    };
    out += "#define " + name + "_ROW(y, r) (" + i64 + std::to_string(l.offset) +
           term("((y) / HEADS)", l.batch) + term("((y) % HEADS)", l.head) + term("(r)", l.row) + ")\n" +
           define((name + "_A16").c_str(), a16 ? 1 : 0);
  }
  // Note [the forward's output]: AttentionSpec::stat_index, output_row_start and lse_start
  return out + "#define STAT(y, r) ((" + i64 + "((y) / HEADS) * LQ + (r)) * HEADS + (y) % HEADS)\n" +
         "#define O_ROW(y, r) (STAT(y, r) * EV)\n#define LSE_AT(y, r) (" + i64 +
         std::to_string(s.bh * s.l * s.ev) + " + STAT(y, r) * LSE_SLOTS)\n" +
         define("LSE_SLOTS", s.lse_slots());
}

std::string size_macros(const AttentionSpec& s, KernelDialect d) {
  return define("TG_THREADS", ROWS_PER_GROUP) + define("BLOCK", BLOCK) + define("LQ", s.l) +
         define("SK", s.s) + define("E", s.e) + define("EV", s.ev) + define("CAUSAL", s.causal ? 1 : 0) +
         define("SCALE", float_literal(s.scale)) +
         define("SCALE_LOG2", float_literal(s.scale / std::log(2.0))) +
         define("LOG2E", float_literal(1.0 / std::log(2.0))) + define("LN2", float_literal(std::log(2.0))) +
         define("NEG_BIG", "(-3.0e38f)") + define("HEADS", s.heads) + layout_macros(s, d);
}

// Note [the two walks]: a work-group owns rows of one side and walks blocks of the other (Note
// [fused attention]). The forward and dQ kernels own query rows and walk keys; dK/dV owns key
// rows and walks query rows. A Walk names each side in the template text, so that the pieces
// below are written once for both (Note [template pieces] in attention_pieces.h); the
// causal bound and the rows a work-item takes of a block are where the walks differ.
struct Walk {
  const char* own;        // the work-item's row: a query ("row") or a key ("key")
  const char* own_count;  // rows on the owned side
  const char* count;      // rows on the walked side
  const char* block;      // the first row of the current block
  const char* at;         // a row of the block while it loads
  const char* bound;      // the causal bound on the walk, and the walk's first and end rows
  const char* from;
  const char* to;
  const char* rows;       // n, the rows of the block this work-item takes
};

constexpr Walk KEY_WALK{
    "row", "LQ",   "SK",
    "k0",  "j",    "const int kend = CAUSAL ? min(SK, first + TG_THREADS) : SK;",
    "0",   "kend", "    int n = min(BLOCK, SK - k0);\n    if (CAUSAL) n = min(n, row - k0 + 1);\n"};
constexpr Walk QUERY_WALK{"key",    "SK", "LQ",
                          "q0",     "r",  "const int qstart = CAUSAL ? first / BLOCK * BLOCK : 0;",
                          "qstart", "LQ", "    const int n = min(BLOCK, LQ - q0);\n"};

// The work-item's ids and rows: ${own}c is its row clamped into range.
constexpr const char* OWN_ROW =
    R"(  const int tid = TG_LID, head = TG_GROUP_Y, first = TG_GROUP_X * TG_THREADS, ${own} = first + tid;
  const int ${own}c = ${own} < ${own_count} ? ${own} : ${own_count} - 1;
)";

// The walk over blocks: the group loads a block into local memory, then each work-item takes n
// of its rows (the body follows, and closes the loop).
constexpr const char* WALK = R"(  ${bound}
  for (int ${block} = ${from}; ${block} < ${to}; ${block} += BLOCK) {
    TG_BARRIER();
${loads}    TG_BARRIER();
${rows})";

// One block of `width`-wide rows into local memory, zeros past the end; `read` reads element ${i}.
constexpr const char* LOAD_BLOCK = R"(    for (int i = tid; i < BLOCK * ${width}; i += TG_THREADS) {
      const int ${at} = ${block} + i / ${width};
      ${into}[i] = ${at} < ${count} ? ${read} : 0.0f;
    }
)";

std::string own_row(const Walk& w) { return fill(OWN_ROW, {{"own", w.own}, {"own_count", w.own_count}}); }

std::string walk(const Walk& w, const std::string& loads) {
  return fill(WALK, {{"bound", w.bound}, {"block", w.block}, {"from", w.from}, {"to", w.to}, {"loads", loads},
                     {"rows", w.rows}});
}

// `row` names the operand's row macro (Note [strided operands]).
std::string load_block(const Walk& w, const char* into, const char* width, const char* row,
                       const char* read) {
  std::string element =
      fill("${row}(head, ${at}) + i % ${width}", {{"row", row}, {"at", w.at}, {"width", width}});
  return fill(LOAD_BLOCK, {{"width", width}, {"at", w.at}, {"block", w.block}, {"into", into}, {"count", w.count},
                           {"read", fill(read, {{"i", element}})}});
}

// The forward's and dQ's walk: blocks of k and v.
std::string key_walk() {
  return walk(KEY_WALK, load_block(KEY_WALK, "ks", "E", "K_ROW", "TG_LOAD(k, ${i})") +
                            load_block(KEY_WALK, "vs", "EV", "V_ROW", "TG_LOAD(v, ${i})"));
}

// Note [fused attention]: the backward kernels recompute a pair's score x (q . k, scaled), dP =
// dO . v and dS = P * (dP - D) with the weight P = exp2(x - L); dK/dV keeps P for dV.
constexpr const char* RECOMPUTE = R"(      float x = 0.0f, dp = 0.0f;
      for (int d = 0; d < E; d++) x += ${q} * ${k};
      for (int d = 0; d < EV; d++) dp += ${dout} * ${v};
)";

std::string recompute(const char* q, const char* k, const char* dout, const char* v, const char* lse, const char* delta,
                      bool keep_p) {
  const char* ds = keep_p ? "      const float p = TG_EXP2(x - ${lse}), ds = p * (dp - ${delta});\n"
                          : "      const float ds = TG_EXP2(x - ${lse}) * (dp - ${delta});\n";
  return fill(RECOMPUTE, {{"q", q}, {"k", k}, {"dout", dout}, {"v", v}}) + fill(ds, {{"lse", lse}, {"delta", delta}});
}

// Note [fused attention]: the forward pass.
constexpr const char* FORWARD = R"(
TG_KERNEL(TG_NAME)(TG_GLOBAL TG_IN* out, TG_GLOBAL const TG_IN* q, TG_GLOBAL const TG_IN* k, TG_GLOBAL const TG_IN* v) {
  TG_LOCAL float ks[BLOCK * E];
  TG_LOCAL float vs[BLOCK * EV];
${own_row}  float qr[E], acc[EV];
  for (int d = 0; d < E; d++) qr[d] = TG_LOAD(q, Q_ROW(head, rowc) + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) acc[d] = 0.0f;
  float m = NEG_BIG, sum = 0.0f;
${walk}    float s[BLOCK];
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
  if (row < LQ) {  // Note [the forward's output]
    const TG_I64 o = O_ROW(head, row), at = LSE_AT(head, row);
    for (int d = 0; d < EV; d++) TG_STORE(out, o + d, acc[d] / sum);
    const float lse = (m + TG_LOG2(sum)) * LN2;
    TG_STORE(out, at, lse);
    if (LSE_SLOTS == 2) TG_STORE(out, at + 1, lse - TG_ROUNDED(lse));
  }
}
)";

// The backward kernels' parameters: q, k and v, the rows' L, dO and D (Note [the forward's output]).
constexpr const char* BACKWARD_SIGNATURE = R"(
TG_KERNEL(TG_NAME)(TG_GLOBAL float* ${out}, TG_GLOBAL const TG_IN* q, TG_GLOBAL const TG_IN* k, TG_GLOBAL const TG_IN* v,
                   TG_GLOBAL const float* row_lse, TG_GLOBAL const float* dout, TG_GLOBAL const float* dsum) {
)";

// Note [fused attention]: dQ, recomputing the weights from q, k and L.
constexpr const char* BACKWARD_Q = R"(${signature}  TG_LOCAL float ks[BLOCK * E];
  TG_LOCAL float vs[BLOCK * EV];
${own_row}  float qr[E], dor[EV], acc[E];
  for (int d = 0; d < E; d++) qr[d] = TG_LOAD(q, Q_ROW(head, rowc) + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) dor[d] = dout[DO_ROW(head, rowc) + d];
  for (int d = 0; d < E; d++) acc[d] = 0.0f;
  const float lse = ${lse}, delta = ${delta};
${walk}    for (int j = 0; j < n; j++) {
${recompute}      for (int d = 0; d < E; d++) acc[d] += ds * ks[j * E + d];
    }
  }
  if (row < LQ)
    for (int d = 0; d < E; d++) dq[((TG_I64)head * LQ + row) * E + d] = acc[d] * SCALE;
}
)";

// Note [fused attention]: dK and dV, one key row per work-item, walking blocks of query rows.
constexpr const char* BACKWARD_KV = R"(${signature}  TG_LOCAL float qs[BLOCK * E];
  TG_LOCAL float dos[BLOCK * EV];
  TG_LOCAL float lses[BLOCK];
  TG_LOCAL float deltas[BLOCK];
${own_row}  float kr[E], vr[EV], dk[E], dv[EV];
  for (int d = 0; d < E; d++) kr[d] = TG_LOAD(k, K_ROW(head, keyc) + d) * SCALE_LOG2;
  for (int d = 0; d < EV; d++) vr[d] = TG_LOAD(v, V_ROW(head, keyc) + d);
  for (int d = 0; d < E; d++) dk[d] = 0.0f;
  for (int d = 0; d < EV; d++) dv[d] = 0.0f;
${walk}    for (int i = CAUSAL ? max(0, key - q0) : 0; i < n; i++) {
${recompute}      for (int d = 0; d < EV; d++) dv[d] += p * dos[i * EV + d];
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

// dK/dV's block holds each query row's L and D beside its q and dO.
constexpr const char* LOAD_LSE_DELTA = R"(    for (int i = tid; i < BLOCK; i += TG_THREADS) {
      const int r = q0 + i;
      lses[i] = r < LQ ? ${lse} : 0.0f;
      deltas[i] = r < LQ ? ${delta} : 0.0f;
    }
)";

std::string template_of(TemplateKernel k) {
  switch (k) {
    case TemplateKernel::AttentionForward: return fill(FORWARD, {{"own_row", own_row(KEY_WALK)}, {"walk", key_walk()}});
    case TemplateKernel::AttentionBackwardQ:
      return fill(BACKWARD_Q, {{"signature", fill(BACKWARD_SIGNATURE, {{"out", "dq"}})},
                               {"own_row", own_row(KEY_WALK)},
                               {"lse", lse_read("STAT(head, rowc)")},
                               {"delta", delta_read("STAT(head, rowc)")},
                               {"walk", key_walk()},
                               {"recompute", recompute("qr[d]", "ks[j * E + d]", "dor[d]", "vs[j * EV + d]",
                                                       "lse", "delta", false)}});
    case TemplateKernel::AttentionBackwardKV: {
      std::string loads =
          load_block(QUERY_WALK, "qs", "E", "Q_ROW", "TG_LOAD(q, ${i})") +
          load_block(QUERY_WALK, "dos", "EV", "DO_ROW", "dout[${i}]") +
          fill(LOAD_LSE_DELTA, {{"lse", lse_read("STAT(head, r)")}, {"delta", delta_read("STAT(head, r)")}});
      return fill(BACKWARD_KV, {{"signature", fill(BACKWARD_SIGNATURE, {{"out", "dkv"}})},
                                {"own_row", own_row(QUERY_WALK)},
                                {"walk", walk(QUERY_WALK, loads)},
                                {"recompute", recompute("qs[i * E + d]", "kr[d]", "dos[i * EV + d]", "vr[d]", "lses[i]",
                                                        "deltas[i]", true)}});
    }
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

bool has_layouts(const AttentionSpec& s) {
  for (const auto& l : s.layouts)
    if (l) return true;
  return false;
}

// "attention_8_256_256_64c": bh, L, S, the head dim, c when causal, _tc on the tensor cores and
// _v where an operand is read through a layout (Note [strided operands]).
std::string kernel_name(const AttentionSpec& s) {
  return std::string(kernel_word(s.kernel)) + "_" + std::to_string(s.bh) + "_" + std::to_string(s.l) + "_" +
         std::to_string(s.s) + "_" + std::to_string(s.e) + (s.causal ? "c" : "") +
         (s.tensor_cores ? "_tc" : "") + (has_layouts(s) ? "_v" : "");
}

// Rows each group takes: query rows (forward, dQ) or key rows (dK/dV).
int64_t rows_of(const AttentionSpec& s) { return s.kernel == TemplateKernel::AttentionBackwardKV ? s.s : s.l; }

std::vector<KernelParam> params_of(const AttentionSpec& s) {
  std::vector<KernelParam> p{{s.output_dtype(), true}, {s.dtype, false}, {s.dtype, false}, {s.dtype, false}};
  if (s.kernel != TemplateKernel::AttentionForward) {  // fwd, dO (Note [fused attention in the graph]), D
    p.push_back({DType::Float32, false});
    p.push_back({s.output_grad_dtype(), false});
    p.push_back({DType::Float32, false});
  }
  return p;
}

}  // namespace

// The arg: the ten scalars, heads, then per operand a flag (1: it has a layout) and its layout.
std::vector<int64_t> AttentionSpec::encode() const {
  std::vector<int64_t> a{static_cast<int64_t>(kernel),
                         bh,
                         l,
                         s,
                         e,
                         ev,
                         static_cast<int64_t>(dtype),
                         causal ? 1 : 0,
                         std::bit_cast<int64_t>(scale),
                         tensor_cores ? 1 : 0,
                         heads};
  for (const auto& x : layouts) {
    OperandLayout l = x.value_or(OperandLayout{});
    a.insert(a.end(), {x ? 1 : 0, l.offset, l.batch, l.head, l.row});
  }
  return a;
}

AttentionSpec AttentionSpec::decode(const std::vector<int64_t>& a) {
  constexpr size_t SIZE = 11 + 5 * ATTENTION_OPERANDS;
  TG_ASSERT(a.size() == SIZE, "attention kernel arg has ", a.size(), " entries");
  AttentionSpec spec{static_cast<TemplateKernel>(a[0]),
                     a[1],
                     a[2],
                     a[3],
                     a[4],
                     a[5],
                     static_cast<DType>(a[6]),
                     a[7] != 0,
                     std::bit_cast<double>(a[8]),
                     a[9] != 0,
                     a[10]};
  for (size_t i = 0, at = 11; i < ATTENTION_OPERANDS; i++, at += 5)
    if (a[at]) spec.layouts[i] = OperandLayout{a[at + 1], a[at + 2], a[at + 3], a[at + 4]};
  return spec;
}

OperandLayout AttentionSpec::layout(AttentionOperand x) const {
  if (const auto& given = layouts[static_cast<size_t>(x)]) return *given;
  int64_t row = width(x), head = rows(x) * row;
  return OperandLayout{0, heads * head, head, row};
}

int64_t AttentionSpec::row_start(AttentionOperand x, int64_t y, int64_t r) const {
  OperandLayout l = layout(x);
  return l.offset + y / heads * l.batch + y % heads * l.head + r * l.row;
}

Shape AttentionSpec::output_shape() const {
  switch (kernel) {
    case TemplateKernel::AttentionForward:
      return {bh * l * (ev + lse_slots())};
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
  bool even_rows = true;  // the tensor-core kernels read pairs of 16-bit elements as one 32-bit word
  for (size_t x = 0; x < ATTENTION_OPERANDS; x++) {
    OperandLayout l = s.layout(static_cast<AttentionOperand>(x));
    even_rows &= l.offset % 2 == 0 && l.batch % 2 == 0 && l.head % 2 == 0 && l.row % 2 == 0;
  }
  bool tensor_cores_ok = !s.tensor_cores || (d == KernelDialect::CUDA && is_half(s.dtype) && s.e % 16 == 0 &&
                                             s.ev % 16 == 0 && even_rows);
  return dtype_ok && tensor_cores_ok && s.e >= 1 && s.e <= MAX_HEAD_DIM && s.ev >= 1 &&
         s.ev <= MAX_HEAD_DIM && s.l >= 1 && s.s >= 1 && s.bh >= 1 && s.bh <= MAX_GROUPS_Y && s.heads >= 1 &&
         s.bh % s.heads == 0 && s.l < (int64_t{1} << 30) && s.s < (int64_t{1} << 30);
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
  if (s.tensor_cores) {  // Note [tensor-core attention] in attention_tensor_cores.cpp
    int64_t rows = tensor_core_block_rows(s.kernel);
    k.global_size = {(rows_of(s) + rows - 1) / rows * TENSOR_CORE_THREADS, s.bh};
    k.local_size = {TENSOR_CORE_THREADS, 1};
    out.source = size_macros(s, d) + define("TG_NAME", k.name) +
                 define("TG_MMA_T", s.dtype == DType::BFloat16 ? "\"bf16\"" : "\"f16\"") +
                 define("TG_BF16", s.dtype == DType::BFloat16 ? 1 : 0) +
                 tensor_core_attention_source(s.kernel);
    return out;
  }
  int64_t groups = (rows_of(s) + ROWS_PER_GROUP - 1) / ROWS_PER_GROUP;
  k.global_size = {groups * ROWS_PER_GROUP, s.bh};
  k.local_size = {ROWS_PER_GROUP, 1};
  out.source = dialect_macros(d) + input_macros(s.dtype, d) + size_macros(s, d) + define("TG_NAME", k.name) +
               template_of(s.kernel);
  return out;
}

TemplateSource render_template_kernel(const UOp& kernel, const Renderer& renderer) {
  TG_ASSERT(kernel.op == Op::TEMPLATE_KERNEL, "render_template_kernel of ", op_name(kernel.op));
  std::optional<KernelDialect> d = kernel_dialect(renderer);
  TG_ASSERT(d, "a template kernel was scheduled for a device without a template dialect");
  return render_attention(AttentionSpec::decode(kernel.arg_ints()), *d);
}

}  // namespace tg
