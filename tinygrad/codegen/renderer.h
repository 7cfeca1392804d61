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

// A reduction shared by the threads of a work-group (codegen/gpu_dims.h): after the loop that
// closes `acc`'s reduce range, the threads' partials meet in local memory and are combined.
struct GroupReduce {
  UOpPtr acc;       // the DEFINE_ACC holding each thread's partial
  UOpPtr lid;       // the thread's index in the group (a SPECIAL, or one modulo the group's size)
  int64_t size;     // threads per group (a power of two)
  Op op;            // ADD, MUL or MAX
  int64_t per_block = 1;  // groups sharing one work-group (Note [packed groups] in gpu_dims.cpp)
};

// Kernel uops in execution order. RANGE opens a loop and ENDRANGE closes it; DEFINE_ACC declares
// an accumulator, ASSIGN updates it, and later uses of the DEFINE_ACC read its value. CONST nodes
// are not listed: renderers inline them where they are used. Parameter i is DEFINE_GLOBAL{i}.
// SPECIAL is a thread index (arg: special_arg below); a STORE with a fourth source stores only
// where that gate is true.
struct LinearKernel {
  std::string name;
  std::vector<UOpPtr> uops;
  std::vector<KernelParam> params;
  // CPU: trip counts of the outermost loops (the output's), outermost first; CPU kernels take a
  // range [lo, hi) of the first one as arguments, so a launch can split it across threads.
  // GPU (from the thread mapping, codegen/gpu_dims.h): work-items per dimension.
  std::vector<int64_t> global_size;
  std::vector<int64_t> local_size;  // GPU: work-group size per dimension; empty: none
  std::vector<GroupReduce> group_reduces;
};

// SPECIAL args: which thread index, and in which dimension (0..2).
enum class SpecialKind : int64_t { GlobalId = 0, GroupId = 1, LocalId = 2 };
inline int64_t special_arg(SpecialKind kind, int dim) { return static_cast<int64_t>(kind) * 10 + dim; }
inline SpecialKind special_kind(int64_t arg) { return static_cast<SpecialKind>(arg / 10); }
inline int special_dim(int64_t arg) { return static_cast<int>(arg % 10); }

struct Renderer {
  virtual ~Renderer() = default;
  virtual std::string render(const LinearKernel& kernel) const = 0;
};

}  // namespace tg
