// Collectives on host values for any group: directly on host groups (mpi, local), and staged
// through device buffers on groups whose collectives run on a device (nccl). For the few small
// exchanges outside the graph: the run directory, the logged loss, the collective sequence check,
// the parameters' first broadcast. Each waits for its collective (against the group's timeout).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace tg::dist {

void all_reduce_host(ProcessGroup& pg, void* data, size_t count, DType dtype, ReduceOp op);
void broadcast_host(ProcessGroup& pg, void* data, size_t count, DType dtype, int root);
// in: count elements; out: size() * count elements, rank r's block at r * count.
void all_gather_host(ProcessGroup& pg, const void* in, void* out, size_t count, DType dtype);

// The string of rank `root` on every rank.
std::string broadcast_string(ProcessGroup& pg, const std::string& s, int root = 0);
// Every rank's string, rank 0's first, on every rank.
std::vector<std::string> all_strings(ProcessGroup& pg, const std::string& mine);

}  // namespace tg::dist
