// CUDA C++ rendering.
//
// Note [cuda half types]: a float16 value is held in a float that is always rounded to half
// precision (tg_round_half), and float16 buffers are unsigned short, converted with the PTX cvt
// instructions; bfloat16 is unsigned short with the integer conversions every C-style renderer
// uses. So kernels include neither cuda_fp16.h nor cuda_bf16.h and NVRTC needs no include path:
// the device works where only libnvrtc (no toolkit headers) is installed. Arithmetic on half
// types runs in float32 anyway (codegen/linearize.cpp).
//
// Note [bfloat16 rounding instruction]: from sm_80 on a float32 becomes a bfloat16 in one
// instruction (cvt.rn.bf16.f32, round to nearest even, as the integer sequence the other renderers
// use; a NaN comes out as the canonical quiet NaN 0x7fff instead of keeping its sign and
// payload). The integer sequence took about seven instructions; GPT-2's bias-and-GELU kernels,
// which round twice per element, are bound by instructions, not by memory (Note [gelu as a
// sigmoid] in tensor_elementwise.cpp), and its head assembly, which rounds attention's float32
// gradients, went from 0.114 to 0.078 ms on an H100.
//
// Note [integer max through PTX]: ptxas of CUDA 13.0 for sm_90 merges chains of int32 max over
// negated values (x.min() is -max(-x)) into three-input VIMNMX3 instructions and drops the
// negation of an operand, so integer min over a short axis came out wrong for some columns
// (seen on an H200, driver 580.159; an inline PTX max.s32 still got merged over 5 elements).
// Integer MAX is therefore an inline PTX max.s64 (int32 operands widened): 64-bit max becomes
// compares and selects, and no 32-bit min/max instruction is formed.
//
// Note [warp combine]: the partials of a grouped reduction (codegen/gpu_dims.cpp) meet through
// warp shuffles instead of a shared-memory tree with a barrier per round: each warp combines its
// 32 partials with __shfl_xor_sync (after the butterfly every lane holds the warp's result);
// with more than one warp, lane 0 of each writes it to shared memory, and after one barrier
// every warp combines the L/32 warp results the same way. Every thread ends with the full value,
// as the code after the reduce expects. A group smaller than a warp shuffles within its L lanes
// (several such groups may share a warp: the butterfly stays within aligned runs of L lanes).
//
// Note [unrolled short loops]: a reduce loop of a constant few trips (a convolution's filter rows
// and columns, 3 or 5) is unrolled whole (#pragma unroll, at most SHORT_LOOP trips). NVRTC left
// such loops rolled, so each trip loaded its register tile's operands again; unrolled, the loads
// of neighbouring taps that read the same element (column lane c of tap j is lane c+1 of tap
// j-1) are one load, and the index arithmetic folds into constant offsets. On an H200 the CNN's
// 5x5 32->32 forward pass went from 0.451 to 0.426 ms and its input gradient from 0.638 to 0.564
// ms, the step from 3.29 to 3.12 ms. Longer loops (the input channels) stay loops.
#include "tinygrad/codegen/render_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tinygrad/error.h"

namespace tg {

// Note [unrolled short loops]
std::string CUDARenderer::loop_prefix(int64_t trips) const {
  constexpr int64_t SHORT_LOOP = 8;
  return trips <= SHORT_LOOP ? "#pragma unroll" : "";
}

std::string CUDARenderer::type_name(DType t) const {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "unsigned char";
    case DType::Int32: return "int";
    case DType::Int64: return "long long";
    case DType::Float16: return "float";  // Note [cuda half types]
    case DType::BFloat16: return "unsigned short";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "?";
}

std::string CUDARenderer::storage_type(DType t) const { return t == DType::Float16 ? "unsigned short" : type_name(t); }

std::string CUDARenderer::vector_type(int64_t bytes) const {
  return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : "unsigned int";
}

// Note [bfloat16 rounding instruction] (tg_f32_to_bf16)
std::string CUDARenderer::prelude(const LinearKernel&) const {
  return "#define TG_INL static __device__ __forceinline__\n"
         "TG_INL float tg_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }\n"
         "TG_INL unsigned short tg_f32_to_bf16(float f) {\n"
         "#if __CUDA_ARCH__ >= 800\n"
         "  unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n"
         "#else\n"
         "  unsigned int x = __float_as_uint(f); "
         "if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u); "
         "x += 0x7fffu + ((x >> 16) & 1u); return (unsigned short)(x >> 16);\n"
         "#endif\n"
         "}\n"
         "TG_INL float tg_half_to_f32(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); "
         "return f; }\n"
         "TG_INL unsigned short tg_f32_to_half(float f) { unsigned short h; "
         "asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
         "TG_INL float tg_round_half(float f) { return tg_half_to_f32(tg_f32_to_half(f)); }\n"
         "TG_INL int tg_max_i32(int a, int b) { long long r; "
         "asm(\"max.s64 %0, %1, %2;\" : \"=l\"(r) : \"l\"((long long)a), \"l\"((long long)b)); return (int)r; }\n"
         "TG_INL long long tg_max_i64(long long a, long long b) { long long r; "
         "asm(\"max.s64 %0, %1, %2;\" : \"=l\"(r) : \"l\"(a), \"l\"(b)); return r; }\n"
         "TG_INL unsigned tg_tf32(float f) { unsigned r; "
         "asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(f)); return r; }\n";
}

std::string CUDARenderer::signature(const LinearKernel& k) const {
  int64_t threads = 1;
  for (auto l : k.local_size) threads *= l > 0 ? l : 1;
  std::string s = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) + ") " + k.name + "(";
  for (size_t i = 0; i < k.params.size(); i++) {
    if (i) s += ", ";
    s += std::string(k.params[i].written ? "" : "const ") + storage_type(k.params[i].dtype) + "* __restrict__ data" +
         std::to_string(i);
  }
  return s + ")";
}

