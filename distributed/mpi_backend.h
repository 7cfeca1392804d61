// The mpi backend: Open MPI on host memory. MPI is initialised at MPI_THREAD_MULTIPLE (the
// communication thread and the main thread both call it). Collectives are MPI's nonblocking
// ones; Work::wait polls MPI_Test against a deadline, so a dead or stuck peer ends in a tg::Error
// naming the collective, its sequence number and the ranks that never announced it (see Note
// [arrival notices] in mpi_backend.cpp), never in a hang.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace tg::dist {

// MPI_COMM_WORLD as a process group (initialises MPI on first use; finalised at exit).
std::unique_ptr<ProcessGroup> mpi_world_group();

}  // namespace tg::dist
