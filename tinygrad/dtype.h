// Data types, their sizes and names, and the promotion lattice used by binary ops.
#pragma once
#include <cstdint>
#include <string>

namespace tg {

enum class DType : uint8_t { Bool, UInt8, Int32, Int64, Float16, BFloat16, Float32, Float64 };

namespace dtypes {
constexpr DType bool_ = DType::Bool;
constexpr DType uint8 = DType::UInt8;
constexpr DType int32 = DType::Int32;
constexpr DType int64 = DType::Int64;
constexpr DType float16 = DType::Float16;
constexpr DType bfloat16 = DType::BFloat16;
constexpr DType float32 = DType::Float32;
constexpr DType float64 = DType::Float64;
// Index arithmetic inside kernels.
constexpr DType index = DType::Int64;
}  // namespace dtypes

size_t itemsize(DType t);
const char* dtype_name(DType t);  // "float32"
DType dtype_from_name(const std::string& name);  // throws tg::Error on unknown names
bool is_float(DType t);
bool is_int(DType t);  // signed or unsigned integer, not bool
bool is_unsigned(DType t);
bool is_half(DType t);  // float16 or bfloat16
// The dtype arithmetic on values of t runs in: float32 for the half types (stored 16-bit, computed
// in float32 and rounded back), t itself otherwise.
DType arith_dtype(DType t);
// The dtype both operands of a binary op are cast to (NumPy/PyTorch-like lattice:
// bool < uint8 < int32 < int64 < float16/bfloat16 < float32 < float64; float16+bfloat16 -> float32).
DType promote(DType a, DType b);
// Smallest and largest finite value of a dtype, as double (for reduce identities, clip).
double dtype_min(DType t);
double dtype_max(DType t);

// Host conversions for half types.
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat(float f);
float bfloat_to_float(uint16_t b);

// Store / load one element of dtype t at p, through double.
void store_as(DType t, void* p, double v);
double load_as(DType t, const void* p);

}  // namespace tg
