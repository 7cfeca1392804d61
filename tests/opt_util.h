// Helpers of the kernel optimizer's tests (test_opt, test_opt_block): the one kernel of a
// tensor, that kernel run with given opts, and close comparison of outputs.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

namespace tg::optutil {

// The one kernel that computes t from realized inputs.
inline ScheduleItem only_kernel(const Tensor& t) {
  auto items = create_schedule({t.uop()});
  EXPECT_EQ(items.size(), 1u);
  return items.at(0);
}

// Runs item's kernel with opts and returns its output.
inline std::vector<float> run_with(const ScheduleItem& item, const std::vector<Opt>& opts) {
  std::vector<DType> dtypes;
  std::vector<void*> ptrs;
  for (auto& b : item.buffers) {
    dtypes.push_back(b->dtype());
    ptrs.push_back(b->ensure_allocated());
  }
  Device& dev = get_device(item.device);
  LoweredKernel k = lower_with_choice(item.ast, dtypes, CodegenTarget::of(dev), KernelChoice::generated(opts));
  dev.get_program(k.kernel.name, k.source).launch(ptrs, k.kernel.global_size, {}, true);
  std::vector<float> out(item.buffers[0]->numel());
  item.buffers[0]->copy_out(out.data(), out.size() * sizeof(float));
  return out;
}

inline void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol = 1e-4) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "at flat " << i;
}

inline Tensor realized_randn(const Shape& s, uint64_t seed) {
  Tensor::manual_seed(seed);
  return Tensor::randn(s).realize();
}

}  // namespace tg::optutil
