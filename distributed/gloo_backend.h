// The gloo process group: CPU collectives without MPI (Gloo's TCP transport), for ranks started
// by `tg launch` or srun. Its ranks meet through the rendezvous store (Gloo's
// gloo::rendezvous::Store implemented over StoreClient), and each collective leaves an arrival
// notice there, so a timeout names the ranks that never reached it (Note [gloo arrival notices]);
// it carries a nccl group's notices too (notice_arrival, report_failure) where no MPI is.
// Built when Gloo (Debian's libgloo-dev) and the store are found (TG_WITH_GLOO).
#pragma once
#include <memory>

#include "distributed/process_group.h"
#include "distributed/store.h"

namespace tg::dist {

// The group of `size` ranks meeting through `store` (this process is `rank`); every collective
// ends within `timeout`. `address`: the IP address this rank's peers reach it at.
std::unique_ptr<ProcessGroup> gloo_group(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout,
                                         const std::string& address);

// The address of this host on the route to `host` (127.0.0.1 for a loopback store).
std::string address_towards(const std::string& host, uint16_t port);

}  // namespace tg::dist
