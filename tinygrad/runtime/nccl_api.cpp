// Loading libnccl.so.2 with dlopen, once, and decoding its errors (see nccl_api.h).
#include "tinygrad/runtime/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>

#include <vector>

#include "tinygrad/error.h"

namespace tg::nccl {

namespace {

struct State {
  Api api;
  std::string reason;  // why it is unavailable, "" when it works
};

// Note [finding NCCL]: the library path first (LD_LIBRARY_PATH, ldconfig), then CUDA_PATH's
// lib64, then the toolkit this build was configured with, then /usr/local/cuda: NVIDIA's packages
// put libnccl.so.2 in either place.
std::vector<std::string> candidates() {
  std::vector<std::string> c = {"libnccl.so.2"};
  if (const char* p = std::getenv("CUDA_PATH"); p && *p) c.push_back(std::string(p) + "/lib64/libnccl.so.2");
#ifdef TG_CUDA_TOOLKIT_LIBDIR
  c.push_back(std::string(TG_CUDA_TOOLKIT_LIBDIR) + "/libnccl.so.2");
#endif
  c.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  return c;
}

#define TG_STR2(x) #x
#define TG_STR(x) TG_STR2(x)
#define TG_RESOLVE(fn)                                                            \
  if (missing.empty()) {                                                          \
    s.api.fn = reinterpret_cast<decltype(s.api.fn)>(dlsym(lib, TG_STR(fn)));      \
    if (!s.api.fn) missing = TG_STR(fn);                                          \
  }

State load() {
  State s;
  void* lib = nullptr;
  std::string tried, last_error;
  for (const std::string& path : candidates()) {
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      s.api.path = path;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + path;
    if (const char* e = dlerror()) last_error = e;
  }
  if (!lib) {
    s.reason = "libnccl.so.2 not found (tried " + tried + "; " + last_error + ")";
    return s;
  }
  std::string missing;
  TG_NCCL_FUNCS(TG_RESOLVE)
  if (!missing.empty()) {
    s.reason = s.api.path + " lacks " + missing + " (NCCL older than the " + version_text(NCCL_VERSION_CODE) +
               " headers this build used)";
    return s;
  }
  s.api.ncclGetVersion(&s.api.version);
  return s;
}

const State& state() {
  static State* s = new State(load());  // leaked: used until exit
  return *s;
}

}  // namespace

std::string version_text(int code) {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

const Api& api() {
  const State& s = state();
  TG_CHECK(s.reason.empty(), "nccl: ", s.reason);
  return s.api;
}

std::string unavailable_reason() { return state().reason; }

std::string status() {
  std::string why = unavailable_reason();
  if (!why.empty()) return "unavailable: " + why;
  return "NCCL " + version_text(api().version) + " (" + api().path + ")";
}

std::string error_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult " + std::to_string(static_cast<int>(r));
  }
}

void check(ncclResult_t r, const char* call, int rank) {
  if (r == ncclSuccess || r == ncclInProgress) return;  // non-blocking communicators answer InProgress
  const Api& a = api();
  std::string text = a.ncclGetErrorString(r);
  const char* last = a.ncclGetLastError(nullptr);
  throw Error(std::string("nccl: ") + call + " failed on rank " + std::to_string(rank) + ": " + error_name(r) + " (" +
              text + (last && *last ? std::string("; ") + last : std::string()) + ")");
}

}  // namespace tg::nccl
