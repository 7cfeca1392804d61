// The CUDA driver API and NVRTC, loaded at run time with dlopen, so one binary runs on machines
// with and without a GPU. The tables hold the functions tinygrad++ calls; every call goes through
// TG_CU / TG_NVRTC, which throw a tg::Error naming the call, the decoded error, where it
// happened and, under mpirun, the rank (process_rank_label). Only the runtime/cuda*.cpp files include this
// header (it includes cuda.h and nvrtc.h).
#pragma once
#include <cuda.h>
#include <nvrtc.h>

#include <string>

namespace tg::cuda {

// Note [versioned driver symbols]: cuda.h maps many names to versioned exports
// (`#define cuMemAlloc cuMemAlloc_v2`). A member declared as `decltype(&cuMemAlloc) cuMemAlloc`
// is renamed by the same macro, so calls through the table reach the member, and TG_STR (which
// expands its argument before stringifying) gives dlsym the exported name the header means.
#define TG_CU_FUNCS(X)                                                                                       \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)   \
  X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                 \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuModuleLoadData)                   \
  X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) X(cuEventCreate) X(cuEventRecord)               \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) X(cuFuncGetAttribute)                       \
  X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamBeginCapture)           \
  X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphExecUpdate) X(cuGraphLaunch) X(cuGraphDestroy)        \
  X(cuGraphExecDestroy) X(cuStreamWaitEvent) X(cuEventQuery) X(cuStreamIsCapturing)                        \
  X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) X(cuMemcpyPeerAsync) X(cuMemcpyDtoDAsync)

#define TG_NVRTC_FUNCS(X)                                                                                    \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcGetNumSupportedArchs) X(nvrtcGetSupportedArchs)               \
  X(nvrtcCreateProgram) X(nvrtcDestroyProgram) X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize)              \
  X(nvrtcGetProgramLog) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)

#define TG_API_MEMBER(fn) decltype(&::fn) fn = nullptr;

struct Driver {
  TG_CU_FUNCS(TG_API_MEMBER)
  std::string path;   // the library that was loaded
  int version = 0;    // cuDriverGetVersion: 13000 for CUDA 13.0
  int devices = 0;    // cuDeviceGetCount after cuInit
};

struct Nvrtc {
  TG_NVRTC_FUNCS(TG_API_MEMBER)
  std::string path;
  int major = 0, minor = 0;  // nvrtcVersion
};

#undef TG_API_MEMBER

// The loaded driver with cuInit done and at least one device, else throws a tg::Error that says
// why CUDA is unavailable ("libcuda.so.1 not found (...)", "no CUDA device (...)").
const Driver& driver();
// NVRTC, else throws a tg::Error saying it was not found and where it was looked for.
const Nvrtc& nvrtc();
// Why driver() / nvrtc() fail, or "" when they work. Never throw.
std::string driver_unavailable_reason();
std::string nvrtc_unavailable_reason();

// Decoded names: "CUDA_ERROR_OUT_OF_MEMORY", "NVRTC_ERROR_COMPILATION".
std::string cu_error_name(int code);
std::string nvrtc_error_name(int code);

void check_cu(CUresult r, const char* call, const std::string& where);
void check_nvrtc(nvrtcResult r, const char* call, const std::string& where);

}  // namespace tg::cuda

// TG_CU(where, fn, args...): calls driver().fn(args...); on failure throws "fn failed:
// CUDA_ERROR_... (description) [where] (rank N)", the rank only under mpirun. TG_NVRTC likewise
// for NVRTC.
#define TG_CU(where, fn, ...) ::tg::cuda::check_cu(::tg::cuda::driver().fn(__VA_ARGS__), #fn, where)
#define TG_NVRTC(where, fn, ...) ::tg::cuda::check_nvrtc(::tg::cuda::nvrtc().fn(__VA_ARGS__), #fn, where)
