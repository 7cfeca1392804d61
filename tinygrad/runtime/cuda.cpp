// CUDA runtime over the driver API (loaded at run time, runtime/cuda_api.h). Each device is the
// primary context of one GPU (shared with other libraries in the process) and one non-blocking
// stream: kernels, copies, allocations and frees run on it in order (Note [stream-ordered
// memory]). Host copies go through pinned staging (runtime/cuda_staging.h). A launch that waits
// brackets the kernel with two events and reports the GPU time between them. TinyJit replays
// run as CUDA graphs (runtime/cuda_graph.h).
#include "tinygrad/runtime/cuda.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tinygrad/codegen/render_cuda.h"
#include "tinygrad/error.h"
#include "tinygrad/runtime/cublaslt.h"
#include "tinygrad/runtime/cuda_api.h"
#include "tinygrad/runtime/cuda_context.h"
#include "tinygrad/runtime/cuda_graph.h"
#include "tinygrad/runtime/cuda_staging.h"
#ifdef TG_WITH_NCCL
#include "tinygrad/runtime/cuda_nccl.h"
#endif

namespace tg {

namespace {

using cuda::driver;
using cuda::nvrtc;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using CudaContext = cuda::Context;

// Note [collectives through a device library] in multi.cpp: NCCL runs the collectives between
// CUDA devices where it loads (runtime/cuda_nccl.h); elsewhere they are copy and add kernels.
std::string nccl_library() {
#ifdef TG_WITH_NCCL
  if (cuda::nccl_available()) return "NCCL";
#endif
  return "";
}

std::string nccl_text() {
#ifdef TG_WITH_NCCL
  return cuda::nccl_description();
#else
  return "copy and add kernels (built without nccl.h)";
#endif
}

// Note [stream-ordered memory]: blocks come from cuMemAllocAsync and go back through
// cuMemFreeAsync on the device's stream, so neither waits for the GPU (cuMemAlloc and cuMemFree
// synchronize the device) and a block given back is reused only after the work queued before
// its free. The memory pool in front (device.h) caches blocks and keeps the statistics; since
// all work is on the one stream, a block it hands out again is likewise touched by no earlier
// kernel after a later one. The driver's pool returns what the cache evicts to the system at the
// next synchronization (release threshold 0, its default). Where the GPU has no memory pools,
// plain cuMemAlloc / cuMemFree.
class CudaAllocator : public Allocator {
 public:
  CudaAllocator(const CudaContext& c, bool stream_ordered) : c_(c), stream_ordered_(stream_ordered), staging_(c) {}
  void* alloc(size_t bytes) override {
    c_.current();
    CUdeviceptr p = 0;
    CUresult r = stream_ordered_ ? driver().cuMemAllocAsync(&p, bytes, c_.stream) : driver().cuMemAlloc(&p, bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;  // the pool frees its cache and tries again
    cuda::check_cu(r, stream_ordered_ ? "cuMemAllocAsync" : "cuMemAlloc",
                   "device " + c_.name + ", " + std::to_string(bytes) + " bytes");
    return reinterpret_cast<void*>(p);
  }
  // Frees run from destructors, which must not throw: a failure here means the context is
  // already broken, and the next checked call reports it.
  void free(void* ptr, size_t) override {
    c_.current();
    auto p = reinterpret_cast<CUdeviceptr>(ptr);
    if (stream_ordered_) driver().cuMemFreeAsync(p, c_.stream);
    else driver().cuMemFree(p);
  }
  void copy_in(void* dst, const void* src, size_t bytes) override {
    staging_.copy_in(reinterpret_cast<CUdeviceptr>(dst), src, bytes);
  }
  void copy_out(void* dst, const void* src, size_t bytes) override {
    staging_.copy_out(dst, reinterpret_cast<CUdeviceptr>(src), bytes);
  }

 private:
  const CudaContext& c_;
  bool stream_ordered_;
  cuda::PinnedStaging staging_;
};

class CudaProgram : public Program {
 public:
  CudaProgram(const CudaContext& c, CUmodule mod, CUfunction fn, std::string name)
      : c_(c), mod_(mod), fn_(fn), name_(std::move(name)) {}
  ~CudaProgram() override {
    if (mod_) driver().cuModuleUnload(mod_);
  }
  std::optional<double> launch(const std::vector<void*>& buffers, const std::vector<int64_t>& global_size,
                               const std::vector<int64_t>& local_size, bool wait) override {
    TG_ASSERT(global_size.size() <= 3, "CUDA kernel '", name_, "' launched with ", global_size.size(), " dimensions");
    c_.current();
    unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    for (size_t d = 0; d < global_size.size(); d++) {
      int64_t l = d < local_size.size() && local_size[d] > 0 ? local_size[d] : 1;
      block[d] = static_cast<unsigned>(l);
      grid[d] = static_cast<unsigned>((global_size[d] + l - 1) / l);
      if (grid[d] == 0) return wait ? std::optional<double>(0.0) : std::nullopt;  // no threads: nothing to run
    }
    std::vector<CUdeviceptr> ptrs(buffers.size());
    std::vector<void*> args(buffers.size());
    for (size_t i = 0; i < buffers.size(); i++) {
      ptrs[i] = reinterpret_cast<CUdeviceptr>(buffers[i]);
      args[i] = &ptrs[i];
    }
    // the launch description is built only for an error: a replay without graphs launches
    // every kernel through here
    auto launch = [&] {
      CUresult r = driver().cuLaunchKernel(fn_, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, c_.stream,
                                           args.data(), nullptr);
      if (r != CUDA_SUCCESS) cuda::check_cu(r, "cuLaunchKernel", where(grid, block));
    };
    if (!wait) {
      launch();
      return std::nullopt;
    }
    return cuda::timed_on_stream(c_.stream, where(grid, block), launch);
  }

