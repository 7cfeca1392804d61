// From a kernel graph (rooted at STORE) to a LinearKernel: half types computed in float32,
// reduces turned into accumulators, every uop placed inside the loops it depends on.
#pragma once
#include "tinygrad/codegen/renderer.h"

namespace tg {

LinearKernel linearize(const UOpPtr& store, const std::vector<DType>& param_dtypes);
// A readable kernel name: "r_" for kernels with a reduce, "E_" otherwise, then loop sizes.
std::string kernel_name(const LinearKernel& k);

}  // namespace tg
