// Knobs: environment variables in one typed registry (DEBUG, BEAM, NOOPT, JIT, THREADS, DEVICE, ...).
// Each is read once, on first use; tests may override a knob for their scope.
#pragma once
#include <cstdint>
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

// Note [one kernel-cache key]: "BEAM=0 CC=cc TF32=1 ..." — the current value of every
// KnobKind::Codegen knob, in registration order. The engine's compiled-kernel cache keys on it, so
// a knob that changes generated code is part of the key by its declaration, not by a hand-kept
// list. The text is rebuilt only after a knob changed (knob_generation()); the reference is the calling
// thread's copy, valid until it calls again.
const std::string& codegen_key();

// A count bumped by every knob's set(): a value derived from knobs stays valid while it is unchanged.
uint64_t knob_generation();

namespace knobs {
extern IntKnob DEBUG;       // 1 kernels, 2 time+memory, 3 optimizations, 4 source, 5 every codegen pass
extern IntKnob CPU_LLVM;    // 1: CPU kernels through LLVM ORC JIT (default when built), 0: system C compiler
extern IntKnob BEAM;      // >0: search kernel optimizations with this beam width (winners cached on disk)
extern IntKnob NOOPT;     // 1: no kernel optimizations (one output element per loop iteration)
extern IntKnob THREADS;   // CPU kernel threads (0: all cores)
extern IntKnob JIT;       // 1: engine/jit captures a step once and replays it; 0: every call runs normally
extern IntKnob MATMUL_LIB; // 1: matrix-product kernels run through the device's library (cuBLASLt); 0: generated
extern IntKnob MATMUL_TUNE;  // n>1: a library matmul's first run times n candidate algorithms, keeps the fastest
extern IntKnob TF32;      // float32 products on the tensor cores: Note [float32 precision policy]
extern IntKnob SPLIT_REDUCE;  // 1: long reductions with few outputs run in two stages on GPU-style devices
extern IntKnob SPLIT_PARTS;  // most partials per output of a long reduction with many outputs (GPU-style); 0:
                             // auto, 1: off
extern IntKnob ROWFUSE;   // 1: a row's reductions and the work that reads them back are one kernel
extern IntKnob VECTORS;   // 1: GPU elementwise kernels load and store neighbouring elements as vectors (CUDA)
extern IntKnob SHARED_CHAINS;  // 1: elementwise chains that several kernels read are computed once where cheaper
extern IntKnob FLASH_ATTENTION;  // 2 (default): attention on CUDA/OpenCL runs as fused kernels where they take it, on tensor cores where it can; 1: without tensor cores; 0: the composition
extern IntKnob ATTENTION_FORWARD_TILES;  // row tiles of 16 a warp owns in the tensor-core forward attention
                                         // kernel: 1 (default) or 2
extern IntKnob RING_ALLREDUCE;  // all-reduces between a process's devices of >= n elements go around a ring; 0: never
extern IntKnob MULTI_LIBRARY;   // 1: collectives between a process's devices through their library (NCCL) where all have it
extern IntKnob PEER_COPY;   // 1: copies between GPUs of a process run peer to peer; 0: through host memory
extern IntKnob CUDA_GRAPH;  // n>0: JIT replays on CUDA run as CUDA graphs, n instantiated per capture; 0: kernel by kernel
extern IntKnob TRACE;     // 1: tg train writes a Chrome-trace timeline per rank (launcher/trace.h)
extern StringKnob DEVICE;   // default device
extern StringKnob CC;       // system C compiler for CPU kernels without LLVM
extern StringKnob CPU_ISA;  // native, or a lower ISA (avx2, sse2) that CPU kernels are tiled and compiled for
extern StringKnob CACHEDIR; // where compiled kernels may be cached on disk
}  // namespace knobs

// Note [float32 precision policy]: a float32 product (a matrix product or a convolution: a
// reduce of products) may run on the tensor cores with its operands rounded to tf32 (10 mantissa
// bits, products and sums in float32), about 8 times the FMA rate on an H200. One knob, TF32,
// says which products may:
//   0  none: every float32 product is exact float32 (FMA kernels, CUBLAS_COMPUTE_32F);
//   1  convolutions (the default): generated convolution kernels take the tensor-core layout
//      (codegen/tensor_core.h), matrix products stay exact;
//   2  every product: library matmuls too (CUBLAS_COMPUTE_32F_FAST_TF32), and generated matmuls
//      where no library runs them.
// The default is PyTorch's (torch.backends.cudnn.allow_tf32 on, torch.backends.cuda.matmul.
// allow_tf32 off). float16 and bfloat16 products, and devices without tensor cores, are not
// affected.
enum class Float32Product { Matmul, Convolution };
bool tf32_for(Float32Product product);

}  // namespace tg
