// From a kernel graph (rooted at STORE, or at a SINK of STOREs) to a LinearKernel: half types computed in float32,
// reduces turned into accumulators, every uop placed inside the loops it depends on.
#pragma once
#include "tinygrad/codegen/renderer.h"

namespace tg {

LinearKernel linearize(const UOpPtr& store, const std::vector<DType>& param_dtypes);
// A readable kernel name: "r_" for kernels with a reduce, "E_" otherwise, then the output loop
// sizes, "__" and the reduce loop sizes, and "_x<n>" for n upcast stores.
std::string kernel_name(const LinearKernel& k);

// The global size a launch of k should split across threads: k.global_size, or empty (one
// thread) when k does too little work to pay for waking the others (Note [when to thread]).
std::vector<int64_t> launch_size(const LinearKernel& k);

}  // namespace tg
