// Contractions on the tensor cores: a float32 reduce of a product (a convolution's forward pass
// or its input gradient) as warps of mma.sync tf32 instructions. Note [tensor-core contractions]
// in tensor_core.cpp.
#pragma once
#include <optional>
#include <vector>

#include "tinygrad/codegen/renderer.h"

namespace tg {

// The kernel graph `ast` (rooted at its STORE, before opts) as a tensor-core kernel laid out on
// warps (global and local sizes set, ready to render), or nullopt when it is not a contraction of
// the shape the tensor cores take well.
std::optional<LinearKernel> tensor_core_kernel(const UOpPtr& ast, const std::vector<DType>& param_dtypes);

}  // namespace tg
