// GPU kernel transforms on a LinearKernel: the output loops become thread indices (global ids,
// or group ids in a grouped reduction), local sizes are chosen, and a long reduction with few
// outputs is split over the threads of a work-group and combined through local memory.
#pragma once
#include "tinygrad/codegen/renderer.h"

namespace tg {

struct GpuLimits {
  int64_t max_local = 256;      // work-items per work-group for elementwise kernels
  int64_t group_threads = 128;  // threads sharing one grouped reduction (a power of two)
  int64_t group_max_outputs = 1024;  // group a reduction only when it has at most this many outputs
  int64_t group_min_length = 256;    // ... and its reduce loop is at least this long
  int max_dims = 3;
};

// Rewrites k in place: removes the output loops, sets global_size/local_size (work-items per
// dimension, OpenCL convention) and group_reduces.
void gpu_dims(LinearKernel& k, const GpuLimits& limits);

}  // namespace tg
