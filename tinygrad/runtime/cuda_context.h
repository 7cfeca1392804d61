// What the parts of the CUDA device share (runtime/cuda*.cpp only): the GPU's primary context and
// the device's one stream, on which kernels, copies, stream-ordered allocations and graph launches
// run in order.
#pragma once
#include <functional>
#include <string>

#include "tinygrad/runtime/cuda_api.h"

namespace tg::cuda {

struct Context {
  std::string name;  // "CUDA", "CUDA:1"
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  // Makes ctx current on this thread (the driver keeps one per thread).
  void current() const;
  // After a library call that may have made another context current (NCCL sets devices itself):
  // the next current() sets its context again.
  static void forget_current();
};

// The context of an open CUDA device ("CUDA", "CUDA:1"); an internal error for other devices.
const Context& context_of(const std::string& device);

// Waits on the host until `ev` has happened: the driver's blocking wait, or polling against the
// host wait limit (Note [host waits with a deadline] in device.h), after which it throws.
void wait_for_event(CUevent ev, const std::string& where);

// Queues `run`'s work on `stream` between two events, waits for it and returns the GPU time
// between them, in seconds (Feature::Timing: a launch that waits, DEBUG=2's per-kernel times).
double timed_on_stream(CUstream stream, const std::string& where, const std::function<void()>& run);

}  // namespace tg::cuda
