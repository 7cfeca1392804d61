// libnccl.so.2 loaded at run time with dlopen, as the CUDA driver is (runtime/cuda_api.h): the
// binary is built against nccl.h but runs where NCCL or a GPU is missing, and says why NCCL is
// unavailable. Every call goes through TG_NCCL, which throws a tg::Error naming the call, NCCL's
// decoded error and the rank. Two users: the CUDA device's collectives between the GPUs of one
// process (runtime/cuda_nccl.cpp) and the nccl process group of the ranks
// (distributed/nccl_backend.cpp); only they and the bench include this header.
#pragma once
#include <nccl.h>

#include <string>

namespace tg::nccl {

#define TG_NCCL_FUNCS(X)                                                                                     \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetLastError) X(ncclGetUniqueId) X(ncclCommInitRankConfig)     \
  X(ncclCommInitAll) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError)           \
  X(ncclCommCount) X(ncclCommUserRank) X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclBroadcast)  \
  X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)

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
// "NCCL 2.28.9 (libnccl.so.2)", or "unavailable: " and the reason. Never throws.
std::string status();
// "2.28.9" from a version code.
std::string version_text(int code);

// "ncclUnhandledCudaError" and friends.
std::string error_name(ncclResult_t r);
void check(ncclResult_t r, const char* call, int rank);

}  // namespace tg::nccl

// TG_NCCL(rank, fn, args...): calls api().fn(args...); on failure throws "nccl: fn failed on rank
// R: ncclUnhandledCudaError (NCCL's text)".
#define TG_NCCL(rank, fn, ...) ::tg::nccl::check(::tg::nccl::api().fn(__VA_ARGS__), #fn, rank)
