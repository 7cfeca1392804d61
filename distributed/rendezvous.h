// The rendezvous store as seen from a rank: the job's store from the environment that `tg launch`
// or Slurm set (Note [the job's store]), and a Bootstrap through it (NCCL's unique id without MPI).
#pragma once
#include <memory>
#include <string>

#include "distributed/bootstrap.h"
#include "distributed/store.h"

namespace tg::dist {

// Note [the job's store]: under `tg launch` the launcher serves the store and gives every worker
// TG_RDZV_ENDPOINT (HOST:PORT), TG_RDZV_TOKEN and TG_RDZV_RUN_ID (the key prefix of this attempt).
// Under srun nobody serves it, so rank 0 does, for the life of the process: at the first node of
// SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST), port `slurm_port` (distributed.rdzv_port) when
// given, else TG_RDZV_PORT, else MASTER_PORT, else 29500,
// with the token of TG_RDZV_TOKEN or TG_RDZV_TOKEN_FILE and the run id "slurm-JOB.STEP". Rank 0
// binds the address the node's name resolves to, and no other.
std::unique_ptr<StoreClient> job_store(Seconds timeout, int slurm_port = 0);

// A bootstrap of `size` ranks through the store: root sets "bootstrap/<n>" (the n-th broadcast),
// the others wait for it within `timeout` (an error names the key and so the missing root).
std::unique_ptr<Bootstrap> store_bootstrap(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout);

// The IPv4 address a host name (or address) resolves to: the one address a store server binds.
std::string resolve_ipv4(const std::string& host);

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
std::string first_slurm_node(const std::string& nodelist);

}  // namespace tg::dist
