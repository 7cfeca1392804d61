// ProcessGroup: the ranks of a job and the collectives between them (all_reduce, reduce_scatter,
// all_gather, broadcast, barrier) on host memory. Every collective returns a Work handle; waiting
// on it past the timeout throws a tg::Error that names the collective, its sequence number, this
// rank and, where the backend can tell, the ranks that never arrived. Backends: local (threads of
// one process, local_backend.h) and mpi (Open MPI, mpi_backend.h).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

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

  // count elements of dtype (float32, float64, int32, int64) in host memory, in place.
  virtual std::shared_ptr<Work> all_reduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // in: size() * count elements; out: count elements, this rank's block of the reduction.
  virtual std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // in: count elements; out: size() * count elements, rank r's block at r * count.
  virtual std::shared_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual std::shared_ptr<Work> broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  Seconds timeout() const { return timeout_; }
  void set_timeout(Seconds t) { timeout_ = t; }
  // Collectives started so far (each one's sequence number is its position, from 0).
  uint64_t collectives_started() const { return seq_; }

 protected:
  uint64_t next_seq() { return seq_++; }
  Seconds timeout_{300.0};

 private:
  uint64_t seq_ = 0;
};

// True when this process was started by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE is set).
bool launched_by_mpirun();
// Rank and world size from Open MPI's environment (0 and 1 outside mpirun).
int env_rank();
int env_world_size();

// The group of every process of this job: the mpi backend's MPI_COMM_WORLD (a single process
// outside mpirun). An error naming the missing backend when the build has no MPI.
std::unique_ptr<ProcessGroup> world_group();
bool built_with_mpi();

// Checks that dtype is one the collectives support; `what` names the collective.
void check_collective_dtype(const char* what, DType dtype);
// Element-wise reduce of `count` elements of src into dst (dst = dst op src).
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// Divides every element by n (the Avg after a Sum).
void scale_down(void* data, size_t count, DType dtype, int n);

}  // namespace tg::dist