std::string CUDARenderer::math(Op op, DType t, const std::string& x) const {
  const char* fn = op == Op::EXP2 ? "exp2" : op == Op::LOG2 ? "log2" : op == Op::SIN ? "sin" : op == Op::SQRT ? "sqrt" : "trunc";
  return std::string(fn) + (t == DType::Float64 ? "" : "f") + "(" + x + ")";
}

// Note [integer max through PTX]
std::string CUDARenderer::max_expr(DType t, const std::string& a, const std::string& b) const {
  if (t == DType::Int32) return "tg_max_i32(" + a + ", " + b + ")";
  if (t == DType::Int64) return "tg_max_i64(" + a + ", " + b + ")";
  return CStyleRenderer::max_expr(t, a, b);
}

std::string CUDARenderer::literal(const UOp& c) const {
  double v = c.const_value();
  if (is_float(c.dtype) && c.dtype != DType::BFloat16 && (std::isnan(v) || std::isinf(v))) {
    if (c.dtype == DType::Float64)
      return std::isnan(v) ? "__longlong_as_double(0x7ff8000000000000ll)"
                           : v < 0 ? "__longlong_as_double(0xfff0000000000000ll)" : "__longlong_as_double(0x7ff0000000000000ll)";
    return std::isnan(v) ? "__uint_as_float(0x7fc00000u)" : v < 0 ? "__uint_as_float(0xff800000u)" : "__uint_as_float(0x7f800000u)";
  }
  if (c.dtype == DType::Float16) {  // the float holding the half value
    return half_as_float_literal(v);
  }
  return CStyleRenderer::literal(c);
}

// Note [float to integer casts]: CUDA's conversions saturate (-3.5 to uint8 gives 0); the
// reference truncates to int64 and wraps, as x86 code does for values within int32. Going
// through long long gives the same result on every device.
std::string CUDARenderer::cast(DType to, DType from, const std::string& x) const {
  if (is_float(from) && (to == DType::UInt8 || to == DType::Int32)) {
    std::string f = from == DType::BFloat16 ? "tg_bf16_to_f32(" + x + ")" : x;
    return "(" + type_name(to) + ")(long long)" + f;
  }
  if (to == DType::Float16) {
    std::string f = from == DType::BFloat16 ? "tg_bf16_to_f32(" + x + ")" : "(float)" + x;
    return "tg_round_half(" + f + ")";
  }
  return CStyleRenderer::cast(to, from, x);
}

std::string CUDARenderer::bitcast(DType to, DType from, const std::string& x, const std::string& v) const {
  std::string T = type_name(to);
  if (from == DType::Float16) return T + " " + v + " = " + (to == DType::Float16 ? x : "tg_f32_to_half(" + x + ")") + ";";
  if (to == DType::Float16) return T + " " + v + " = tg_half_to_f32(" + x + ");";
  if (from == DType::Bool || to == DType::Bool) return T + " " + v + " = (" + T + ")" + x + ";";
  return T + " " + v + "; { " + type_name(from) + " bits = " + x + "; memcpy(&" + v + ", &bits, sizeof(" + v + ")); }";
}

