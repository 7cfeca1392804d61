// How the ranks of a new communicator exchange the few bytes that let them find each other
// (NCCL's unique id): a small interface, so that MPI serves it under mpirun and the rendezvous
// store can serve it where there is no MPI.
#pragma once
#include <cstddef>
#include <memory>

#include "distributed/process_group.h"

namespace tg::dist {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Gives every rank root's n bytes (n is the same on every rank).
  virtual void broadcast(void* bytes, size_t n, int root) = 0;
};

// A bootstrap over a host process group (mpi, local): the bytes travel as int64 words.
std::unique_ptr<Bootstrap> group_bootstrap(ProcessGroup& pg);

}  // namespace tg::dist
