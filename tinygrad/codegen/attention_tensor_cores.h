// The tensor-core forms of the fused attention kernels on CUDA (Note [tensor-core attention] in
// attention_tensor_cores.cpp): the template text and the launch shape it is written for; and the
// pieces of template text that they and the plain forms (attention_kernel.cpp) share.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "tinygrad/codegen/attention_kernel.h"

namespace tg {

inline constexpr int64_t TENSOR_CORE_ROWS = 64;      // query rows (forward, dQ) or key rows (dK/dV) a block
inline constexpr int64_t TENSOR_CORE_THREADS = 128;  // 4 warps, 16 rows each

// The shared device helpers and the kernel's template; the caller prepends the size macros,
// TG_NAME and TG_MMA_T ("bf16" or "f16").
std::string tensor_core_attention_source(TemplateKernel k);

// Note [template pieces]: the kernels' text is written once where two kernels (or the two halves
// of one) would repeat it: a piece is a raw string with ${name} holes, and fill() replaces each
// hole by its value (values are not searched again). A hole without a value is an internal error.
std::string fill(std::string_view text, std::initializer_list<std::pair<std::string_view, std::string>> values);

// The backward kernels' reads of a query row's logsumexp L (in log2 units) from the forward
// output [O | L], and of its D = rowsum(dO * O); `row` is the row's global index expression.
inline std::string lse_read(const std::string& row) { return "fwd[" + row + " * (EV + 1) + EV] * LOG2E"; }
inline std::string delta_read(const std::string& row) { return "dsum[" + row + "]"; }

}  // namespace tg
