// The kernel pipeline: the one list of passes that turns a scheduled kernel into device source
// (Note [the pass list] in pipeline.cpp). engine/realize compiles and launches what it returns;
// BEAM (engine/beam.cpp) sends each candidate through the same passes.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/renderer.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/match_matmul.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {

// What the passes need to know of the device a kernel is for.
struct CodegenTarget {
  const Renderer& renderer;
  const DevicePolicy& policy;
  bool native_transcendentals = false;
  bool tensor_cores = false;
  static CodegenTarget of(const Device& dev);
};

// The optimizer's choice for one kernel: a generated kernel with opts (codegen/opt.h), the
// tensor-core layout (codegen/tensor_core.h), the CPU's bf16 dot tiles (codegen/cpu_dot.h), the
// device's matmul library (Note [library matmuls] in device.h), or, for a TEMPLATE_KERNEL item,
// its template (Note [template kernels] in codegen/attention_kernel.cpp; never a choice among
// others).
struct KernelChoice {
  enum class Kind { Generated, TensorCores, Library, Bf16Dot, Template };
  Kind kind = Kind::Generated;
  std::vector<Opt> opts;            // Generated
  std::optional<MatmulSpec> matmul;  // Library
  std::string str() const;  // "UPCAST(0,4) UNROLL(1,4)", "tensor cores", "library <spec>", "bf16 dot", "template"
  static KernelChoice generated(std::vector<Opt> opts) { return {Kind::Generated, std::move(opts), std::nullopt}; }
};
// Inverse of KernelChoice::str for the generated, tensor-core and bf16 dot kinds (BEAM's disk cache).
KernelChoice parse_choice(const std::string& text);

// The kernel as the pipeline leaves it: rendered source and its launch (kernel.global_size and
// local_size), or, for a library choice, only the choice.
struct LoweredKernel {
  KernelChoice choice;
  LinearKernel kernel;
  std::string source;
};

// The dtypes of a kernel item's buffers (its kernel's parameters, in order).
std::vector<DType> param_dtypes(const ScheduleItem& item);

// The whole pipeline for a kernel item: the optimizer's choice (hand-coded heuristics, or BEAM
// with BEAM=n) and then the passes that turn it into source.
LoweredKernel lower_kernel_item(const ScheduleItem& item, Device& dev);

// The passes after the choice (Note [the pass list]). choice.kind must not be Library.
LoweredKernel lower_with_choice(const UOpPtr& ast, const std::vector<DType>& param_dtypes, const CodegenTarget& target,
                                const KernelChoice& choice);

// The heuristics' choice (no search): the library for a matrix product it takes, the tensor
// cores for a contraction that the float32 precision policy lets them run (Note [float32
// precision policy] in knobs.h), the bf16 dot tiles for a bfloat16 product on a CPU with
// AVX512-BF16 (Note [bf16 dot tiles] in cpu_dot.cpp), else the hand-coded opts for the device's kind.
KernelChoice heuristic_choice(const ScheduleItem& item, Device& dev);

// The choices BEAM compares with generated kernels: the tensor-core layout, the bf16 dot tiles and
// the library, each where it applies to item's kernel and the precision policy allows it.
std::vector<KernelChoice> alternative_choices(const ScheduleItem& item, Device& dev);

}  // namespace tg
