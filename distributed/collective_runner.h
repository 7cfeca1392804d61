// Collectives as graph nodes: all_reduce_node() puts an ALLREDUCE into the lazy graph, and a
// CollectiveEngine registers the runner (tinygrad/engine/realize.h) that executes the
// scheduled ALLREDUCE items on a ProcessGroup. With `async`, each runs on the engine's
// communication thread; run_schedule waits for it only where a later item reads its buffer, so
// the kernels scheduled in between (the rest of the backward pass) overlap it.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "distributed/process_group.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"

namespace tg::dist {

// A lazy all-reduce of x over the group of the installed engine (Sum or Max; Avg is a Sum
// that the caller scales, so that the division fuses into the kernel that reads it).
Tensor all_reduce_node(const Tensor& x, ReduceOp op = ReduceOp::Sum);

class CollectiveEngine {
 public:
  // Installs this engine as the collective runner (one at a time).
  explicit CollectiveEngine(ProcessGroup& pg, bool async = true);
  ~CollectiveEngine();  // uninstalls and joins the communication thread
  CollectiveEngine(const CollectiveEngine&) = delete;
  CollectiveEngine& operator=(const CollectiveEngine&) = delete;

  ProcessGroup& group() { return pg_; }
  uint64_t all_reduces_run() const { return count_; }

 private:
  std::function<void()> run(const ScheduleItem& item);
  void loop();

  ProcessGroup& pg_;
  bool async_;
  uint64_t count_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tg::dist