 private:
  std::string where(const unsigned* grid, const unsigned* block) const {
    return "kernel " + name_ + ", grid " + std::to_string(grid[0]) + "x" + std::to_string(grid[1]) + "x" +
           std::to_string(grid[2]) + ", block " + std::to_string(block[0]) + "x" + std::to_string(block[1]) + "x" +
           std::to_string(block[2]);
  }
  const CudaContext& c_;
  CUmodule mod_;
  CUfunction fn_;
  std::string name_;
};

class CudaCompiler : public Compiler {
 public:
  CudaCompiler(const CudaContext& c, int cc) : c_(c), cc_(cc) {}
  std::string cache_key() const override { return "cuda:sm_" + std::to_string(cc_) + " " + nvrtc_description(); }
  std::unique_ptr<Program> compile(const std::string& name, const std::string& source) override {
    CudaBinary bin = cuda_compile(name, source, cc_);
    c_.current();
    std::string where = "kernel " + name + ", " + bin.target + " on " + c_.name;
    CUmodule mod = nullptr;
    TG_CU(where, cuModuleLoadData, &mod, bin.image.c_str());
    CUfunction fn = nullptr;
    CUresult r = driver().cuModuleGetFunction(&fn, mod, name.c_str());
    if (r != CUDA_SUCCESS) driver().cuModuleUnload(mod);
    cuda::check_cu(r, "cuModuleGetFunction", where);
    return std::make_unique<CudaProgram>(c_, mod, fn, name);
  }

