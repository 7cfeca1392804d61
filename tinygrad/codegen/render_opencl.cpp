// OpenCL C rendering. Without cl_khr_fp16, a float16 value is held in a float that is always
// rounded to half precision (tg_round_half), and float16 buffers are read and written with
// vload_half / vstore_half_rte, which OpenCL C has without the extension.
#include "tinygrad/codegen/render_opencl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tinygrad/error.h"

namespace tg {

std::string OpenCLRenderer::type_name(DType t) const {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uchar";
    case DType::Int32: return "int";
    case DType::Int64: return "long";
    case DType::Float16: return native_half_ ? "half" : "float";
    case DType::BFloat16: return "ushort";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "?";
}

// Buffers of bool are bytes: OpenCL has no bool in global memory.
std::string OpenCLRenderer::buffer_type(DType t) const {
  if (t == DType::Bool) return "uchar";
  if (t == DType::Float16) return "half";
  return type_name(t);
}

namespace {

// Atomic adds for accumulating stores (Note [accumulating stores] in schedule/lower.cpp): OpenCL
// 1.2 adds integers atomically; floats go through a compare-and-swap loop on their bits, 64-bit
// types through cl_khr_int64_base_atomics.
const char* ATOMIC_ADDS =
    "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"
    "inline void tg_add_f32(volatile __global float* p, float v) { uint seen, old = as_uint(*p); "
    "do { seen = old; old = atomic_cmpxchg((volatile __global uint*)p, seen, as_uint(as_float(seen) + v)); } "
    "while (old != seen); }\n"
    "inline void tg_add_i32(volatile __global int* p, int v) { atomic_add(p, v); }\n"
    "inline void tg_add_i64(volatile __global long* p, long v) { atom_add(p, v); }\n";
const char* ATOMIC_ADD_F64 =
    "inline void tg_add_f64(volatile __global double* p, double v) { ulong seen, old = as_ulong(*p); "
    "do { seen = old; old = atom_cmpxchg((volatile __global ulong*)p, seen, as_ulong(as_double(seen) + v)); } "
    "while (old != seen); }\n";

}  // namespace

std::string OpenCLRenderer::prelude(const LinearKernel& k) const {
  bool f64 = false, f16 = false;
  for (auto& p : k.params) f64 |= p.dtype == DType::Float64, f16 |= p.dtype == DType::Float16;
  for (auto& u : k.uops) f64 |= u->dtype == DType::Float64, f16 |= u->dtype == DType::Float16;
  std::string s;
  if (f64) s += "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n";
  if (f16 && native_half_) s += "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n";
  s += "inline float tg_bf16_to_f32(ushort b) { return as_float((uint)b << 16); }\n"
       "inline ushort tg_f32_to_bf16(float f) { uint x = as_uint(f); "
       "if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40u); "
       "x += 0x7fffu + ((x >> 16) & 1u); return (ushort)(x >> 16); }\n";
  if (std::any_of(k.uops.begin(), k.uops.end(), [](const UOpPtr& u) { return is_accumulating_store(*u); }))
    s += std::string(ATOMIC_ADDS) + (f64 ? ATOMIC_ADD_F64 : "");
  if (f16 && !native_half_)
    s += "inline ushort tg_half_bits(float f) { ushort b; vstore_half_rte(f, 0, (__private half*)&b); return b; }\n"
         "inline float tg_half_from_bits(ushort b) { return vload_half(0, (__private half*)&b); }\n"
         "inline float tg_round_half(float f) { return tg_half_from_bits(tg_half_bits(f)); }\n";
  return s;
}

std::string OpenCLRenderer::signature(const LinearKernel& k) const {
  std::string s = "__kernel void " + k.name + "(";
  for (size_t i = 0; i < k.params.size(); i++) {
    if (i) s += ", ";
    s += std::string("__global ") + (k.params[i].written ? "" : "const ") + buffer_type(k.params[i].dtype) +
         "* restrict data" + std::to_string(i);
  }
  return s + ")";
}

std::string OpenCLRenderer::math(Op op, DType, const std::string& x) const {
  const char* fn = op == Op::EXP2 ? "exp2" : op == Op::LOG2 ? "log2" : op == Op::SIN ? "sin" : op == Op::SQRT ? "sqrt" : "trunc";
  return std::string(fn) + "(" + x + ")";
}

std::string OpenCLRenderer::literal(const UOp& c) const {
  double v = c.const_value();
  if (is_float(c.dtype) && c.dtype != DType::BFloat16 && (std::isnan(v) || std::isinf(v))) {
    std::string t = c.dtype == DType::Float64 ? "(double)" : "";
    if (std::isnan(v)) return "(" + t + "NAN)";
    return std::string("(") + (v < 0 ? "-" : "") + t + "INFINITY)";
  }
  if (c.dtype == DType::Int64) return "((long)" + std::to_string(static_cast<int64_t>(v)) + ")";
  if (c.dtype == DType::Float16 && !native_half_) {  // a float holding the half value
    return half_as_float_literal(v);
  }
  return CStyleRenderer::literal(c);
}

// Float to uint8 or int32 goes through long, so out-of-range values wrap as on the other devices
// instead of being undefined (PoCL gave 0 for -107.0f to uint8); see Note [float to integer
// casts] in render_cuda.cpp.
std::string OpenCLRenderer::cast(DType to, DType from, const std::string& x) const {
  if (is_float(from) && (to == DType::UInt8 || to == DType::Int32))
    return "(" + type_name(to) + ")" + CStyleRenderer::cast(DType::Int64, from, x);
  if (!native_half_ && to == DType::Float16) {
    std::string f = from == DType::BFloat16 ? "tg_bf16_to_f32(" + x + ")" : "(float)" + x;
    return "tg_round_half(" + f + ")";
  }
  return CStyleRenderer::cast(to, from, x);
}

std::string OpenCLRenderer::bitcast(DType to, DType from, const std::string& x, const std::string& v) const {
  std::string T = type_name(to);
  if (!native_half_ && from == DType::Float16) {
    std::string bits = "tg_half_bits(" + x + ")";
    return T + " " + v + " = " + (to == DType::Float16 ? x : "as_" + T + "(" + bits + ")") + ";";
  }
  if (!native_half_ && to == DType::Float16) return T + " " + v + " = tg_half_from_bits(as_ushort(" + x + "));";
  if (from == DType::Bool || to == DType::Bool) return T + " " + v + " = (" + T + ")" + x + ";";
  return T + " " + v + " = as_" + T + "(" + x + ");";
}

std::string OpenCLRenderer::load(DType t, const std::string& buf, const std::string& idx) const {
  if (t == DType::Float16 && !native_half_) return "vload_half(" + idx + ", " + buf + ")";
  return CStyleRenderer::load(t, buf, idx);
}

std::string OpenCLRenderer::accumulate(DType t, const std::string& buf, const std::string& idx,
                                       const std::string& val) const {
  const char* f = t == DType::Float32 ? "tg_add_f32" : t == DType::Float64 ? "tg_add_f64"
                  : t == DType::Int32 ? "tg_add_i32" : t == DType::Int64 ? "tg_add_i64" : nullptr;
  TG_ASSERT(f, "OpenCL: no atomic add of ", dtype_name(t));
  return std::string(f) + "(&" + buf + "[" + idx + "], " + val + ");";
}

std::string OpenCLRenderer::store(DType t, const std::string& buf, const std::string& idx, const std::string& val) const {
  if (t == DType::Float16 && !native_half_) return "vstore_half_rte(" + val + ", " + idx + ", " + buf + ");";
  return CStyleRenderer::store(t, buf, idx, val);
}

std::string OpenCLRenderer::special(int64_t arg) const {
  const char* fn[] = {"get_global_id", "get_group_id", "get_local_id"};
  return std::string("(long)") + fn[static_cast<int>(special_kind(arg))] + "(" + std::to_string(special_dim(arg)) + ")";
}

std::string OpenCLRenderer::local_array(DType t, const std::string& name, int64_t size) const {
  return "__local " + type_name(t) + " " + name + "[" + std::to_string(size) + "];";
}

}  // namespace tg
