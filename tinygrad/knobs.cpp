// Knob registry: typed environment variables, read lazily.
#include "tinygrad/knobs.h"

#include <cstdlib>

namespace tg {

namespace {
std::vector<KnobInfo>& registry() {
  static std::vector<KnobInfo> r;
  return r;
}
}  // namespace

const std::vector<KnobInfo>& all_knobs() { return registry(); }

IntKnob::IntKnob(const char* name, int default_value, const char* help) : name_(name), value_(default_value) {
  registry().push_back({name, std::to_string(default_value), help});
}
int IntKnob::get() const {
  if (!loaded_) {
    if (const char* e = std::getenv(name_); e && *e) value_ = std::atoi(e);
    loaded_ = true;
  }
  return value_;
}
void IntKnob::set(int v) {
  value_ = v;
  loaded_ = true;
}

StringKnob::StringKnob(const char* name, const char* default_value, const char* help)
    : name_(name), value_(default_value) {
  registry().push_back({name, default_value, help});
}
std::string StringKnob::get() const {
  if (!loaded_) {
    if (const char* e = std::getenv(name_); e && *e) value_ = e;
    loaded_ = true;
  }
  return value_;
}
void StringKnob::set(const std::string& v) {
  value_ = v;
  loaded_ = true;
}

namespace knobs {
IntKnob DEBUG("DEBUG", 0, "1: kernels scheduled and run; 2: per-kernel time and memory; 3: applied kernel optimizations; 4: generated source");
IntKnob CPU_LLVM("CPU_LLVM", 1, "1: CPU kernels through the LLVM ORC JIT (when built with LLVM); 0: system C compiler");
IntKnob BEAM("BEAM", 0, "beam width of the kernel optimization search (0: hand-coded heuristics); winners are cached on disk");
IntKnob NOOPT("NOOPT", 0, "1: run kernels without optimizations");
IntKnob THREADS("THREADS", 0, "threads for CPU kernels (0: all cores)");
IntKnob JIT("JIT", 1, "1: a jitted step (the trainer's) is captured once and its kernels replayed; 0: every step is scheduled and run normally");
IntKnob MATMUL_LIB("MATMUL_LIB", 1, "1: matrix-product kernels run through the device's library (cuBLASLt on CUDA) where it takes them; 0: generated kernels");
IntKnob TF32("TF32", 0, "1: float32 library matmuls may round inputs to tf32 (tensor cores, about 10 mantissa bits)");
IntKnob CONV_TF32(
    "CONV_TF32", 1,
    "1: float32 convolutions on CUDA (contractions that are not matrix products) round their operands "
    "to tf32 and run on the tensor cores, as PyTorch's cuDNN does by default; 0: exact float32 FMAs");
IntKnob ROWFUSE("ROWFUSE", 1,
                "1: a reduce over short trailing rows joins the kernel that reads it back over the same rows "
                "(softmax, layernorm: one kernel); 0: every such reduce is its own kernel");
IntKnob SPLIT_REDUCE("SPLIT_REDUCE", 1,
                     "1: on GPU-style devices a long reduction with few outputs (BatchNorm's statistics) runs as "
                     "partial results in many work-groups, then a short reduce of those; 0: one stage");
IntKnob SPLIT_PARTS(
    "SPLIT_PARTS", 0,
    "most partial results per output of a long reduction with many outputs (a convolution's weight "
    "gradient) on GPU-style devices, with SPLIT_REDUCE=1; 0: 32 where convolutions run on the tensor "
    "cores, else 8; 1: one stage");
IntKnob CUDA_GRAPH("CUDA_GRAPH", 4, "n>0: jitted replays on CUDA run as CUDA graphs, up to n instantiated per capture (one per set of buffer addresses); 0: kernel by kernel");
StringKnob DEVICE("DEVICE", "CPU", "default device for new tensors");
StringKnob CC("CC", "cc", "system C compiler for CPU kernels when LLVM is not used");
StringKnob CACHEDIR("CACHEDIR", "", "directory for on-disk caches (empty: $HOME/.cache/tinygrad++)");
}  // namespace knobs

}  // namespace tg
