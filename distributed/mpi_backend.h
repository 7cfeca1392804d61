// The mpi backend: Open MPI on host memory. MPI is initialised at MPI_THREAD_MULTIPLE (the
// communication thread and the main thread both call it). Collectives are MPI's nonblocking
// ones; Work::wait polls MPI_Test against a deadline, so a dead or stuck peer ends in a tg::Error
// naming the collective, its sequence number and the ranks that stopped answering or never
// announced it (Notes [arrival notices], [liveness probe] in mpi_backend.cpp), never in a hang.
// A timed-out or failed collective ends the job: later collectives throw at once and the process
// calls MPI_Abort instead of MPI_Finalize at exit, or 1.6 s after the failure at the latest (Note
// [a failed collective ends the job]).
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace tg::dist {

// MPI_COMM_WORLD as a process group (initialises MPI on first use; finalised at exit).
std::unique_ptr<ProcessGroup> mpi_world_group();

}  // namespace tg::dist
