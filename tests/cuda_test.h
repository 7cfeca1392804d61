// The fixture of the suites that need a CUDA GPU: skipped with the reason where there is none;
// the tests run with CUDA as the default device.
#pragma once
#include <gtest/gtest.h>

#include <optional>

#include "test_util.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cuda.h"

namespace tg::testutil {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0 || !cuda_unavailable_reason().empty())
      GTEST_SKIP() << "CUDA is not available here: " << cuda_unavailable_reason();
    device_.emplace(knobs::DEVICE, "CUDA");
  }
  std::optional<KnobScope<StringKnob>> device_;  // Note [knobs in tests]
};

}  // namespace tg::testutil
