// The backends built into this binary. A new backend adds one line here and one in CMake.
#include "tinygrad/device.h"
#include "tinygrad/runtime/cpu.h"
#ifdef TG_WITH_CUDA
#include "tinygrad/runtime/cuda.h"
#endif
#ifdef TG_WITH_OPENCL
#include "tinygrad/runtime/opencl.h"
#endif

namespace tg {

void register_builtin_devices() {
  register_device("CPU", make_cpu_device);
#ifdef TG_WITH_CUDA
  register_device("CUDA", make_cuda_device);
#endif
#ifdef TG_WITH_OPENCL
  register_device("CL", make_opencl_device);
#endif
}

int device_count(const std::string& base_name) {
#ifdef TG_WITH_CUDA
  if (base_name == "CUDA") return cuda_device_count();
#endif
  for (const std::string& name : registered_devices())
    if (name == base_name) return 1;
  return 0;
}

}  // namespace tg
