// For the suites that run on the default device (DEVICE): when that device cannot be opened
// here (no OpenCL platform, say), every test of the binary is skipped with the reason.
#pragma once
#include <gtest/gtest.h>

#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg::testutil {

class DefaultDeviceEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      get_device(default_device());
    } catch (const Error& e) {
      GTEST_SKIP() << "device " << default_device() << " is not available: " << e.what();
    }
  }
};
inline ::testing::Environment* const default_device_environment =
    ::testing::AddGlobalTestEnvironment(new DefaultDeviceEnvironment);

}  // namespace tg::testutil
