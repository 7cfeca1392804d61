// Helpers for the suites of several devices in one process (test_multi, test_tp, the CUDA ones):
// the CUDA devices there are, deterministic data, a comparison within a relative bound, and the
// collectives the multi-device rewrite inserted since a point.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/multi.h"

namespace tg::testutil {

// The CUDA devices this binary can use: 0 where it was built without CUDA or has no GPU.
inline int cuda_devices() {
  auto built = registered_devices();
  if (std::find(built.begin(), built.end(), "CUDA") == built.end()) return 0;
  return device_count("CUDA");
}

// n values in [-3, 9] * scale that repeat every 13 elements.
inline std::vector<float> iota(int64_t n, float scale = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[static_cast<size_t>(i)] = scale * static_cast<float>((i * 7) % 13) - 3 * scale;
  return v;
}

// a equals b element by element within rel, relative to max(1, |b|).
inline void expect_near(const std::vector<float>& a, const std::vector<float>& b, double rel = 1e-5) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++)
    EXPECT_NEAR(a[i], b[i], rel * std::max(1.0, std::abs(static_cast<double>(b[i])))) << "at " << i;
}

// The all-reduces, all-gathers, copies and library calls inserted since `before`.
inline MultiStats stats_since(const MultiStats& before) {
  MultiStats now = multi_stats();
  return {now.allreduces - before.allreduces, now.allgathers - before.allgathers, now.copies - before.copies,
          now.library - before.library, now.reduce_scatters - before.reduce_scatters};
}

}  // namespace tg::testutil
