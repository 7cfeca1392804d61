// The CPU device: host memory, kernels compiled by LLVM ORC JIT when built with LLVM (and
// CPU_LLVM=1), otherwise by the system C compiler into shared objects loaded at run time.
#pragma once
#include <memory>
#include <string>

#include "tinygrad/device.h"

namespace tg {

std::unique_ptr<Device> make_cpu_device(const std::string& name);
// Which CPU compiler this build would pick: "llvm" or "cc".
std::string cpu_compiler_kind();
bool built_with_llvm();

// A CPU kernel entry point: void kernel(void** bufs).
class HostProgram : public Program {
 public:
  // bufs, then the [lo, hi) of the kernel's first loop this call runs
  using Entry = void (*)(void**, long long, long long);
  HostProgram(Entry entry, std::shared_ptr<void> keepalive) : entry_(entry), keepalive_(std::move(keepalive)) {}
  std::optional<double> launch(const std::vector<void*>& buffers, const std::vector<int64_t>& global_size,
                               const std::vector<int64_t>& local_size, bool wait) override;

 private:
  Entry entry_;
  std::shared_ptr<void> keepalive_;  // the loaded library or JIT module
};

// 64-bit FNV-1a, for cache keys that must be stable across runs.

}  // namespace tg
