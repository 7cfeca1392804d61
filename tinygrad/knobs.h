// Knobs: environment variables in one typed registry (DEBUG, BEAM, NOOPT, JIT, THREADS, DEVICE, ...).
// Each is read once, on first use; tests may override a knob for their scope.
#pragma once
#include <string>
#include <vector>

namespace tg {

// Codegen: the knob changes the kernels that are generated (or whether a library runs them), so
// it is part of the compiled-kernel cache's key (codegen_key()). Runtime: it does not.
enum class KnobKind { Runtime, Codegen };

struct KnobInfo {
  std::string name;
  std::string default_value;
  std::string help;
  KnobKind kind = KnobKind::Runtime;
};

class IntKnob {
 public:
  IntKnob(const char* name, int default_value, const char* help, KnobKind kind = KnobKind::Runtime);
  int get() const;
  void set(int v);  // for tests and the launcher
  operator int() const { return get(); }

 private:
  const char* name_;
  mutable int value_;
  mutable bool loaded_ = false;
};

class StringKnob {
 public:
  StringKnob(const char* name, const char* default_value, const char* help, KnobKind kind = KnobKind::Runtime);
  std::string get() const;
  void set(const std::string& v);

 private:
  const char* name_;
  mutable std::string value_;
  mutable bool loaded_ = false;
};

const std::vector<KnobInfo>& all_knobs();

// Note [one kernel-cache key]: "BEAM=0 CC=cc CONV_TF32=1 ..." — the current value of every
// KnobKind::Codegen knob, in registration order. The engine's compiled-kernel cache keys on it, so
// a knob that changes generated code is part of the key by its declaration, not by a hand-kept
// list. The text is rebuilt only after a knob changed (a generation count bumped by set()).
std::string codegen_key();

namespace knobs {
extern IntKnob DEBUG;       // 1 kernels, 2 time+memory, 3 optimizations, 4 source
extern IntKnob CPU_LLVM;    // 1: CPU kernels through LLVM ORC JIT (default when built), 0: system C compiler
extern IntKnob BEAM;      // >0: search kernel optimizations with this beam width (winners cached on disk)
extern IntKnob NOOPT;     // 1: no kernel optimizations (one output element per loop iteration)
extern IntKnob THREADS;   // CPU kernel threads (0: all cores)
extern IntKnob JIT;       // 1: engine/jit captures a step once and replays it; 0: every call runs normally
extern IntKnob MATMUL_LIB; // 1: matrix-product kernels run through the device's library (cuBLASLt); 0: generated
extern IntKnob TF32;      // 1: library float32 matmuls may round their inputs to tf32 (tensor cores)
extern IntKnob
    CONV_TF32;  // 1: float32 convolutions on CUDA run on the tensor cores in tf32 (codegen/tensor_core.h)
extern IntKnob SPLIT_REDUCE;  // 1: long reductions with few outputs run in two stages on GPU-style devices
extern IntKnob SPLIT_PARTS;  // most partials per output of a long reduction with many outputs (GPU-style); 0:
                             // auto, 1: off
extern IntKnob ROWFUSE;   // 1: a row's reductions and the work that reads them back are one kernel
extern IntKnob CUDA_GRAPH;  // n>0: JIT replays on CUDA run as CUDA graphs, n instantiated per capture; 0: kernel by kernel
extern StringKnob DEVICE;   // default device
extern StringKnob CC;       // system C compiler for CPU kernels without LLVM
extern StringKnob CACHEDIR; // where compiled kernels may be cached on disk
}  // namespace knobs

}  // namespace tg
