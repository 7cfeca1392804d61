// CPU device and the system-C-compiler path for its kernels.
#include "tinygrad/runtime/cpu.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/render_c.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cpu_host.h"
#include "tinygrad/runtime/thread_pool.h"
#ifdef TG_WITH_LLVM
#include "tinygrad/codegen/render_llvm.h"
#include "tinygrad/runtime/cpu_llvm.h"
#endif

namespace tg {

// Splits the first loop (global_size[0] iterations) across the CPU thread pool; an empty
// global_size runs the whole kernel on the calling thread.
std::optional<double> HostProgram::launch(const std::vector<void*>& buffers, const std::vector<int64_t>& global_size,
                                          const std::vector<int64_t>&, bool wait) {
  auto t0 = std::chrono::steady_clock::now();
  void** bufs = const_cast<void**>(buffers.data());
  int64_t n = global_size.empty() ? 0 : global_size[0];
  auto& pool = ThreadPool::cpu();
  int parts = static_cast<int>(std::min<int64_t>(pool.size(), n));
  if (parts <= 1) {
    entry_(bufs, 0, std::numeric_limits<long long>::max());
  } else {
    pool.run(parts, [&](int i) { entry_(bufs, n * i / parts, n * (i + 1) / parts); });
  }
  if (!wait) return std::nullopt;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

// Note [huge pages for large buffers]: a kernel that walks a large buffer along a strided loop
// touches a 4 KB page every step or few (a matmul's A rows 8 KB apart at 2048 columns, the panel
// copy of B reading one run from each row; Note [B panels] in schedule/padded_rows.cpp), more
// pages than the TLBs hold. Buffers of at least LARGE_BUFFER bytes are allocated in whole 2 MB
// pages, aligned to one, and offered to the kernel's transparent huge pages (MADV_HUGEPAGE:
// hosts whose THP setting is "madvise" give them only to memory that asks), so one TLB entry
// covers 512 of the small pages. On the 2-core Intel Xeon the CPU time of a 2048 matmul went
// from 118-126 ms to 112-120 (a 1024 one from 13.3-14.6 to 13.1-14.1), alternated runs.
class HostAllocator : public Allocator {
 public:
  static constexpr size_t HUGE_PAGE = size_t{2} << 20, LARGE_BUFFER = 2 * HUGE_PAGE;
  void* alloc(size_t bytes) override {
    if (bytes < LARGE_BUFFER) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    const size_t whole = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void* p = std::aligned_alloc(HUGE_PAGE, whole);
    if (p) madvise(p, whole, MADV_HUGEPAGE);  // a hint: without THP the pages stay small
    return p;
  }
  void free(void* ptr, size_t) override { std::free(ptr); }
  void copy_in(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_out(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void* host_view(void* ptr) override { return ptr; }
};


// Compiles C with the system compiler into a shared object (cached on disk by source hash).
class SystemCCompiler : public Compiler {
 public:
  std::string cache_key() const override {
    return "cc:" + knobs::CC.get() + " " + flags() + " " + cpu_host().key();
  }

  std::unique_ptr<Program> compile(const std::string& name, const std::string& source) override {
    auto dir = std::filesystem::path(cache_dir()) / "cc";
    std::filesystem::create_directories(dir);
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(stable_hash(cache_key() + source)));
    auto so = dir / (name + "_" + hex + ".so");
    if (!std::filesystem::exists(so)) {
      // write to unique temporaries and rename, so concurrent processes never see half a file
      std::string tmp = (dir / (std::string(hex) + "." + std::to_string(getpid()))).string();
      { std::ofstream(tmp + ".c") << source; }
      std::string cmd = knobs::CC.get() + " " + flags() + " -o " + tmp + ".so " + tmp + ".c 2> " + tmp + ".log";
      int rc = std::system(cmd.c_str());
      std::string log;
      if (rc != 0) {
        std::ifstream in(tmp + ".log");
        log.assign(std::istreambuf_iterator<char>(in), {});
      }
      std::filesystem::remove(tmp + ".c");
      std::filesystem::remove(tmp + ".log");
      // the shell's 127: the configured compiler itself is missing, a setup mistake of the user
      TG_CHECK(!(WIFEXITED(rc) && WEXITSTATUS(rc) == 127), "CC='", knobs::CC.get(),
               "': the C compiler cannot be run (not found?): ", log);
      if (rc != 0)
        throw CompileError(
            name, source,
            detail::cat("CPU kernel '", name, "' failed to compile with '", knobs::CC.get(), "':\n", log));
      std::filesystem::rename(tmp + ".so", so);
    }
    void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    TG_CHECK(lib, "dlopen ", so.string(), ": ", dlerror());
    auto entry = reinterpret_cast<HostProgram::Entry>(dlsym(lib, name.c_str()));
    if (!entry) {
      dlclose(lib);
      throw CompileError(name, source, detail::cat("kernel '", name, "' not found in ", so.string()));
    }
    std::shared_ptr<void> keep(lib, [](void* l) { dlclose(l); });
    return std::make_unique<HostProgram>(entry, std::move(keep));
  }

 private:
  static std::string flags() {
    return "-O2 -march=native" + cc_isa_flags(cpu_host()) +
           " -fno-math-errno -ffp-contract=fast -fPIC -shared -x c";
  }
};

// Note [virtual CPU devices]: "CPU:1", "CPU:2", ... are further CPU devices in one process, so
// that tensors sharded over several devices (tinygrad/multi.h) run on a machine without GPUs.
// Each is a Device of its own with its own memory pool (buffers and their statistics stay apart,
// and copies between them are real copies), but they run on the same cores and render and compile
// with CPU's renderer, compiler and policy: their programs come from CPU's cache, so a kernel is compiled
// once however many devices run it. "CPU:0" is "CPU" itself (canonical_device), which stays the default device.
class CpuDevice : public Device {
 public:
  explicit CpuDevice(const std::string& name) : Device(name) {
    if (name_is_virtual()) return;  // renderer and compiler are CPU's
#ifdef TG_WITH_LLVM
    if (knobs::CPU_LLVM.get()) {
      renderer_ = std::make_unique<LLVMRenderer>();
      compiler_ = make_llvm_compiler();
      compiles_with_llvm_ = true;
      return;
    }
#endif
    renderer_ = std::make_unique<CRenderer>();
    compiler_ = std::make_unique<SystemCCompiler>();
  }
  Allocator& allocator() override { return allocator_; }
  const Renderer& renderer() const override { return renderer_ ? *renderer_ : cpu().renderer(); }
  Compiler& compiler() override { return compiler_ ? *compiler_ : cpu().compiler(); }
  bool supports(Feature f) const override {
    return f == Feature::HostMemory || f == Feature::Timing || f == Feature::Float16 || f == Feature::BFloat16 ||
           f == Feature::AddressableMemory;
  }
  // The scheduler asks for every reduce and kernel of every realize, and policy_for looks the host
  // up by CPU_ISA under locks: each thread keeps the answer until a knob changes.
  const DevicePolicy& policy() const override {
    if (name_is_virtual()) return cpu().policy();
    thread_local const CpuDevice* of = nullptr;
    thread_local uint64_t generation = 0;
    thread_local const DevicePolicy* kept = nullptr;
    const uint64_t now = knob_generation();
    if (of != this || generation != now) {
      kept = &policy_for(cpu_host(), compiles_with_llvm_);
      of = this;
      generation = now;
    }
    return *kept;
  }
  std::string description() const override {
    return name() + " (" + const_cast<CpuDevice*>(this)->compiler().cache_key() + "; " + cpu_host().str() + ")";
  }
  Program& get_program(const std::string& name, const std::string& source) override {
    if (name_is_virtual()) return cpu().get_program(name, source);
    return Device::get_program(name, source);
  }

 private:
  // Kernels keep their loops (vector tiles and cache blocks sized for the host, Note [tiles from
  // the host] in codegen/opt.cpp); convolutions reduce channel-last, large matmuls read B through
  // padded rows, and product operands get buffers of their own. One policy per CPU_ISA and
  // compiler: only LLVM's kernels take bf16 dot tiles (Note [bf16 dot tiles] in codegen/cpu_dot.cpp).
  static const DevicePolicy& policy_for(const CpuHost& host, bool llvm) {
    static std::mutex mu;
    static std::map<std::string, DevicePolicy> policies;  // by the host's ISA and the compiler; entries never move
    std::lock_guard<std::mutex> lock(mu);
    CpuLimits limits = host.limits();
    limits.bf16_dot = limits.bf16_dot && llvm;
    DevicePolicy policy{.gpu = std::nullopt,
                        .cpu = limits,
                        .channels_last_convolutions = true,
                        .pad_aliasing_rows = true,
                        .copy_transposed_b = true,
                        .split_reductions = false,
                        .realize_product_operands = true};
    auto [it, fresh] = policies.try_emplace(host.isa + (llvm ? "/llvm" : "/cc"), policy);
    if (fresh && knobs::DEBUG >= 3)
      std::fprintf(stderr, "cpu host: %s\ncpu tiles: %s\n", host.str().c_str(),
                   cpu_tiles_str(host.limits()).c_str());
    return it->second;
  }
  bool name_is_virtual() const { return name() != "CPU"; }
  // CPU itself, for a virtual device (looked up on first use: the registry is busy while it makes us)
  Device& cpu() const {
    std::call_once(cpu_once_, [this] { cpu_ = &get_device("CPU"); });
    return *cpu_;
  }

  mutable std::once_flag cpu_once_;
  mutable Device* cpu_ = nullptr;
  HostAllocator allocator_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Compiler> compiler_;
  bool compiles_with_llvm_ = false;
};

}  // namespace

bool built_with_llvm() {
#ifdef TG_WITH_LLVM
  return true;
#else
  return false;
#endif
}

std::string cpu_compiler_kind() { return built_with_llvm() && knobs::CPU_LLVM.get() ? "llvm" : "cc"; }

std::unique_ptr<Device> make_cpu_device(const std::string& name) { return std::make_unique<CpuDevice>(name); }

}  // namespace tg
