// The nccl process group: one communicator of the ranks' GPUs (one GPU per process), whose
// collectives run on device buffers on the device's communication stream (Note [streams and
// events] in tinygrad/device.h). Built when nccl.h is found; libnccl.so.2 is loaded at run time
// (nccl_api.h). Communicators are non-blocking, and a watchdog ends a collective that failed or
// ran past the timeout (Note [the nccl watchdog]).
#pragma once
#include <memory>
#include <string>

#include "distributed/bootstrap.h"
#include "distributed/process_group.h"

namespace tg::dist {

// The communicator of bootstrap's ranks on `device` (a CUDA device of this process): rank 0's
// unique id travels through the bootstrap, and every rank joins within `timeout`. `watch` (a host
// group of the same ranks, kept by the group) carries arrival notices, so that a timeout names
// the ranks that never reached the collective (Note [arrival notices for a device group] in
// mpi_backend.cpp).
std::unique_ptr<ProcessGroup> nccl_group(Bootstrap& bootstrap, const std::string& device, Seconds timeout,
                                         std::unique_ptr<ProcessGroup> watch = nullptr);

}  // namespace tg::dist
