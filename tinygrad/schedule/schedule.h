// The scheduler: cuts a lazy graph into kernels (fusing elementwise chains into each other and
// into the reduce they read, or into a row's reductions: softmax is one kernel), assigns buffers,
// and orders the work.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

class Buffer;

struct ScheduleItem {
  enum class Kind { Kernel, Copy, Collective };
  Kind kind = Kind::Kernel;
  UOpPtr ast;                                    // Kernel: kernel graph rooted at STORE (or a SINK of them); else the lazy node
  std::vector<std::shared_ptr<Buffer>> buffers;  // buffers[0, outputs) are written, the rest are read
  std::string device;  // a collective between the devices of a tuple: the tuple (Note [one item for a collective between devices])
  size_t outputs = 1;  // Note [kernels with several outputs] and Note [one item for a collective between devices] in schedule.cpp
};

// Schedules everything needed to compute `outputs`. `output_buffers` (when given) receives the
// buffer each output will be in once the schedule has run; `kept` (when given) the inner realize
// points worth keeping with their node (convolution outputs, Note [kept convolution outputs]).
// The caller attaches both (UOp::realized) after running the schedule.
using KeptBuffers = std::vector<std::pair<UOpPtr, std::shared_ptr<Buffer>>>;
std::vector<ScheduleItem> create_schedule(const std::vector<UOpPtr>& outputs,
                                          std::vector<std::shared_ptr<Buffer>>* output_buffers = nullptr,
                                          KeptBuffers* kept = nullptr);

// Lowers the lazy subgraph under `root` into a kernel graph (index arithmetic, loads, one
// store). `input_of` names the realized nodes the kernel reads; params are appended to `inputs`.
// Kernels of the same structure are lowered once (Note [lowering cache] in lower.cpp).
UOpPtr lower_kernel(const UOpPtr& root, const std::function<std::shared_ptr<Buffer>(const UOp*)>& input_of,
                    std::vector<std::shared_ptr<Buffer>>& inputs);
// One kernel that stores each of `roots` (of one shape) into parameter i, its index in `roots`:
// a SINK of their STOREs (Note [kernels with several outputs] in schedule.cpp).
UOpPtr lower_kernel(const std::vector<UOpPtr>& roots,
                    const std::function<std::shared_ptr<Buffer>(const UOp*)>& input_of,
                    std::vector<std::shared_ptr<Buffer>>& inputs);

struct LoweringCacheStats {
  size_t hits = 0;    // kernels whose lowering came from the cache
  size_t misses = 0;  // kernels lowered
};
LoweringCacheStats lowering_cache_stats();

}  // namespace tg
