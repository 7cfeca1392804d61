// From a kernel graph (rooted at STORE, or at a SINK of STOREs) to a LinearKernel: half types computed in float32,
// reduces turned into accumulators, every uop placed inside the loops it depends on.
#pragma once
#include "tinygrad/codegen/renderer.h"

namespace tg {

LinearKernel linearize(const UOpPtr& ast, const std::vector<DType>& param_dtypes);

// A kernel graph's loops as the linearizer opens them (Note [row loops] in linearize.cpp).
struct KernelLoops {
  std::vector<UOpPtr> outer;         // the output loops, outermost first: what a launch spreads over threads
  std::vector<UOpPtr> row_elements;  // loops over a row's elements, opened after the row's reductions
  std::vector<UOpPtr> top_reduces;   // the REDUCEs not inside another one's loops
};
KernelLoops kernel_loops(const UOpPtr& ast);

// A readable kernel name: "r_" for kernels with a reduce, "E_" otherwise, then the output loop
// sizes, "__" and the reduce loop sizes, "_x<n>" for n upcast lanes and "_o<n>" for n outputs.
std::string kernel_name(const UOpPtr& ast);

// The value a reduction by `op` starts from.
double reduce_identity(Op op, DType dt);
// The thread index of the work-group that shares `reduce` (its last source), or null
// (Note [thread mapping on the graph] in codegen/gpu_dims.cpp).
UOpPtr group_lid(const UOpPtr& reduce);

// The global size a launch of k should split across threads: k.global_size, or empty (one
// thread) when k does too little work to pay for waking the others (Note [when to thread]).
std::vector<int64_t> launch_size(const LinearKernel& k);

}  // namespace tg
