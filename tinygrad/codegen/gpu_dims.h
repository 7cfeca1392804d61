// GPU kernel transforms on a LinearKernel: the output loops become thread indices (global ids,
// or group ids in a grouped reduction), local sizes are chosen, a long reduction is split over
// the threads of a work-group and combined through local memory, and large elementwise kernels
// give each thread several elements.
#pragma once
#include <span>
#include <unordered_map>

#include "tinygrad/codegen/renderer.h"
#include "tinygrad/device_policy.h"

namespace tg {

// Rewrites k in place: removes the output loops, sets global_size/local_size (work-items per
// dimension, OpenCL convention) and group_reduces.
void gpu_dims(LinearKernel& k, const GpuLimits& limits);
// gpu_dims within the launch limits of `limits` (Note [launch limits] in gpu_dims.cpp).
void map_threads(LinearKernel& k, const GpuLimits& limits);

// A thread index (SPECIAL) of `kind` in dimension `dim`, of `size` values.
UOpPtr thread_index(SpecialKind kind, int dim, int64_t size);

// Each of `loops`' indices (outermost first) from the flat index over them (`length` in all): the
// index arithmetic is appended to `code` and each loop's index is left in `sub`; in 32 bits when
// the flat index stays below 2^31 (Note [flat index in 32 bits] in gpu_dims.cpp).
void split_flat_index(UOpPtr flat, std::span<const UOpPtr> loops, int64_t length, std::vector<UOpPtr>& code,
                      std::unordered_map<const UOp*, UOpPtr>& sub);

}  // namespace tg
