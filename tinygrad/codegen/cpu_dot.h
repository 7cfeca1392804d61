// bfloat16 products on the CPU through AVX512-BF16's vdpbf16ps: a float32 reduce of a product of
// two bfloat16 operands laid out as tiles of dot-product instructions (Note [bf16 dot tiles] in
// cpu_dot.cpp). The tile's vector parts are WMMA uops that only the LLVM renderer renders.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "tinygrad/codegen/renderer.h"

namespace tg {

// The parts of a bf16 dot tile: WMMA uops whose arg is {part, value} (a GPU's tensor-core WMMA
// has an int arg).
enum class DotPart : int64_t {
  Zero = 1,        // float32: 16 zeros, an accumulator's initial value
  Rows = 2,        // bfloat16: 32 neighbouring elements of B, src {buffer, index of the first}
  Interleave = 3,  // bfloat16: value 0 (1): the columns {0-3, 8-11, 16-19, 24-27} ({4-7, 12-15,
                   // 20-23, 28-31}) of src {Rows at k, Rows at k+1 (absent: zeros)}, in pairs
  Pair = 4,        // int32: src {A at k, A at k+1 (absent: zero)}, two bfloat16 in one word
  Dot = 5,         // float32: src {accumulator, Pair, Interleave}: 16 lanes += two products each
  Columns = 6,     // float32: value 0 (1): the columns 0-15 (16-31) of a row, in order, from src
                   // {the row's accumulator of Interleave 0, that of Interleave 1}
  Lane = 7,        // float32: lane `value` of src {Columns}
};
inline std::vector<int64_t> dot_arg(DotPart part, int64_t value = 0) { return {static_cast<int64_t>(part), value}; }
inline DotPart dot_part(const std::vector<int64_t>& arg) { return static_cast<DotPart>(arg.at(0)); }

// Columns of B per tile (two accumulators of 16 lanes per row of A).
constexpr int64_t DOT_TILE_COLUMNS = 32;

// The kernel graph `ast` (rooted at its STORE, before opts) as a kernel of bf16 dot tiles, ready
// to render with the LLVM renderer, or nullopt where it is not such a product (Note [bf16 dot
// tiles]); B's columns are grouped for an L2 cache of l2_bytes (Note [column groups]).
std::optional<LinearKernel> bf16_dot_kernel(const UOpPtr& ast, const std::vector<DType>& param_dtypes,
                                            int64_t l2_bytes);

}  // namespace tg