 private:
  const CudaContext& c_;
  int cc_;
};

// An event recorded on one of the device's streams (Note [streams and events] in device.h).
class CudaEvent : public DeviceEvent {
 public:
  CudaEvent(const CudaContext& c, CUstream stream) : c_(c) {
    c_.current();
    TG_CU(where(), cuEventCreate, &ev_, CU_EVENT_DISABLE_TIMING);
    TG_CU(where(), cuEventRecord, ev_, stream);
  }
  ~CudaEvent() override { driver().cuEventDestroy(ev_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  bool done() override {
    c_.current();
    CUresult r = driver().cuEventQuery(ev_);
    if (r == CUDA_ERROR_NOT_READY) return false;
    cuda::check_cu(r, "cuEventQuery", where());
    return true;
  }
  CUevent handle() const { return ev_; }

 private:
  std::string where() const { return "device " + c_.name + ", stream event"; }
  const CudaContext& c_;
  CUevent ev_ = nullptr;
};

// Note [peer copies between GPUs]: a copy from another GPU of the process (Note [copies between
// devices] in device.cpp) is one cuMemcpyPeerAsync on the destination's stream, so the
// destination's later kernels are ordered after it as after any kernel. The driver copies
// through the GPUs' peer access where cuDeviceCanAccessPeer says they have it (this context's
// access to the source's is enabled before the first copy, cuCtxEnablePeerAccess) and stages
// the bytes itself where they have not; copies need no mapping of the stream-ordered pools'
// memory, so the pools' access (cuMemPoolSetAccess) is left as it is. Around the copy the
// destination's stream waits on an event recorded on the source's stream (the source's bytes
// are written) and the source's stream waits on an event recorded after the copy (the source's
// later kernels, and a block its pool hands out again, come after the read). While the
// destination's stream is being captured into a graph (runtime/cuda_graph.cpp) those waits
// cannot be recorded (an event of a stream outside the capture); the graph makes them around
// its launch. A copy between two buffers of one GPU is a cuMemcpyDtoDAsync on its stream.
class CudaDevice : public Device {
 public:
  CudaDevice(const std::string& name, int ordinal) : Device(name) {
    c_.name = name;
    std::string where = "device " + name;
    TG_CU(where, cuDeviceGet, &dev_, ordinal);
    TG_CU(where, cuDevicePrimaryCtxRetain, &c_.ctx, dev_);
    c_.current();
    TG_CU(where, cuStreamCreate, &c_.stream, CU_STREAM_NON_BLOCKING);
    int major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    int minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    cc_ = major * 10 + minor;
    char dev_name[256] = {};
    TG_CU(where, cuDeviceGetName, dev_name, static_cast<int>(sizeof(dev_name) - 1), dev_);
    size_t mem = 0;
    TG_CU(where, cuDeviceTotalMem, &mem, dev_);
    GpuLimits lim;
    int max_threads = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    while (lim.max_local > max_threads) lim.max_local /= 2;
    while (lim.group_threads > max_threads) lim.group_threads /= 2;
    lim.group_threads_per_slot = CUDARenderer::WARP;  // Note [warp combine] in codegen/render_cuda.cpp
    lim.vector_bytes = CUDARenderer::VECTOR_BYTES;
    lim.column_partials = int64_t{1} << 18;  // Note [split column sums] in schedule/split_reduce.cpp
    lim.max_group_threads = max_threads;
    lim.max_group_z = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    lim.max_groups_x = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    lim.max_groups_yz = std::min(attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y), attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z));
    policy_ = DevicePolicy{.gpu = lim,
                           .channels_last_convolutions = false,
                           .pad_aliasing_rows = false,
                           .split_reductions = true,
                           .realize_product_operands = false,
                           .collective_library = nccl_library(),
                           // cuBLASLt products take views at their real alignment (Note [operands
                           // at any alignment] in cublaslt.cpp); its bias epilogue wants 16 bytes
                           .view_alignment = 16};
    int v = driver().version;
    char buf[1024];
    std::snprintf(buf, sizeof(buf), "%s (%s, sm_%d, %d SMs, %.1f GiB, driver CUDA %d.%d, %s, %s, collectives between GPUs: %s)",
                  name.c_str(), dev_name, cc_, attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                  static_cast<double>(mem) / (1 << 30), v / 1000, v % 1000 / 10, nvrtc_description().c_str(),
                  cublaslt_description().c_str(), nccl_text().c_str());
    desc_ = buf;
    renderer_ = std::make_unique<CUDARenderer>();
    bool pools = attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) != 0;
    allocator_ = std::make_unique<CudaAllocator>(c_, pools);
    compiler_ = std::make_unique<CudaCompiler>(c_, cc_);
    lt_ = std::make_unique<CublasLt>(name, c_.stream, pool(), [this] { c_.current(); });
  }
  Allocator& allocator() override { return *allocator_; }
  const Renderer& renderer() const override { return *renderer_; }
  Compiler& compiler() override { return *compiler_; }
  void synchronize() override {
    c_.current();
    if (host_wait_limit() <= 0) return TG_CU("device " + name(), cuStreamSynchronize, c_.stream);
    CudaEvent ev(c_, c_.stream);  // Note [host waits with a deadline]
    cuda::wait_for_event(ev.handle(), "device " + name() + ", synchronize");
  }
  bool supports(Feature f) const override {
    if (f == Feature::MatmulLibrary) return cublaslt_available();
    if (f == Feature::TensorCores) return cc_ >= 80;
    return f == Feature::Timing || f == Feature::Float16 || f == Feature::BFloat16 || f == Feature::NativeTranscendentals ||
           f == Feature::AddressableMemory || f == Feature::Streams || f == Feature::PeerCopy;
  }
  // Note [peer copies between GPUs]
  void copy_from(void* dst, Device& from, const void* src, size_t bytes) override {
    auto* peer = dynamic_cast<CudaDevice*>(&from);
    TG_ASSERT(peer, name(), " copies on the devices only from CUDA devices, not from ", from.name());
    const std::string where = "copy " + from.name() + " -> " + name() + ", " + std::to_string(bytes) + " bytes";
    const auto d = reinterpret_cast<CUdeviceptr>(dst);
    const auto s = reinterpret_cast<CUdeviceptr>(src);
    c_.current();
    if (peer == this) return TG_CU(where, cuMemcpyDtoDAsync, d, s, bytes, c_.stream);
    enable_peer_access(*peer);
    const bool joined = !capturing();  // a graph joins the two devices around its launch
    if (joined) wait_event(StreamKind::Compute, *peer->record_event(StreamKind::Compute));
    c_.current();
    TG_CU(where, cuMemcpyPeerAsync, d, c_.ctx, s, peer->c_.ctx, bytes, c_.stream);
    if (joined) peer->wait_event(StreamKind::Compute, *record_event(StreamKind::Compute));
  }
  std::string peer_route(Device& from) override {
    auto* peer = dynamic_cast<CudaDevice*>(&from);
    if (!peer || peer == this) return "";
    return can_access(*peer) ? "direct access" : "staged by the driver";
  }
  std::shared_ptr<DeviceEvent> record_event(StreamKind s) override {
    return std::make_shared<CudaEvent>(c_, stream(s));
  }
  void wait_event(StreamKind s, const DeviceEvent& e) override {
    c_.current();
    TG_CU("device " + name() + ", stream wait", cuStreamWaitEvent, stream(s),
          static_cast<const CudaEvent&>(e).handle(), 0);
  }
  void* native_stream(StreamKind s) override { return stream(s); }
  bool capturing() const override {
    c_.current();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    TG_CU("device " + name(), cuStreamIsCapturing, c_.stream, &status);
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }
  void make_current() override { c_.current(); }
  const DevicePolicy& policy() const override { return policy_; }
  std::string description() const override { return desc_; }
  const CudaContext& context() const { return c_; }

