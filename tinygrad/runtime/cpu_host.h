// The host CPU as the CPU device's kernels see it: the instruction set they are compiled for
// (restricted by CPU_ISA), its vector width and register count, the CPU's model name and its
// cache sizes. The kernel optimizer tiles for it (CpuLimits in device_policy.h), the LLVM and C
// compilers target it, and the compiled-kernel and BEAM caches key on it (Note [the host's
// description]).
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include "tinygrad/device_policy.h"

namespace tg {

// What /proc/cpuinfo says of the first CPU.
struct CpuInfo {
  std::string model;            // "model name" ("AMD EPYC 9B14"); empty where there is none
  std::string vendor;           // "vendor_id" ("AuthenticAMD", "GenuineIntel")
  int family = 0;               // "cpu family" (25: AMD Zen 3 and Zen 4)
  std::set<std::string> flags;  // "flags" (x86: avx2, fma, avx512f, amx_tile, ...)
};

struct CacheSizes {
  int64_t l1d_bytes = int64_t{32} << 10;
  int64_t l2_bytes = int64_t{1} << 20;
  int64_t l3_bytes = int64_t{32} << 20;
};

struct CpuHost {
  std::string model;       // the CPU's model name ("unknown CPU" where none is known)
  std::string isa;         // what kernels are compiled for: "avx512", "avx2", "sse2" or "generic"
  std::string native_isa;  // the best the CPU has
  int vector_bits = 128;
  int vector_registers = 16;
  bool fma = false;
  bool avx512_bf16 = false;  // bfloat16 dot products (vdpbf16ps): Note [bf16 dot tiles] in codegen/cpu_dot.cpp
  bool amx = false;          // AMX tiles (amx_tile and amx_bf16); not used by kernels yet
  // 512-bit operations run as two 256-bit halves (AMD Zen 4): FMAs at AVX2's rate, so the
  // kernels are tiled as for AVX2 (Note [the host's description])
  bool split_512 = false;
  CacheSizes cache;

  CpuLimits limits() const;
  // "AMD EPYC, avx2 (native avx512): 256-bit vectors x 16 registers, FMA; L1d 32 KB, L2 1024 KB, ..."
  std::string str() const;
  // The CPU model and ISA, which compiled kernels and BEAM's choices are valid for.
  std::string key() const { return model + "|" + isa; }
};

CpuInfo parse_cpuinfo(const std::string& text);
// A cache size as sysfs writes it ("32K", "1024K", "2M", "1048576"); 0 when unreadable.
int64_t parse_cache_size(const std::string& text);
// The caches under a sysfs cache directory (/sys/devices/system/cpu/cpu0/cache: index*/level,
// type, size); a size it cannot read keeps its default.
CacheSizes read_cache_sizes(const std::string& cache_dir);
// The best ISA the flags allow: "avx512" (F, VL, BW, DQ and FMA), "avx2" (with FMA), "sse2" (any
// x86-64) or "generic" (another architecture).
std::string best_isa(const std::set<std::string>& flags);
// The description of a CPU with `info` and `caches`, its kernels restricted to `isa_knob`
// ("native" or an ISA name). Throws tg::Error naming both ISAs where the CPU lacks the one asked.
CpuHost describe_cpu(const CpuInfo& info, const CacheSizes& caches, const std::string& isa_knob);

// This machine under the current CPU_ISA (read once per value of the knob).
const CpuHost& cpu_host();

// LLVM target features for `isa`: the host's feature string with what the ISA lacks turned off
// (AVX-512 and AMX for avx2; AVX too for sse2); unchanged for the native ISA.
std::string llvm_features_for(const std::string& host_features, const CpuHost& host);
// The vector width LLVM's vectorizers should prefer ("prefer-vector-width"): the description's.
std::string llvm_prefer_vector_width(const CpuHost& host);
// Flags the system C compiler gets beside -march=native for the ISA.
std::string cc_isa_flags(const CpuHost& host);

}  // namespace tg
