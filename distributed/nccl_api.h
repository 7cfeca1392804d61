// libnccl.so.2 loaded at run time with dlopen, as the CUDA driver is (tinygrad/runtime/
// cuda_api.h): the binary is built against nccl.h but runs where NCCL or a GPU is missing, and
// says why NCCL is unavailable. Every call goes through TG_NCCL, which throws a tg::Error naming
// the call, NCCL's decoded error and the rank. Only distributed/nccl*.cpp include this header.
#pragma once
#include <nccl.h>

#include <string>

namespace tg::dist::nccl {

#define TG_NCCL_FUNCS(X)                                                                                     \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetLastError) X(ncclGetUniqueId) X(ncclCommInitRankConfig)     \
  X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclCommCount)            \
  X(ncclCommUserRank) X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclBroadcast) X(ncclSend)       \
  X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)

#define TG_NCCL_MEMBER(fn) decltype(&::fn) fn = nullptr;
struct Api {
  TG_NCCL_FUNCS(TG_NCCL_MEMBER)
  std::string path;  // the library that was loaded
  int version = 0;   // ncclGetVersion: 22809 for 2.28.9
};
#undef TG_NCCL_MEMBER

// The loaded library, else throws a tg::Error saying why NCCL is unavailable.
const Api& api();
// Why api() fails, or "" when it works. Never throws.
std::string unavailable_reason();
// "2.28.9" from a version code.
std::string version_text(int code);

// "ncclUnhandledCudaError" and friends.
std::string error_name(ncclResult_t r);
void check(ncclResult_t r, const char* call, int rank);

}  // namespace tg::dist::nccl

// TG_NCCL(rank, fn, args...): calls api().fn(args...); on failure throws "nccl: fn failed on rank
// R: ncclUnhandledCudaError (NCCL's text)".
#define TG_NCCL(rank, fn, ...) ::tg::dist::nccl::check(::tg::dist::nccl::api().fn(__VA_ARGS__), #fn, rank)
