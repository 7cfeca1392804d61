// The local backend: every rank is a thread of this process, and collectives exchange host
// pointers through a shared LocalWorld. Tests use it to run several ranks without mpirun. A rank
// whose function throws is marked dead, so the others fail at their next collective with an
// error naming it instead of waiting for the timeout.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "distributed/process_group.h"

namespace tg::dist {

class LocalWorld;

// Creates the world of n ranks; group(r) is rank r's view of it (the world must outlive them).
std::shared_ptr<LocalWorld> make_local_world(int n);
std::unique_ptr<ProcessGroup> local_group(const std::shared_ptr<LocalWorld>& world, int rank);

// Runs fn on n threads, one rank each, and rethrows the first error by rank (as "rank r: ...").
void run_local(int n, const std::function<void(ProcessGroup&)>& fn, Seconds timeout = Seconds(60));

}  // namespace tg::dist
