// ProcessGroup: the ranks of a job and the collectives between them (all_reduce, reduce_scatter,
// all_gather, broadcast, barrier) on host memory. Every collective returns a Work handle; waiting
// on it past the timeout throws a tg::Error that names the collective, its sequence number, this
// rank and, where the backend can tell, the ranks that never arrived. Backends: local (threads of
// one process, local_backend.h), mpi (Open MPI, mpi_backend.h), nccl (nccl_backend.h) and gloo
// (gloo_backend.h).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/dtype.h"

namespace tg::dist {

using Seconds = std::chrono::duration<double>;

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// A started collective. Backends that run collectives synchronously return a finished Work.
class Work {
 public:
  virtual ~Work() = default;
  // True once the collective has finished (throws when it failed).
  virtual bool test() = 0;
  // Blocks until finished; throws tg::Error once `timeout` (default: the group's) has passed.
  // On the mpi backend a timeout or failure also ends the job (see mpi_backend.h).
  virtual void wait(std::optional<Seconds> timeout = std::nullopt) = 0;
};

// A Work that is already done.
std::shared_ptr<Work> finished_work();

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // count elements of dtype (float32, float64, int32, int64, float16, bfloat16; the half types are
  // reduced in float32 and rounded after each addition) in host memory, in place.
  virtual std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // in: size() * count elements; out: count elements, this rank's block of the reduction.
  virtual std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // in: count elements; out: size() * count elements, rank r's block at r * count.
  virtual std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;
  // Point to point: count elements to `peer`, or from it. Messages between two ranks match in
  // the order they were posted (MPI's and NCCL's rule); a recv whose count or dtype differs from
  // the send's is an error naming both. On nccl each call holds the communication stream until
  // its peer's matching call runs, so two ranks that both send first wait for each other.
  virtual std::shared_ptr<Work> send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual std::shared_ptr<Work> recv(void* data, size_t count, DType dtype, int peer) = 0;
  // Out of place: out = the reduction of every rank's in (count elements each). Host backends
  // copy in to out and reduce in place.
  virtual std::shared_ptr<Work> all_reduce_into(const void* in, void* out, size_t count, DType dtype, ReduceOp op);

  // Where the buffers of this group's collectives live: "" for host memory (local, mpi), else the
  // device ("CUDA:1" for nccl), whose communication stream runs them (Note [streams and events]
  // in tinygrad/device.h).
  virtual std::string memory_device() const { return ""; }
  // Throws the error of a collective that failed or timed out while nobody waited for it (a
  // watchdog found it); a no-op for backends whose collectives are always waited for.
  virtual void check_health() {}

  // A host group watching over a device group's collectives (Note [arrival notices for a device
  // group] in mpi_backend.cpp): notice_arrival tells the peers this rank started the device
  // group's collective #seq; after that group failed, report_failure marks the job failed (so
  // that it ends, Note [a failed collective ends the job]) and names the ranks that never reached
  // #seq or stopped answering ("" where the backend cannot tell).
  virtual void notice_arrival(uint64_t /*seq*/) {}
  virtual std::string report_failure(uint64_t /*seq*/) { return ""; }

  Seconds timeout() const { return timeout_; }
  void set_timeout(Seconds t) { timeout_ = t; }
  // Collectives started so far (each one's sequence number is its position, from 0).
  uint64_t collectives_started() const { return seq_; }
  // The id under which a CollectiveEngine runs this group's collective nodes (0: none); the
  // engine sets it (collective_runner.h).
  int64_t graph_id() const { return graph_id_; }
  void set_graph_id(int64_t id) { graph_id_ = id; }

 protected:
  uint64_t next_seq() { return seq_++; }
  Seconds timeout_{300.0};

 private:
  uint64_t seq_ = 0;
  int64_t graph_id_ = 0;
};

// Note [who started this process]: a rank learns its place from whoever started it, in this
// order: mpirun (Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE), `tg launch`
// (TG_RANK, TG_WORLD_SIZE, TG_LOCAL_RANK, TG_LOCAL_WORLD_SIZE), Slurm's srun (SLURM_PROCID,
// SLURM_STEP_NUM_TASKS or else SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or the first
// count of SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE), else none: rank 0 of 1. mpirun
// comes first because mpirun inside a Slurm allocation sets both.
enum class Launcher { None, Mpirun, TgLaunch, Slurm };
Launcher detected_launcher();
const char* launcher_name(Launcher l);  // "mpirun", "tg launch", "srun", "no launcher"
// True when this process was started by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE is set).
bool launched_by_mpirun();
// Rank and world size from the launcher's environment (0 and 1 outside any).
int env_rank();
int env_world_size();

// The group of every process of this job: the mpi backend's MPI_COMM_WORLD (a single process
// outside mpirun). An error naming the missing backend when the build has no MPI.
std::unique_ptr<ProcessGroup> world_group();
bool built_with_mpi();
// The process-group backends this build has ("local", "mpi", "nccl").
std::vector<std::string> built_backends();
// "NCCL 2.28.9 (libnccl.so.2)", or why NCCL is unavailable here, or that the build has none.
std::string nccl_status();
// The world group for distributed.backend (auto | mpi | nccl | gloo) on this rank's device (see
// rank_device): auto picks nccl for CUDA devices, mpi under mpirun and gloo otherwise; nccl's
// unique id travels over MPI under mpirun and through the rendezvous store otherwise (its
// communicator joins within `timeout`). `store_port` (distributed.rdzv_port) is the port of the
// store rank 0 serves under srun (0: from the environment, Note [the job's store]). An error names
// what is missing.
std::unique_ptr<ProcessGroup> world_group_for(const std::string& backend, const std::string& device,
                                              Seconds timeout = Seconds(300), int store_port = 0);

// Note [a rank's device]: under mpirun (tg launch, srun) every rank of a node sees every GPU. A
// GPU device named without an index (train.device=CUDA) means the GPU of the rank's local rank
// (OMPI_COMM_WORLD_LOCAL_RANK, TG_LOCAL_RANK, SLURM_LOCALID), as torchrun's LOCAL_RANK
// convention; more ranks on a node than GPUs is an error naming both numbers (NCCL refuses two
// ranks on one GPU). A device with an index, and the CPU, are taken as given.
struct LocalRanks {
  int rank = 0;  // this process's rank among the node's
  int size = 1;  // ranks on this node
};
LocalRanks env_local_ranks();  // from the launcher (Note [who started this process]); 0 and 1 outside any
std::string rank_device(const std::string& device, LocalRanks local, int gpus_on_node);

// Checks that dtype is one the collectives support; `what` names the collective.
void check_collective_dtype(const char* what, DType dtype);
// Checks that peer is another rank of a group of `size` (send/recv).
void check_peer(const char* what, int peer, int rank, int size);
// Element-wise reduce of `count` elements of src into dst (dst = dst op src).
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// Divides every element by n (the Avg after a Sum).
void scale_down(void* data, size_t count, DType dtype, int n);

}  // namespace tg::dist
