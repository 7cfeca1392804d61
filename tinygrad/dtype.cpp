// Data type tables, promotion and host-side element conversion.
#include "tinygrad/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "tinygrad/error.h"

namespace tg {

size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: case DType::UInt8: return 1;
    case DType::Float16: case DType::BFloat16: return 2;
    case DType::Int32: case DType::Float32: return 4;
    case DType::Int64: case DType::Float64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(DType::Float64); i++) {
    auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  if (name == "float" || name == "f32") return DType::Float32;
  if (name == "half" || name == "f16") return DType::Float16;
  if (name == "bf16") return DType::BFloat16;
  if (name == "double" || name == "f64") return DType::Float64;
  if (name == "int" || name == "i32") return DType::Int32;
  if (name == "long" || name == "i64") return DType::Int64;
  TG_FAIL("unknown dtype '", name,
          "' (known: bool, uint8, int32, int64, float16, bfloat16, float32, float64)");
}

bool is_float(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64;
}
bool is_int(DType t) { return t == DType::UInt8 || t == DType::Int32 || t == DType::Int64; }
bool is_unsigned(DType t) { return t == DType::UInt8 || t == DType::Bool; }
bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
DType arith_dtype(DType t) { return is_half(t) ? DType::Float32 : t; }

DType promote(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return static_cast<int>(a) > static_cast<int>(b) ? a : b;
}

double dtype_min(DType t) {
  switch (t) {
    case DType::Bool: case DType::UInt8: return 0;
    case DType::Int32: return std::numeric_limits<int32_t>::min();
    case DType::Int64: return static_cast<double>(std::numeric_limits<int64_t>::min());
    default: return -std::numeric_limits<double>::infinity();
  }
}
double dtype_max(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::UInt8: return 255;
    case DType::Int32: return std::numeric_limits<int32_t>::max();
    case DType::Int64: return static_cast<double>(std::numeric_limits<int64_t>::max());
    default: return std::numeric_limits<double>::infinity();
  }
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return static_cast<uint16_t>(half);
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) { mant <<= 1; exp--; }
      mant &= 0x3ffu;
      x = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bfloat(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

float bfloat_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void store_as(DType t, void* p, double v) {
  switch (t) {
    case DType::Bool: *static_cast<uint8_t*>(p) = v != 0; break;
    case DType::UInt8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DType::Int32: *static_cast<int32_t*>(p) = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DType::Int64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::Float16: *static_cast<uint16_t*>(p) = float_to_half(static_cast<float>(v)); break;
    case DType::BFloat16: *static_cast<uint16_t*>(p) = float_to_bfloat(static_cast<float>(v)); break;
    case DType::Float32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::Float64: *static_cast<double*>(p) = v; break;
  }
}

double load_as(DType t, const void* p) {
  switch (t) {
    case DType::Bool: return *static_cast<const uint8_t*>(p) != 0;
    case DType::UInt8: return *static_cast<const uint8_t*>(p);
    case DType::Int32: return *static_cast<const int32_t*>(p);
    case DType::Int64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::Float16: return half_to_float(*static_cast<const uint16_t*>(p));
    case DType::BFloat16: return bfloat_to_float(*static_cast<const uint16_t*>(p));
    case DType::Float32: return *static_cast<const float*>(p);
    case DType::Float64: return *static_cast<const double*>(p);
  }
  return 0;
}

}  // namespace tg
