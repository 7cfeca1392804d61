// The tensor-core forms of the fused attention kernels on CUDA (Note [tensor-core attention] in
// attention_tensor_cores.cpp): the template text and the launch shape it is written for.
#pragma once
#include <cstdint>
#include <string>

#include "tinygrad/codegen/attention_kernel.h"

namespace tg {

inline constexpr int64_t TENSOR_CORE_ROWS = 64;      // query rows (forward, dQ) or key rows (dK/dV) a block
inline constexpr int64_t TENSOR_CORE_THREADS = 128;  // 4 warps, 16 rows each

// The shared device helpers and the kernel's template; the caller prepends the size macros,
// TG_NAME and TG_MMA_T ("bf16" or "f16").
std::string tensor_core_attention_source(TemplateKernel k);

}  // namespace tg
