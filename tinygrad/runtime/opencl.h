// The OpenCL device (CL, CL:1, ...) over the ICD loader: buffers, program builds, launches with
// global and local sizes, events for timing. Built when CMake finds OpenCL.
#pragma once
#include <memory>
#include <string>

#include "tinygrad/device.h"

namespace tg {

std::unique_ptr<Device> make_opencl_device(const std::string& name);
// The decoded name of an OpenCL error code ("CL_OUT_OF_RESOURCES").
std::string cl_error_name(int code);
// Number of OpenCL devices over all platforms (0 when there is no platform).
int opencl_device_count();

}  // namespace tg
