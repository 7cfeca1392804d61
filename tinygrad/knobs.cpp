// Knob registry: typed environment variables, read lazily.
#include "tinygrad/knobs.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <utility>

namespace tg {

namespace {
std::vector<KnobInfo>& registry() {
  static std::vector<KnobInfo> r;
  return r;
}
// The codegen knobs' readers, in registration order (Note [one kernel-cache key]).
std::vector<std::pair<std::string, std::function<std::string()>>>& codegen_readers() {
  static std::vector<std::pair<std::string, std::function<std::string()>>> r;
  return r;
}
std::atomic<uint64_t> generation{1};  // bumped by every set()
}  // namespace

const std::vector<KnobInfo>& all_knobs() { return registry(); }

uint64_t knob_generation() { return generation.load(); }

const std::string& codegen_key() {
  thread_local uint64_t built_for = 0;
  thread_local std::string key;
  uint64_t now = generation.load();
  if (built_for == now) return key;
  key.clear();
  for (auto& [name, read] : codegen_readers()) key += (key.empty() ? "" : " ") + name + "=" + read();
  built_for = now;
  return key;
}

IntKnob::IntKnob(const char* name, int default_value, const char* help, KnobKind kind)
    : name_(name), value_(default_value) {
  registry().push_back({name, std::to_string(default_value), help, kind});
  if (kind == KnobKind::Codegen) codegen_readers().push_back({name, [this] { return std::to_string(get()); }});
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
  generation++;
}

StringKnob::StringKnob(const char* name, const char* default_value, const char* help, KnobKind kind)
    : name_(name), value_(default_value) {
  registry().push_back({name, default_value, help, kind});
  if (kind == KnobKind::Codegen) codegen_readers().push_back({name, [this] { return get(); }});
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
  generation++;
}

namespace knobs {
IntKnob DEBUG("DEBUG", 0, "1: kernels scheduled and run, copies with their kind (peer, through host); 2: per-kernel time and memory; 3: the optimizer's choices; 4: generated source; 5: the kernel after every codegen pass; 6: CPU kernels' assembly (LLVM)");
IntKnob CPU_LLVM("CPU_LLVM", 1, "1: CPU kernels through the LLVM ORC JIT (when built with LLVM); 0: system C compiler",
                 KnobKind::Codegen);
IntKnob BEAM("BEAM", 0, "beam width of the kernel optimization search (0: hand-coded heuristics); winners are cached on disk",
             KnobKind::Codegen);
IntKnob NOOPT("NOOPT", 0, "1: run kernels without optimizations", KnobKind::Codegen);
IntKnob THREADS("THREADS", 0, "threads for CPU kernels (0: all cores)", KnobKind::Codegen);
IntKnob JIT("JIT", 1, "1: a jitted step (the trainer's) is captured once and its kernels replayed; 0: every step is scheduled and run normally");
IntKnob MATMUL_LIB("MATMUL_LIB", 1, "1: matrix-product kernels run through the device's library (cuBLASLt on CUDA) where it takes them; 0: generated kernels",
                   KnobKind::Codegen);
IntKnob MATMUL_TUNE("MATMUL_TUNE", 8,
                    "n>1: the first run of a library matmul times up to n of the library's candidate algorithms on "
                    "its operands and keeps the fastest (Note [choosing a library algorithm]); 1: the library "
                    "heuristic's first choice");
IntKnob TF32("TF32", 1,
             "float32 products on the tensor cores, operands rounded to tf32: 0 none, 1 convolutions (default, as "
             "PyTorch), 2 every product (library matmuls too)",
             KnobKind::Codegen);
IntKnob ROWFUSE("ROWFUSE", 1,
                "1: a reduce over short trailing rows joins the kernel that reads it back over the same rows "
                "(softmax, layernorm: one kernel); 0: every such reduce is its own kernel",
                KnobKind::Codegen);
IntKnob VECTORS("VECTORS", 1,
                "1: large elementwise kernels and grouped reductions on GPUs with vector accesses (CUDA) give each "
                "thread neighbouring elements and load and store them up to 16 bytes at a time; 0: elementwise "
                "lanes a work-group apart, reductions one element a trip, one access each",
                KnobKind::Codegen);
IntKnob SHARED_CHAINS("SHARED_CHAINS", 1,
                      "1: an elementwise chain that several kernels read is computed once into a buffer when "
                      "that moves less memory than recomputing it in each (a transformer's residual stream); 0: "
                      "elementwise chains are always recomputed inline",
                      KnobKind::Codegen);
IntKnob FLASH_ATTENTION("FLASH_ATTENTION", 2,
                        "2: scaled_dot_product_attention on CUDA and OpenCL runs as fused kernels that never write "
                        "the scores, where they take its shapes and dtype, those of bfloat16/float16 on CUDA's tensor "
                        "cores; 1: the same kernels without tensor cores; 0: always the composition of primitives",
                        KnobKind::Runtime);
IntKnob ATTENTION_FORWARD_TILES(
    "ATTENTION_FORWARD_TILES", 2,
    "the tiles of 16 query rows each warp owns in the tensor-core forward attention "
    "kernel (Note [m-tiles a warp]): 1, 64 rows a block of 4 warps; 2, 128 rows, each "
    "key block read from shared memory once for both tiles",
    KnobKind::Codegen);
IntKnob SPLIT_REDUCE("SPLIT_REDUCE", 1,
                     "1: on GPU-style devices a long reduction with few outputs (BatchNorm's statistics) runs as "
                     "partial results in many work-groups, then a short reduce of those; 0: one stage",
                     KnobKind::Codegen);
IntKnob SPLIT_PARTS(
    "SPLIT_PARTS", 0,
    "most partial results per output of a long reduction with many outputs (a convolution's weight "
    "gradient) on GPU-style devices, with SPLIT_REDUCE=1; 0: 32 where convolutions run on the tensor "
    "cores, else 8; 1: one stage",
    KnobKind::Codegen);
IntKnob RING_ALLREDUCE("RING_ALLREDUCE", 1 << 18,
                       "all-reduces between the devices of one process of at least this many elements run as a "
                       "ring (reduce-scatter, then all-gather); smaller ones are direct exchanges; 0: never a ring");
IntKnob MULTI_LIBRARY("MULTI_LIBRARY", 1,
                      "1: collectives between the devices of one process run through the devices' library where "
                      "every device of the tuple has it (NCCL on CUDA: one grouped call); 0: copy and add kernels");
IntKnob PEER_COPY("PEER_COPY", 1,
                  "1: copies between two devices of one backend that can (the GPUs of a process) run on the "
                  "devices, peer to peer; 0: every copy goes through host memory");
IntKnob CUDA_GRAPH("CUDA_GRAPH", 4, "n>0: jitted replays on CUDA run as CUDA graphs, up to n instantiated per capture (one per set of buffer addresses); 0: kernel by kernel");
IntKnob TRACE("TRACE", 0, "1: tg train records a timeline per rank into the run directory, as train.trace=true does");
StringKnob DEVICE("DEVICE", "CPU", "default device for new tensors");
StringKnob CC("CC", "cc", "system C compiler for CPU kernels when LLVM is not used", KnobKind::Codegen);
StringKnob CPU_ISA(
    "CPU_ISA", "native",
    "the instruction set CPU kernels are tiled and compiled for: native (the best the CPU has), "
    "avx512, avx2 or sse2 (an ISA the CPU lacks is an error)",
    KnobKind::Codegen);
StringKnob CACHEDIR("CACHEDIR", "", "directory for on-disk caches (empty: $HOME/.cache/tinygrad++)");
}  // namespace knobs

// Note [float32 precision policy]
bool tf32_for(Float32Product product) {
  int64_t level = knobs::TF32.get();
  return product == Float32Product::Matmul ? level >= 2 : level >= 1;
}

}  // namespace tg
