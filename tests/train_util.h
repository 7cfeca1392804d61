// Helpers for the suites that compare training runs (test_jit, test_cuda_graph): a bit-for-bit
// comparison of losses and final parameters (and KnobScope, from test_util.h).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "test_util.h"

namespace tg::testutil {

// What a run left: the loss of every step and the model state after the last one.
struct StepResults {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // in state_dict order
};

inline void expect_bit_identical(const StepResults& a, const StepResults& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); i++)
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)), 0)
        << "loss of step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i];
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); i++) {
    ASSERT_EQ(a.params[i].size(), b.params[i].size());
    EXPECT_EQ(std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)), 0)
        << "state tensor " << i << " differs";
  }
}

}  // namespace tg::testutil
