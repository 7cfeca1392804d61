// GPU thread mapping, a pass over the kernel graph (after the optimizer, before decompositions
// and linearize): the output loops become thread indices (global ids, or group ids in a grouped
// reduction), local sizes are chosen, a long reduction is split over the threads of a work-group
// and combined through local memory, and large elementwise kernels give each thread several
// elements.
#pragma once
#include <span>
#include <string>
#include <unordered_map>

#include "tinygrad/codegen/renderer.h"
#include "tinygrad/device_policy.h"

namespace tg {

// What the launch of a thread-mapped kernel needs besides its graph.
struct GpuLaunch {
  std::string name;                  // the kernel's name, from its loops before they became threads
  std::vector<int64_t> global_size;  // work-items per dimension (OpenCL convention)
  std::vector<int64_t> local_size;   // work-group size per dimension
};
struct ThreadMappedKernel {
  UOpPtr ast;  // the graph with thread indices for loops (Note [thread mapping on the graph])
  GpuLaunch launch;
};

// The kernel graph `ast` (rooted at STORE or SINK) laid out on threads within the launch limits
// of `limits` (Note [launch limits] in gpu_dims.cpp).
ThreadMappedKernel map_threads(const UOpPtr& ast, const GpuLimits& limits);

// Whether map_threads runs the reduction of `ast` over the threads of a work-group (Note [grouped
// reduction], Note [grouped rows] in gpu_dims.cpp) rather than one thread per output.
bool grouped_reduction(const UOpPtr& ast, const GpuLimits& limits);

// k (linearized from a thread-mapped graph) takes the launch's name and sizes.
void set_launch(LinearKernel& k, const GpuLaunch& launch);

// A thread index (SPECIAL) of `kind` in dimension `dim`, of `size` values.
UOpPtr thread_index(SpecialKind kind, int dim, int64_t size);

// Each of `loops`' indices (outermost first) from the flat index over them (`length` in all): the
// index arithmetic is appended to `code` and each loop's index is left in `sub`; in 32 bits when
// the flat index stays below 2^31 (Note [flat index in 32 bits] in gpu_dims.cpp).
void split_flat_index(UOpPtr flat, std::span<const UOpPtr> loops, int64_t length, std::vector<UOpPtr>& code,
                      std::unordered_map<const UOp*, UOpPtr>& sub);

}  // namespace tg
