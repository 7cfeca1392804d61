// A stand-in for a device whose products run through its library, for scheduling only (nothing
// is run on it but copies): CPU memory, a GPU-style policy, Feature::MatmulLibrary. Tests of what
// a GPU's schedule holds (its library operands, the buffers it writes) use it on machines
// without a GPU.
#pragma once
#include <memory>
#include <string>

#include "tinygrad/device.h"
#include "tinygrad/runtime/cpu.h"

namespace tg::testutil {

class LibraryDevice : public Device {
 public:
  explicit LibraryDevice(const std::string& name) : Device(name), cpu_(make_cpu_device(name)) {
    policy_.gpu = GpuLimits{};
  }
  Allocator& allocator() override { return cpu_->allocator(); }
  const Renderer& renderer() const override { return cpu_->renderer(); }
  Compiler& compiler() override { return cpu_->compiler(); }
  bool supports(Feature f) const override { return f == Feature::MatmulLibrary || cpu_->supports(f); }
  const DevicePolicy& policy() const override { return policy_; }

 private:
  std::unique_ptr<Device> cpu_;
  DevicePolicy policy_;
};

// The stand-in's name ("LIBSCHED"), registered on first use.
inline const std::string& library_device() {
  static const std::string name = [] {
    register_device("LIBSCHED", [](const std::string& n) { return std::make_unique<LibraryDevice>(n); });
    return std::string("LIBSCHED");
  }();
  return name;
}

}  // namespace tg::testutil
