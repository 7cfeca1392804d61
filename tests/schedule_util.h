// Helpers shared by the scheduler's test files: how many kernels a schedule runs, and how many
// buffers of a size and dtype it writes.
#pragma once
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

namespace tg::testutil {

// The kernels (not copies or collectives) of the one schedule that computes every tensor of `ts`.
inline size_t kernels(const Tensors& ts) {
  std::vector<UOpPtr> outs;
  for (auto& t : ts) outs.push_back(t.uop());
  size_t n = 0;
  for (auto& item : create_schedule(outs)) n += item.kind == ScheduleItem::Kind::Kernel;
  return n;
}

// The buffers the schedule of `t` writes (each kernel's first output) that hold `numel` elements
// of `dtype`.
inline size_t written_buffers(const Tensor& t, int64_t numel, DType dtype) {
  size_t n = 0;
  for (auto& item : create_schedule({t.uop()}))
    n += item.buffers[0]->numel() == numel && item.buffers[0]->dtype() == dtype;
  return n;
}

}  // namespace tg::testutil
