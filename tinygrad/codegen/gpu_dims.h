// GPU kernel transforms on a LinearKernel: the output loops become thread indices (global ids,
// or group ids in a grouped reduction), local sizes are chosen, a long reduction is split over
// the threads of a work-group and combined through local memory, and large elementwise kernels
// give each thread several elements.
#pragma once
#include <span>
#include <unordered_map>

#include "tinygrad/codegen/renderer.h"

namespace tg {

struct GpuLimits {
  int64_t max_local = 256;           // work-items per work-group for elementwise kernels
  int64_t group_threads = 1024;      // most threads sharing one grouped reduction (a power of two)
  int64_t group_min_per_thread = 8;  // ... each of which reduces at least this many elements
  // A reduction (the product of its reduce loops) is grouped when it is at least row_min_length
  // long and its innermost loop is contiguous in memory for every load that moves along it
  // (softmax's and layernorm's rows), when it has at most group_max_outputs outputs and at least
  // group_min_length elements, or when it has at most group_long_max_outputs outputs, at least
  // group_long_length elements and loads that are contiguous along its innermost loop (a
  // convolution's weight gradient).
  int64_t row_min_length = 128;
  int64_t group_max_outputs = 1024;
  int64_t group_min_length = 256;
  int64_t group_long_max_outputs = int64_t{1} << 16;
  int64_t group_long_length = 4096;
  // Local memory the combines of one group may take (all its accumulators), and how many threads
  // share one slot of it (CUDA: a warp, whose partials meet through shuffles first).
  int64_t group_local_bytes = 16384;
  int64_t group_threads_per_slot = 1;
  // Accumulators (threads times accumulators per thread) of one group: 16 per thread of a full
  // group of 1024, so a register tile's lanes leave registers for the loads in flight.
  int64_t group_accumulators = 16384;
  // Elementwise kernels of at least lanes_min_threads * lanes elements give each thread `lanes`
  // elements, a work-group's width apart (Note [elementwise lanes]); 1 turns this off.
  int64_t lanes = 4;
  int64_t lanes_min_threads = int64_t{1} << 18;
  int max_dims = 3;
};

// Rewrites k in place: removes the output loops, sets global_size/local_size (work-items per
// dimension, OpenCL convention) and group_reduces.
void gpu_dims(LinearKernel& k, const GpuLimits& limits);

// A thread index (SPECIAL) of `kind` in dimension `dim`, of `size` values.
UOpPtr thread_index(SpecialKind kind, int dim, int64_t size);

// Each of `loops`' indices (outermost first) from the flat index over them (`length` in all): the
// index arithmetic is appended to `code` and each loop's index is left in `sub`; in 32 bits when
// the flat index stays below 2^31 (Note [flat index in 32 bits] in gpu_dims.cpp).
void split_flat_index(UOpPtr flat, std::span<const UOpPtr> loops, int64_t length, std::vector<UOpPtr>& code,
                      std::unordered_map<const UOp*, UOpPtr>& sub);

}  // namespace tg
