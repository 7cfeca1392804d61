// Pinned staging for host <-> device copies (cuda_staging.h).
#include "tinygrad/runtime/cuda_staging.h"

#include <algorithm>
#include <cstring>

#include "tinygrad/error.h"

namespace tg::cuda {

// Note [pinned staging]: a copy from pageable host memory cannot run asynchronously (the driver
// stages it itself and returns only when the host memory may be reused), and copy_in used to wait
// for the whole stream after each copy. So the device keeps one ring of pinned memory. copy_in
// copies the host data into the next free region of the ring, queues the DMA from there on the
// stream, records an event behind it and returns: the caller's buffer is free at once, and the
// host runs ahead of the GPU (the optimizer's per-step scalars written before a replay no longer
// wait for the previous step). Regions are handed out in order around the ring, so the copies
// still using the region asked for are the oldest pending ones: take() waits for those events
// only. A copy larger than half the ring goes in chunks of half the ring, so the host fills one
// half while the other is being copied. copy_out goes the other way, chunk by chunk, and returns
// once the last chunk is in the caller's memory.

namespace {
constexpr size_t CHUNK = PinnedStaging::CAPACITY / 2;
}

PinnedStaging::~PinnedStaging() {
  // Devices live until exit; a failure here cannot be reported and changes nothing.
  for (auto& r : pending_) driver().cuEventDestroy(r.done);
  for (auto e : spare_events_) driver().cuEventDestroy(e);
  if (base_) driver().cuMemFreeHost(base_);
}

size_t PinnedStaging::take(size_t bytes) {
  TG_ASSERT(bytes > 0 && bytes <= CAPACITY, "staging region of ", bytes, " bytes");
  if (!base_) {
    void* p = nullptr;
    TG_CU("device " + c_.name + ", pinned staging of " + std::to_string(CAPACITY) + " bytes", cuMemHostAlloc,
          &p, CAPACITY, 0);
    base_ = static_cast<char*>(p);
  }
  size_t begin = head_ + bytes <= CAPACITY ? head_ : 0;
  bool wrapped = begin != head_;  // [head_, CAPACITY) is skipped this time round
  auto in_use = [&](const Region& r) {
    return (r.begin < begin + bytes && begin < r.end) || (wrapped && r.end > head_);
  };
  while (!pending_.empty() && in_use(pending_.front())) {
    Region r = pending_.front();
    pending_.pop_front();
    wait_for_event(r.done, "device " + c_.name + ", pinned staging");
    spare_events_.push_back(r.done);
  }
  head_ = begin + bytes;
  return begin;
}

CUevent PinnedStaging::retire(size_t begin, size_t bytes) {
  CUevent e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    TG_CU("device " + c_.name + ", pinned staging", cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  }
  pending_.push_back({begin, begin + bytes, e});
  TG_CU("device " + c_.name + ", pinned staging", cuEventRecord, e, c_.stream);
  return e;
}

void PinnedStaging::copy_in(CUdeviceptr dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  c_.current();
  for (size_t off = 0; off < bytes; off += CHUNK) {
    size_t n = std::min(CHUNK, bytes - off);
    size_t at = take(n);
    std::memcpy(base_ + at, static_cast<const char*>(src) + off, n);
    if (CUresult r = driver().cuMemcpyHtoDAsync(dst + off, base_ + at, n, c_.stream); r != CUDA_SUCCESS)
      check_cu(r, "cuMemcpyHtoDAsync",
               "device " + c_.name + ", copy_in of " + std::to_string(bytes) + " bytes");
    retire(at, n);
  }
}

void PinnedStaging::copy_out(void* dst, CUdeviceptr src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  c_.current();
  for (size_t off = 0; off < bytes; off += CHUNK) {
    size_t n = std::min(CHUNK, bytes - off);
    size_t at = take(n);
    std::string where = "device " + c_.name + ", copy_out of " + std::to_string(bytes) + " bytes";
    TG_CU(where, cuMemcpyDtoHAsync, base_ + at, src + off, n, c_.stream);
    wait_for_event(retire(at, n), where);
    std::memcpy(static_cast<char*>(dst) + off, base_ + at, n);
  }
}

}  // namespace tg::cuda
