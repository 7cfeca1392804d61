// The backends built into this binary. A new backend adds one line here and one in CMake.
#include "tinygrad/device.h"
#include "tinygrad/runtime/cpu.h"

namespace tg {

void register_builtin_devices() {
  register_device("CPU", make_cpu_device);
}

}  // namespace tg
