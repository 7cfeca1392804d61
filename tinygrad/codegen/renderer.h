// A linearized kernel and the Renderer interface that turns it into device source
// (C, LLVM IR, CUDA, OpenCL).
#pragma once
#include <string>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

struct KernelParam {
  DType dtype;
  bool written;
};

// Kernel uops in execution order. RANGE opens a loop and ENDRANGE closes it; DEFINE_ACC declares
// an accumulator, ASSIGN updates it, and later uses of the DEFINE_ACC read its value. CONST nodes
// are not listed: renderers inline them where they are used. Parameter i is DEFINE_GLOBAL{i}.
struct LinearKernel {
  std::string name;
  std::vector<UOpPtr> uops;
  std::vector<KernelParam> params;
  // Trip counts of the outermost loops (the output's), outermost first. CPU kernels take a range
  // [lo, hi) of the first one as arguments, so a launch can split it across threads.
  std::vector<int64_t> global_size;
};

struct Renderer {
  virtual ~Renderer() = default;
  virtual std::string render(const LinearKernel& kernel) const = 0;
};

}  // namespace tg