 protected:
  std::unique_ptr<Program> make_matmul_program(const MatmulSpec& spec) override { return lt_->matmul(spec); }

 private:
  // The communication stream is made on first use: a device that runs no collective has one stream.
  CUstream stream(StreamKind s) {
    if (s == StreamKind::Compute) return c_.stream;
    std::call_once(comm_once_, [this] {
      c_.current();
      TG_CU("device " + name(), cuStreamCreate, &comm_stream_, CU_STREAM_NON_BLOCKING);
    });
    return comm_stream_;
  }
  // cuDeviceCanAccessPeer: this GPU can reach `peer`'s memory directly (NVLink or PCIe).
  bool can_access(const CudaDevice& peer) const {
    int v = 0;
    TG_CU("device " + name() + ", peer " + peer.name(), cuDeviceCanAccessPeer, &v, dev_, peer.dev_);
    return v != 0;
  }
  // Once per peer: this context's access to the peer's context, where the GPUs have it.
  void enable_peer_access(const CudaDevice& peer) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (!peers_asked_.insert(&peer).second || !can_access(peer)) return;
    c_.current();
    CUresult r = driver().cuCtxEnablePeerAccess(peer.c_.ctx, 0);
    if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return;  // by another library on the shared context
    cuda::check_cu(r, "cuCtxEnablePeerAccess", "device " + name() + ", peer " + peer.name());
  }
  int attribute(CUdevice_attribute a) const {
    int v = 0;
    TG_CU("device " + name(), cuDeviceGetAttribute, &v, a, dev_);
    return v;
  }
  CudaContext c_;
  CUstream comm_stream_ = nullptr;
  std::once_flag comm_once_;
  std::mutex peers_mu_;
  std::set<const CudaDevice*> peers_asked_;  // peers whose access enable_peer_access has settled
  CUdevice dev_ = 0;
  int cc_ = 0;
  std::string desc_;
  DevicePolicy policy_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Compiler> compiler_;
  std::unique_ptr<CublasLt> lt_;  // destroyed before the pool its workspace came from
};

}  // namespace

