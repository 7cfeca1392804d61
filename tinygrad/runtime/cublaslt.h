// Matrix products on CUDA through cuBLASLt (Note [library matmuls] in device.h). libcublasLt is
// opened with dlopen on first use, like the driver (runtime/cuda_api.h), so a binary without it
// still runs: matmuls then stay generated kernels and `cublaslt_description` says why. Needs no
// toolkit header (the stream is the driver's opaque CUstream_st).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "tinygrad/device.h"

struct CUstream_st;

namespace tg {

// "cuBLASLt 13.0.2" when libcublasLt loaded, else why not ("no cuBLASLt: libcublasLt not found
// (tried ...)"); the CUDA device's description includes it.
std::string cublaslt_description();
bool cublaslt_available();  // libcublasLt loaded

// One per CUDA device: the handle and a heuristic workspace (32 MiB from the device's pool).
// Products run on the device's stream, so they order with its kernels and copies and are
// captured with them.
class CublasLt {
 public:
  CublasLt(std::string device, CUstream_st* stream, MemoryPool& pool, std::function<void()> make_current);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  // The program for spec, or nullptr when cuBLASLt is missing or has no algorithm for it.
  std::unique_ptr<Program> matmul(const MatmulSpec& spec);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tg