std::string CUDARenderer::load(DType t, const std::string& buf, const std::string& idx) const {
  if (t == DType::Float16) return "tg_half_to_f32(" + buf + "[" + idx + "])";
  return CStyleRenderer::load(t, buf, idx);
}

std::string CUDARenderer::store(DType t, const std::string& buf, const std::string& idx, const std::string& val) const {
  if (t == DType::Float16) return buf + "[" + idx + "] = tg_f32_to_half(" + val + ");";
  return CStyleRenderer::store(t, buf, idx, val);
}

// atomicAdd has float, double, int and unsigned long long forms; int64 adds as the latter (two's
// complement). SCATTER_ADD accumulates in no other dtype (lazy::scatter_accumulator).
std::string CUDARenderer::accumulate(DType t, const std::string& buf, const std::string& idx,
                                     const std::string& val) const {
  TG_ASSERT(t == DType::Float32 || t == DType::Float64 || t == DType::Int32 || t == DType::Int64,
            "CUDA: no atomic add of ", dtype_name(t));
  if (t == DType::Int64) return "atomicAdd((unsigned long long*)&" + buf + "[" + idx + "], (unsigned long long)" + val + ");";
  return "atomicAdd(&" + buf + "[" + idx + "], " + val + ");";
}

std::string CUDARenderer::special(int64_t arg) const {
  std::string d(1, "xyz"[special_dim(arg)]);
  switch (special_kind(arg)) {
    case SpecialKind::GlobalId: return "((long long)blockIdx." + d + " * blockDim." + d + " + threadIdx." + d + ")";
    case SpecialKind::GroupId: return "(long long)blockIdx." + d;
    case SpecialKind::LocalId: return "(long long)threadIdx." + d;
  }
  return "?";
}

std::string CUDARenderer::local_array(DType t, const std::string& name, int64_t size) const {
  return "__shared__ " + type_name(t) + " " + name + "[" + std::to_string(size) + "];";
}

// Note [warp combine]
std::string CUDARenderer::group_combine(const GroupReduce& g, const std::string& acc, const std::string& lid, int id,
                                        const std::string& in) const {
  DType t = g.acc->dtype;
  std::string T = type_name(t);
  auto combine = [&](const std::string& a, const std::string& b) {
    return g.op == Op::MAX ? max_expr(t, a, b) : c_binary(g.op, a, b);
  };
  // every thread of the group takes part: all 32 lanes of each warp, or the L < 32 of a small
  // group, or a whole warp of small groups (Note [packed groups] in codegen/gpu_dims.cpp)
  int64_t active = std::min<int64_t>(g.size * g.per_block, 32);
  char mask[16];
  std::snprintf(mask, sizeof(mask), "0x%08xu", static_cast<unsigned>(active == 32 ? 0xffffffffull : (1ull << active) - 1));
  auto butterfly = [&](int64_t width) {  // combines within aligned runs of `width` lanes
    return in + "for (int s = " + std::to_string(width / 2) + "; s > 0; s >>= 1) { " + T + " o = __shfl_xor_sync(" + mask +
           ", " + acc + ", s); " + acc + " = " + combine(acc, "o") + "; }\n";
  };
  std::string out = butterfly(std::min<int64_t>(g.size, 32));
  if (g.size <= 32) return out;
  std::string m = "tg_red" + std::to_string(id);
  int64_t warps = g.size / 32;
  out += in + "if ((" + lid + " & 31) == 0) " + m + "[" + lid + " >> 5] = " + acc + ";\n";
  out += in + barrier() + "\n";
  out += in + acc + " = " + m + "[" + lid + " & " + std::to_string(warps - 1) + "];\n";
  return out + butterfly(warps);
}

// Note [tensor-core contractions] in codegen/tensor_core.cpp: D = A * B + C for a 16 x 8 x 8
// block, its tf32 operands rounded to nearest (cvt.rna)
std::string CUDARenderer::mma(const std::string& out, const std::vector<std::string>& x) const {
  TG_ASSERT(x.size() == 10, "CUDA mma: expected 10 operands, got ", x.size());
  std::string s = "float " + out + "0, " + out + "1, " + out + "2, " + out + "3; ";
  s += "asm(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
       "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\" : ";
  for (int r = 0; r < 4; r++) s += std::string(r ? ", " : "") + "\"=f\"(" + out + std::to_string(r) + ")";
  s += " : ";
  for (size_t i = 0; i < 10; i++)
    s += std::string(i ? ", " : "") + (i < 6 ? "\"r\"(tg_tf32(" + x[i] + "))" : "\"f\"(" + x[i] + ")");
  return s + ");";
}

}  // namespace tg
