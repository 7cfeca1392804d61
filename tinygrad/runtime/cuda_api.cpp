// Loading the CUDA driver (libcuda.so.1) and NVRTC with dlopen, once, and decoding their errors.
// A failed load is remembered with its reason, which every later lookup reports.
#include "tinygrad/runtime/cuda_api.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "tinygrad/error.h"

namespace tg::cuda {

namespace {

#define TG_STR2(x) #x
#define TG_STR(x) TG_STR2(x)

// Resolves every listed symbol of `lib`; returns the first one missing, or "".
#define TG_RESOLVE(fn)                                                         \
  if (missing.empty()) {                                                       \
    table.fn = reinterpret_cast<decltype(table.fn)>(dlsym(lib, TG_STR(fn)));   \
    if (!table.fn) missing = TG_STR(fn);                                       \
  }

struct DriverState {
  Driver api;
  std::string reason;  // why it is unavailable, "" when it works
};

DriverState load_driver() {
  DriverState s;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    s.reason = std::string("libcuda.so.1 not found (") + (err ? err : "dlopen failed") +
               "); the NVIDIA driver is not installed or not on the library path";
    return s;
  }
  Driver& table = s.api;
  std::string missing;
  TG_CU_FUNCS(TG_RESOLVE)
  if (!missing.empty()) {
    s.reason = "libcuda.so.1 lacks " + missing + " (driver older than the CUDA " +
               std::to_string(CUDA_VERSION / 1000) + " headers this build used)";
    return s;
  }
  s.api.path = "libcuda.so.1";
  CUresult r = s.api.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    s.api.cuGetErrorName(r, &name);
    std::string n = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
    s.reason = r == CUDA_ERROR_NO_DEVICE ? "no CUDA device (cuInit: " + n + ")" : "cuInit failed: " + n;
    return s;
  }
  s.api.cuDriverGetVersion(&s.api.version);
  s.api.cuDeviceGetCount(&s.api.devices);
  if (s.api.devices == 0) s.reason = "no CUDA device (cuDeviceGetCount returned 0)";
  return s;
}

const DriverState& driver_state() {
  static DriverState* s = new DriverState(load_driver());  // leaked: used until exit
  return *s;
}

struct NvrtcState {
  Nvrtc api;
  std::string reason;
};

// Note [finding NVRTC]: the library path first (LD_LIBRARY_PATH, ldconfig), under the names of
// this toolkit's major version and then unversioned; then CUDA_PATH's lib64; then the toolkit
// this build was configured with; then /usr/local/cuda. NVRTC finds its builtins library beside
// itself.
std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> c = {"libnvrtc.so." + std::to_string(CUDA_VERSION / 1000), "libnvrtc.so"};
  if (const char* p = std::getenv("CUDA_PATH"); p && *p) c.push_back(std::string(p) + "/lib64/libnvrtc.so");
#ifdef TG_CUDA_TOOLKIT_LIBDIR
  c.push_back(std::string(TG_CUDA_TOOLKIT_LIBDIR) + "/libnvrtc.so");
#endif
  c.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  return c;
}

NvrtcState load_nvrtc() {
  NvrtcState s;
  void* lib = nullptr;
  std::string tried;
  for (auto& name : nvrtc_candidates()) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      s.api.path = name;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (!lib) {
    s.reason = "NVRTC not found (tried " + tried + "); install the CUDA toolkit or set CUDA_PATH";
    return s;
  }
  Nvrtc& table = s.api;
  std::string missing;
  TG_NVRTC_FUNCS(TG_RESOLVE)
  if (!missing.empty()) {
    s.reason = s.api.path + " lacks " + missing;
    return s;
  }
  s.api.nvrtcVersion(&s.api.major, &s.api.minor);
  // NVRTC opens its builtins library by name when it first compiles; where its directory is not
  // on the library path, loading it from beside NVRTC first lets that lookup find it by soname.
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) {
    std::string dir = map->l_name;
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    std::string builtins = dir + "libnvrtc-builtins.so." + std::to_string(s.api.major) + "." + std::to_string(s.api.minor);
    dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL);  // a failure leaves NVRTC's own lookup
  }
  return s;
}

#undef TG_RESOLVE

const NvrtcState& nvrtc_state() {
  static NvrtcState* s = new NvrtcState(load_nvrtc());
  return *s;
}

}  // namespace

const Driver& driver() {
  const auto& s = driver_state();
  TG_CHECK(s.reason.empty(), "CUDA is unavailable: ", s.reason);
  return s.api;
}

const Nvrtc& nvrtc() {
  const auto& s = nvrtc_state();
  TG_CHECK(s.reason.empty(), "CUDA is unavailable: ", s.reason);
  return s.api;
}

std::string driver_unavailable_reason() { return driver_state().reason; }
std::string nvrtc_unavailable_reason() { return nvrtc_state().reason; }

// Through the driver when it loaded; else a table of the codes met most often.
std::string cu_error_name(int code) {
  const auto& s = driver_state();
  if (s.api.cuGetErrorName) {
    const char* name = nullptr;
    if (s.api.cuGetErrorName(static_cast<CUresult>(code), &name) == CUDA_SUCCESS && name) return name;
    return "CUDA error " + std::to_string(code);
  }
  switch (code) {
#define E(x) case x: return #x;
    E(CUDA_SUCCESS) E(CUDA_ERROR_INVALID_VALUE) E(CUDA_ERROR_OUT_OF_MEMORY) E(CUDA_ERROR_NOT_INITIALIZED)
    E(CUDA_ERROR_DEINITIALIZED) E(CUDA_ERROR_NO_DEVICE) E(CUDA_ERROR_INVALID_DEVICE) E(CUDA_ERROR_INVALID_IMAGE)
    E(CUDA_ERROR_INVALID_CONTEXT) E(CUDA_ERROR_NO_BINARY_FOR_GPU) E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    E(CUDA_ERROR_INVALID_PTX) E(CUDA_ERROR_NOT_FOUND) E(CUDA_ERROR_ILLEGAL_ADDRESS)
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) E(CUDA_ERROR_LAUNCH_TIMEOUT) E(CUDA_ERROR_LAUNCH_FAILED)
    E(CUDA_ERROR_INVALID_HANDLE) E(CUDA_ERROR_UNKNOWN)
#undef E
    default: return "CUDA error " + std::to_string(code);
  }
}

std::string nvrtc_error_name(int code) {
  const auto& s = nvrtc_state();
  if (s.api.nvrtcGetErrorString) return s.api.nvrtcGetErrorString(static_cast<nvrtcResult>(code));
  return "NVRTC error " + std::to_string(code);
}

void check_cu(CUresult r, const char* call, const std::string& where) {
  if (r == CUDA_SUCCESS) return;
  std::string desc;
  if (const auto& s = driver_state(); s.api.cuGetErrorString) {
    const char* d = nullptr;
    if (s.api.cuGetErrorString(r, &d) == CUDA_SUCCESS && d) desc = std::string(" (") + d + ")";
  }
  TG_FAIL(call, " failed: ", cu_error_name(static_cast<int>(r)), desc,
          where.empty() ? "" : " [" + where + "]", process_rank_label());
}

void check_nvrtc(nvrtcResult r, const char* call, const std::string& where) {
  if (r == NVRTC_SUCCESS) return;
  TG_FAIL(call, " failed: ", nvrtc_error_name(static_cast<int>(r)), where.empty() ? "" : " [" + where + "]",
          process_rank_label());
}

}  // namespace tg::cuda
