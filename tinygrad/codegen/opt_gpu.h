// The kernel optimizer's choice for GPU devices: register tiles (UPCAST of output loops, see
// codegen/opt.h) that gpu_dims (codegen/gpu_dims.h) then lays out on threads and work-groups.
#pragma once
#include <vector>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/device_policy.h"

namespace tg {

// Opts for a kernel graph (rooted at STORE or SINK) that runs on a GPU whose thread mapping has
// `limits`; empty for kernels without a reduction.
std::vector<Opt> gpu_hand_coded_opts(const UOpPtr& ast, const GpuLimits& limits = {});

}  // namespace tg