namespace cuda {

namespace {
thread_local CUcontext current_ctx = nullptr;  // what this thread last made current
}  // namespace

void Context::current() const {
  if (current_ctx == ctx) return;
  TG_CU("device " + name, cuCtxSetCurrent, ctx);
  current_ctx = ctx;
}

void Context::forget_current() { current_ctx = nullptr; }

void wait_for_event(CUevent ev, const std::string& where) {
  const double limit = host_wait_limit();
  if (limit <= 0) return check_cu(driver().cuEventSynchronize(ev), "cuEventSynchronize", where);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    CUresult r = driver().cuEventQuery(ev);
    if (r != CUDA_ERROR_NOT_READY) return check_cu(r, "cuEventQuery", where);
    auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    TG_CHECK(waited <= limit, where, ": the host waited ", limit, " s for the GPU (the host wait limit, from ",
             "distributed.timeout_s): work queued before it never finished (a collective whose peer is gone?)");
    if (waited < 1e-3) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

double timed_on_stream(CUstream stream, const std::string& where, const std::function<void()>& run) {
  struct Events {  // destroyed however the timing ends
    CUevent start = nullptr, end = nullptr;
    ~Events() {
      if (start) driver().cuEventDestroy(start);
      if (end) driver().cuEventDestroy(end);
    }
  } ev;
  TG_CU(where, cuEventCreate, &ev.start, CU_EVENT_DEFAULT);
  TG_CU(where, cuEventCreate, &ev.end, CU_EVENT_DEFAULT);
  TG_CU(where, cuEventRecord, ev.start, stream);
  run();
  TG_CU(where, cuEventRecord, ev.end, stream);
  TG_CU(where, cuEventSynchronize, ev.end);
  float ms = 0;
  TG_CU(where, cuEventElapsedTime, &ms, ev.start, ev.end);
  return ms * 1e-3;
}

const Context& context_of(const std::string& device) {
  auto* d = dynamic_cast<CudaDevice*>(&get_device(device));
  TG_ASSERT(d, "device ", device, " is not a CUDA device");
  return d->context();
}

}  // namespace cuda

std::string nvrtc_description() {
  std::string why = cuda::nvrtc_unavailable_reason();
  if (!why.empty()) return why;
  auto& nv = nvrtc();
  return "NVRTC " + std::to_string(nv.major) + "." + std::to_string(nv.minor);
}

CudaBinary cuda_compile(const std::string& name, const std::string& source, int cc) {
  const auto& nv = nvrtc();
  int n = 0;
  TG_NVRTC("kernel " + name, nvrtcGetNumSupportedArchs, &n);
  std::vector<int> archs(static_cast<size_t>(n));
  TG_NVRTC("kernel " + name, nvrtcGetSupportedArchs, archs.data());
  int best = 0;
  std::string known;
  for (int a : archs) {
    if (a <= cc && a > best) best = a;
    known += (known.empty() ? "sm_" : ", sm_") + std::to_string(a);
  }
  TG_CHECK(best > 0, "CUDA kernel '", name, "': ", nvrtc_description(), " cannot compile for sm_", cc, " (it knows ", known, ")");
  CudaBinary out;
  bool cubin = best == cc;
  out.target = (cubin ? "sm_" : "compute_") + std::to_string(best);
  std::vector<std::string> options = {"--gpu-architecture=" + out.target};

  std::string key = out.target + "\n" + nvrtc_description();
  for (auto& o : options) key += " " + o;
  auto dir = std::filesystem::path(cache_dir()) / "cuda";
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(stable_hash(key + "\n" + source)));
  auto file = dir / (name + "_" + hex + (cubin ? ".cubin" : ".ptx"));
  if (std::filesystem::exists(file)) {
    out.image = read_file(file);
    out.from_cache = !out.image.empty();
    if (out.from_cache) return out;
  }

