// Device policy: every choice the scheduler and the kernel optimizer make differently per
// device, in one struct that each runtime fills in (runtime/cpu.cpp, runtime/cuda.cpp,
// runtime/opencl.cpp) and Device::policy() returns. Feature (device.h) says what a device can
// do; DevicePolicy says how its kernels should be laid out. Nothing outside the device layer,
// the scheduler and the codegen pipeline asks which device it is, save conv2d, which reads
// channels_last_convolutions while it builds its graph (Note [convolution layout while building]
// in tensor_nn.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tg {

// How a GPU-style device's kernels map loops onto threads (codegen/gpu_dims.h).
struct GpuLimits {
  int64_t max_local = 256;           // work-items per work-group for elementwise kernels
  int64_t group_threads = 1024;      // most threads sharing one grouped reduction (a power of two)
  int64_t group_min_per_thread = 8;  // ... each of which reduces at least this many elements
  // A reduction (the product of its reduce loops) is grouped when it is at least row_min_length
  // long and its innermost loop is contiguous in memory for every load that moves along it
  // (softmax's and layernorm's rows), when it has at most group_max_outputs outputs and at least
  // group_min_length elements (a single output: lone_min_length), or when it has at most
  // group_long_max_outputs outputs, at least group_long_length elements and loads that are
  // contiguous along its innermost loop (a convolution's weight gradient).
  int64_t row_min_length = 64;  // Note [short rows] in codegen/gpu_dims.cpp
  int64_t group_max_outputs = 1024;
  int64_t group_min_length = 256;
  int64_t lone_min_length = 128;
  int64_t group_long_max_outputs = int64_t{1} << 16;
  int64_t group_long_length = 4096;
  // The most partial sums a split column sum's first stage writes (Note [split column sums] in
  // schedule/split_reduce.cpp).
  int64_t column_partials = int64_t{1} << 17;
  // Local memory the combines of one group may take (all its accumulators), and how many threads
  // share one slot of it (CUDA: a warp, whose partials meet through shuffles first).
  int64_t group_local_bytes = 16384;
  int64_t group_threads_per_slot = 1;
  // Accumulators (threads times accumulators per thread) of one group: 16 per thread of a full
  // group of 1024, so a register tile's lanes leave registers for the loads in flight.
  int64_t group_accumulators = 16384;
  // Elementwise kernels of at least lanes_min_threads * lanes elements give each thread `lanes`
  // elements, a work-group's width apart (Note [elementwise lanes]); 1 turns this off.
  int64_t lanes = 4;
  int64_t lanes_min_threads = int64_t{1} << 18;
  // The widest load or store the renderer emits (CUDA: 16 bytes; 0: none). Where there is one,
  // an elementwise kernel's lanes are neighbouring elements instead, a vector of its narrowest
  // dtype (Note [contiguous lanes] in codegen/gpu_dims.cpp).
  int64_t vector_bytes = 0;
  int max_dims = 3;
  // What a launch may hold (Note [launch limits] in codegen/gpu_dims.cpp): work-items per
  // work-group, per group dimension 2, and groups per dimension 0 and per dimension 1 or 2.
  int64_t max_group_threads = 1024;
  int64_t max_group_z = 64;
  int64_t max_groups_x = 0x7fffffff;
  int64_t max_groups_yz = 65535;
};

// What a CPU-style device's kernels should fit (codegen/opt.h derives register tiles, partial
// sums and cache blocks from it; runtime/cpu_host.h reads it from the host). The defaults are an
// AVX2 core: 16 registers of 256 bits, 32 KB of L1 data cache, 1 MB of L2.
struct CpuLimits {
  int vector_bits = 256;
  int vector_registers = 16;
  int64_t l1d_bytes = int64_t{32} << 10;
  int64_t l2_bytes = int64_t{1} << 20;
  // bfloat16 products through AVX512-BF16 (Note [bf16 dot tiles] in codegen/cpu_dot.cpp): the
  // host has it, CPU_ISA allows AVX-512 and kernels are compiled by LLVM
  bool bf16_dot = false;
  bool operator==(const CpuLimits&) const = default;
};

struct DevicePolicy {
  // GPU-style devices: the optimizer picks register tiles for threads (codegen/opt_gpu.h) and the
  // output loops become thread indices within these limits (codegen/gpu_dims.h). nullopt: a
  // CPU-style device, whose kernels keep their loops (the outermost is split over the thread
  // pool, Note [when to thread] in codegen/linearize.cpp) and whose optimizer picks vector tiles
  // and cache blocks (codegen/opt.h) or searches them (BEAM).
  std::optional<GpuLimits> gpu;
  // CPU-style devices: the vectors, registers and caches its kernels' tiles are chosen for.
  CpuLimits cpu;
  // Note [channel-last convolutions] in tensor_nn.cpp
  bool channels_last_convolutions = false;
  // Note [padded B rows] and Note [transposed B] in schedule/padded_rows.cpp
  bool pad_aliasing_rows = false;
  bool copy_transposed_b = false;
  // Note [split reductions] in schedule/split_reduce.cpp (with SPLIT_REDUCE=1)
  bool split_reductions = false;
  // Note [product operands] in schedule/schedule.cpp: a matrix product's operands are realized
  // into buffers of their own for the generated kernel's register tiles (devices with a matmul
  // library realize them for the library where MATMUL_LIB=1, whatever this says).
  bool realize_product_operands = false;
  // Note [collectives through a device library] in multi.cpp: the library that runs collectives
  // between devices of this kind ("NCCL" on CUDA where libnccl loads), or "" (copy and add kernels).
  std::string collective_library;
  // Note [concatenations stored in place] in schedule/concat_in_place.cpp: the byte alignment a
  // view of a buffer must have for the kernels and the library to be handed it as a buffer of
  // its own (0: any element's offset).
  size_t view_alignment = 0;
};

// The library that the collectives between the devices of a tuple run through: the one every
// device's policy names, or "" (copy and add kernels) when one names none or they differ (a
// mixed tuple). A pure function of the policies (device.h's tuple_collectives asks the devices).
std::string shared_collective_library(const std::vector<const DevicePolicy*>& policies);

}  // namespace tg
