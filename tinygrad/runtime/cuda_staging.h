// Host <-> device copies through a ring of pinned (page-locked) host memory, asynchronous on the
// device's stream (Note [pinned staging] in cuda_staging.cpp).
#pragma once
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "tinygrad/runtime/cuda_context.h"

namespace tg::cuda {

class PinnedStaging {
 public:
  static constexpr size_t CAPACITY = size_t{16} << 20;

  explicit PinnedStaging(const Context& c) : c_(c) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Queues the copy on the stream and returns as soon as `src` may be reused or freed.
  void copy_in(CUdeviceptr dst, const void* src, size_t bytes);
  // Returns once `dst` holds the data (after the work queued before it on the stream).
  void copy_out(void* dst, CUdeviceptr src, size_t bytes);

 private:
  struct Region {
    size_t begin, end;
    CUevent done;  // recorded after the copy through [begin, end)
  };
  size_t take(size_t bytes);                   // the offset of a free region; waits for copies still using it
  CUevent retire(size_t begin, size_t bytes);  // records that a copy through the region was queued

  const Context& c_;
  std::mutex mu_;
  char* base_ = nullptr;        // CAPACITY bytes of pinned memory, taken on first use
  size_t head_ = 0;             // where the next region starts
  std::deque<Region> pending_;  // oldest first
  std::vector<CUevent> spare_events_;
};

}  // namespace tg::cuda