  nvrtcProgram prog = nullptr;
  TG_NVRTC("kernel " + name, nvrtcCreateProgram, &prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
  std::vector<const char*> opts;
  for (auto& o : options) opts.push_back(o.c_str());
  nvrtcResult r = nv.nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  if (r != NVRTC_SUCCESS) {
    size_t len = 0;
    std::string log;
    if (nv.nvrtcGetProgramLogSize(prog, &len) == NVRTC_SUCCESS && len > 1) {
      log.resize(len);
      nv.nvrtcGetProgramLog(prog, log.data());
      log.pop_back();  // the terminating NUL
    }
    nv.nvrtcDestroyProgram(&prog);
    throw CompileError(name, source,
                       detail::cat("CUDA kernel '", name, "' failed to build for ", out.target, " (",
                                   cuda::nvrtc_error_name(r), "):\n", log));
  }
  size_t size = 0;
  try {
    if (cubin) {
      TG_NVRTC("kernel " + name, nvrtcGetCUBINSize, prog, &size);
      out.image.resize(size);
      TG_NVRTC("kernel " + name, nvrtcGetCUBIN, prog, out.image.data());
    } else {
      TG_NVRTC("kernel " + name, nvrtcGetPTXSize, prog, &size);
      out.image.resize(size);
      TG_NVRTC("kernel " + name, nvrtcGetPTX, prog, out.image.data());  // NUL-terminated text
    }
  } catch (...) {
    nv.nvrtcDestroyProgram(&prog);
    throw;
  }
  nv.nvrtcDestroyProgram(&prog);

  // write a unique temporary and rename it, so concurrent processes never read half a file
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto tmp = dir / (std::string(hex) + "." + std::to_string(getpid()) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(out.image.data(), static_cast<std::streamsize>(out.image.size()));
  }
  std::filesystem::rename(tmp, file, ec);  // a cache that cannot be written only costs a compile
  if (ec) std::filesystem::remove(tmp, ec);
  return out;
}

int cuda_device_count() {
  if (!cuda::driver_unavailable_reason().empty()) return 0;
  return driver().devices;
}

std::string cuda_unavailable_reason() {
  std::string why = cuda::driver_unavailable_reason();
  return why.empty() ? cuda::nvrtc_unavailable_reason() : why;
}

std::string cuda_error_name(int code) { return cuda::cu_error_name(code); }

std::unique_ptr<Device> make_cuda_device(const std::string& name) {
  auto colon = name.find(':');
  int index = 0;
  if (colon != std::string::npos) {
    std::string num = name.substr(colon + 1);
    TG_CHECK(!num.empty() && num.size() < 6 && num.find_first_not_of("0123456789") == std::string::npos, "device '",
             name, "': expected CUDA or CUDA:<index>");
    index = std::stoi(num);
  }
  std::string why = cuda_unavailable_reason();
  TG_CHECK(why.empty(), "device '", name, "': ", why);
  int count = cuda_device_count();
  TG_CHECK(index < count, "device '", name, "': only ", count, " CUDA device(s) found (CUDA",
           count > 1 ? " .. CUDA:" + std::to_string(count - 1) : std::string(), ")");
  static std::once_flag graphs;
  std::call_once(graphs, [] {
    cuda::register_cuda_graphs();
#ifdef TG_WITH_NCCL
    cuda::register_nccl_collectives();
#endif
  });
  return std::make_unique<CudaDevice>(name, index);
}

}  // namespace tg
