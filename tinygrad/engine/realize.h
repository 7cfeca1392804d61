// Running a schedule: compile (cached) and launch each kernel, run copies and collectives,
// and keep the global counters tests and DEBUG output read.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/device.h"
#include "tinygrad/schedule/schedule.h"


namespace tg {

class Program;

struct GlobalCounters {
  uint64_t kernels_scheduled = 0;
  uint64_t kernels_run = 0;
  uint64_t copies = 0;
  uint64_t device_copies = 0;  // of those, the ones run on the devices (Note [copies between devices])
  uint64_t collectives = 0;
  double kernel_seconds = 0;  // only measured at DEBUG>=2
  static GlobalCounters& get();
  static void reset();
};

// Collectives are run by the distributed layer: it registers a runner per group, and each
// collective node carries its group's id (Note [collective args] in ops.h). start() may start
// the collective and return a function that waits for it (or nothing when it is done already);
// run_schedule calls that before the first later item that touches the collective's buffers,
// and before it returns, so kernels between the two overlap the communication.
using CollectiveWait = std::function<void()>;
class CollectiveRunner {
 public:
  virtual ~CollectiveRunner() = default;
  // Called by run_schedule and run_exec_items with every collective item of this group that the
  // list holds, in order, before the first of them starts: the runner may compare the sequence
  // with the other ranks' (a mismatch would otherwise deadlock) and throw.
  virtual void check_sequence(const std::vector<const ScheduleItem*>& /*items*/) {}
  virtual CollectiveWait start(const ScheduleItem& item) = 0;
};
// Registers a runner and returns the group id that collective nodes carry (>= 1). The runner must
// outlive its registration.
int64_t register_collective_runner(CollectiveRunner* runner);
void unregister_collective_runner(int64_t group);

// Runs the items in order; intermediates are freed after their last reader (Note
// [intermediates die after their last reader] in realize.cpp).
void run_schedule(std::vector<ScheduleItem> schedule);

// How a kernel item is launched once compiled: what engine/jit replays without scheduling,
// rendering or looking the program up again.
struct KernelLaunch {
  Program* program = nullptr;
  std::string name;
  std::vector<int64_t> global_size, local_size;  // as the pipeline's thread mapping left them
};

// One item as run_schedule ran it: the schedule item (its buffers) and, for kernels, the launch.
struct ExecItem {
  ScheduleItem item;
  KernelLaunch launch;  // Kernel items only
};

// All of src's bytes into dst: on the devices where both can, else through host memory (Note
// [copies between devices] in device.cpp). Returns how they went.
CopyKind copy_buffer(Buffer& dst, const Buffer& src);

// The launch of a kernel item as run_schedule would launch it: compiled, or taken from the
// kernel cache. engine/jit uses it for kernels it rewrites (Note [state updated in place]).
KernelLaunch kernel_launch(const ScheduleItem& item);

// While a recorder is set (on this thread), run_schedule passes it every item it runs, in order,
// before running it. Returns the previous recorder. engine/jit uses this to capture a step.
using ExecRecorder = std::function<void(const ExecItem&)>;
ExecRecorder* set_exec_recorder(ExecRecorder* recorder);

// Runs items that were run before (and compiled then), in order, with the same collective
// waits, counters and DEBUG output as run_schedule; kernels_scheduled does not grow.
void run_exec_items(const std::vector<ExecItem>& items);

// For device graphs (engine/jit's ExecGraph): the collective sequence check of a captured list
// (CollectiveRunner::check_sequence; run it before capturing, outside capture mode), and the
// recording of a list into a graph: kernels through `launch`, copies queued as run_exec_items
// queues them but not counted (a graph takes only copies on the devices: Note [copies between
// devices] in device.cpp), collectives started through their runner and waited for before their
// first reader and at the end, as run_exec_items orders them.
void check_collectives(const std::vector<ExecItem>& items);
void record_exec_items(const std::vector<ExecItem>& items, const std::function<void(const ExecItem&)>& launch);

}  // namespace tg
