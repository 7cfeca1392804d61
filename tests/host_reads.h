// A counter of host reads of device data (Tensor::item, to_vector) for tests that assert where a
// step waits for the device: each read is a synchronization on a GPU (Note [tensor observers]
// in tinygrad/engine/observe.h tells how the tensor front end reports them).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

#include "tinygrad/engine/observe.h"

namespace tg::testutil {

// Counts every host read in the process while it lives.
class HostReads : public TensorObserver {
 public:
  HostReads() { add_tensor_observer(this); }
  ~HostReads() override { remove_tensor_observer(this); }
  HostReads(const HostReads&) = delete;
  HostReads& operator=(const HostReads&) = delete;
  void on_assign(const Tensor&, const std::shared_ptr<Buffer>&, const std::shared_ptr<Buffer>&) override {}
  void on_host_read(const Tensor&) override { count_++; }
  int64_t count() const { return count_; }

 private:
  std::atomic<int64_t> count_{0};
};

}  // namespace tg::testutil
