// The CUDA device (CUDA, CUDA:1, ...): the driver API and NVRTC loaded at run time
// (runtime/cuda_api.h), a stream per device, device memory, kernels compiled by NVRTC for the
// card's compute capability and cached on disk, launches with grid and block from the kernel's
// global and local sizes, events for timing. Built when CMake finds the CUDA toolkit headers.
#pragma once
#include <memory>
#include <string>

#include "tinygrad/device.h"

namespace tg {

std::unique_ptr<Device> make_cuda_device(const std::string& name);
// Number of CUDA devices; 0 when CUDA is unavailable here (no driver, no device).
int cuda_device_count();
// Why the CUDA device cannot be opened here ("libcuda.so.1 not found (...)", "no CUDA device"),
// or "" when it can.
std::string cuda_unavailable_reason();
// The decoded name of a driver error code ("CUDA_ERROR_OUT_OF_MEMORY").
std::string cuda_error_name(int code);

// NVRTC compilation, which needs no GPU: source -> a binary for compute capability `cc` (90 for
// sm_90). A cubin when this NVRTC knows the architecture, else PTX for the newest one it knows
// below it (the driver compiles that when the module is loaded). Binaries are cached under
// cache_dir()/cuda, keyed by the source, the target and the NVRTC version. A build failure
// throws a tg::Error with the kernel name, NVRTC's log and the source.
struct CudaBinary {
  std::string image;      // cubin (ELF) or PTX text
  std::string target;     // "sm_90" or "compute_90"
  bool from_cache = false;
};
CudaBinary cuda_compile(const std::string& name, const std::string& source, int cc);
// "NVRTC 13.0", or the reason NVRTC was not found.
std::string nvrtc_description();

}  // namespace tg
