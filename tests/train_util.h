// Helpers for the suites that compare training runs (test_jit, test_cuda_graph, test_dist_mpi,
// test_fsdp): a bit-for-bit comparison of losses and final parameters, the largest relative
// difference of two parameter lists, a seeded global batch (and KnobScope, from test_util.h).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "test_util.h"
#include "tinygrad/tensor.h"

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

// Largest relative difference between two parameter lists (relative to max(1e-3, |b|)).
inline double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); i++)
    for (size_t j = 0; j < a[i].size(); j++)
      worst = std::max(worst, std::abs(double(a[i][j]) - b[i][j]) / std::max(1e-3, std::abs(double(b[i][j]))));
  return worst;
}

// Step s's global batch of b rows of `in` features and labels in [0, 5): the same on every rank
// (seeded by s).
inline std::pair<Tensor, Tensor> global_batch(int s, int64_t b, int64_t in = 12) {
  Tensor::manual_seed(1000 + s);
  Tensor x = Tensor::randn({b, in});
  Tensor y = Tensor::randint({b}, 0, 5);
  x.realize();
  y.realize();
  return {x, y};
}

}  // namespace tg::testutil
