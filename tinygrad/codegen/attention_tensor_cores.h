// The tensor-core forms of the fused attention kernels on CUDA (Note [tensor-core attention] in
// attention_tensor_cores.cpp): the template text and the launch shape it is written for.
#pragma once
#include <cstdint>
#include <string>

#include "tinygrad/codegen/attention_kernel.h"

namespace tg {

inline constexpr int64_t TENSOR_CORE_THREADS = 128;  // 4 warps

// The m16 tiles of rows each warp owns (MT in the template): query rows for the forward and dQ,
// key rows for dK/dV; a block takes 64 * MT rows (Note [m-tiles a warp]).
int64_t tensor_core_m_tiles(TemplateKernel k);
inline int64_t tensor_core_block_rows(TemplateKernel k) { return 64 * tensor_core_m_tiles(k); }

// The shared device helpers and the kernel's template with its MT; the caller prepends the size
// macros, TG_NAME and TG_MMA_T ("bf16" or "f16").
std::string tensor_core_attention_source(TemplateKernel k);

}  // namespace tg
