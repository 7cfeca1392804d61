// Collectives as graph nodes: all_reduce_node(), reduce_scatter_node() and all_gather_node() put
// an ALLREDUCE, REDUCE_SCATTER or ALLGATHER into the lazy graph, carrying the id of the group
// that runs them (Note [collective args] in tinygrad/ops.h). A CollectiveEngine registers itself
// as the runner of one ProcessGroup (tinygrad/engine/realize.h) and executes the scheduled
// items on it. With `async`, each runs on the engine's communication thread; run_schedule waits
// for it only where a later item reads its buffer, so the kernels scheduled in between (the rest
// of the backward pass) overlap it. Before a schedule's first collective, the engine checks that
// every rank runs the same collectives (Note [collective sequence check]). A tensor over several
// devices of the process takes part from the first of them, and the result is replicated over
// them (Note [collectives of a tensor over several devices]); all_reduce_split_node keeps a split
// tensor split (Note [split tensors across the ranks]).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "distributed/process_group.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/tensor.h"

namespace tg::dist {

// A lazy all-reduce of x over pg (Sum or Max; Avg is a Sum that the caller scales, so that the
// division fuses into the kernel that reads it). pg must be served by a CollectiveEngine.
Tensor all_reduce_node(ProcessGroup& pg, const Tensor& x, ReduceOp op = ReduceOp::Sum);
// A lazy sum over pg of x, a tensor split along axis 0 over several devices of this process, whose
// result keeps x's layout: each device's part is summed with the same part on the other ranks
// (Note [split tensors across the ranks] in collective_runner.cpp).
Tensor all_reduce_split_node(ProcessGroup& pg, const Tensor& x);
// x: 1-d, pg.size() * n elements -> this rank's block [n] of the reduction (Sum or Max).
Tensor reduce_scatter_node(ProcessGroup& pg, const Tensor& x, ReduceOp op = ReduceOp::Sum);
// x: 1-d, n elements -> [pg.size() * n], rank r's block at r * n.
Tensor all_gather_node(ProcessGroup& pg, const Tensor& x);

class CollectiveEngine : public CollectiveRunner {
 public:
  // Registers this engine as the runner of pg's collective nodes (one engine per group).
  explicit CollectiveEngine(ProcessGroup& pg, bool async = true);
  ~CollectiveEngine() override;  // unregisters and joins the communication thread
  CollectiveEngine(const CollectiveEngine&) = delete;
  CollectiveEngine& operator=(const CollectiveEngine&) = delete;

  ProcessGroup& group() { return pg_; }
  uint64_t collectives_run() const { return count_; }
  // Sequences compared with the other ranks so far (Note [collective sequence check]).
  uint64_t sequences_checked() const { return checked_.size(); }
  // Note [hidden communication]: seconds the communication thread spent running collectives of
  // one kind (ALLREDUCE, REDUCE_SCATTER or ALLGATHER), and seconds the scheduling thread spent
  // waiting for them (host groups with `async`).
  struct Timing {
    double busy_s = 0;
    double waited_s = 0;
    double hidden_s() const { return busy_s - waited_s; }
  };
  Timing timing(Op kind) const;

  void check_sequence(const std::vector<const ScheduleItem*>& items) override;
  CollectiveWait start(const ScheduleItem& item) override;

 private:
  void loop();
  CollectiveWait start_on_device(const ScheduleItem& item);  // Note [collectives on a device's streams]

  ProcessGroup& pg_;
  bool async_;
  int64_t id_ = 0;
  uint64_t count_ = 0;
  std::unordered_set<uint64_t> checked_;  // hashes of sequences every rank agreed on
  mutable std::mutex mu_;
  Timing timing_[3];  // by kind (ALLREDUCE, REDUCE_SCATTER, ALLGATHER), under mu_
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tg::dist
