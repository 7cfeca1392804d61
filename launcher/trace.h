// The run's timeline: with train.trace=true (or TRACE=1) every rank records the engine's spans
// (tinygrad/engine/trace.h: kernels, scheduling, compiles, JIT replays, collectives, data
// loading, steps) and writes them as a Chrome-trace JSON file into the run directory;
// `tg trace merge RUN_DIR` joins the ranks' files into one that Perfetto and chrome://tracing open.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "tinygrad/engine/trace.h"

namespace tg::launcher {

// train.trace, or the TRACE knob.
bool trace_requested(const Config& cfg);

// Note [trace files]: each rank writes RUN_DIR/trace.rank<R>.json when its training ends (or
// fails): one process (pid R, named "rank R (DEVICE)"), a thread per lane (the main thread, the
// data loader, the communication thread or stream), "X" events with ts and dur in microseconds
// since the Unix epoch, and otherData with the rank, the world size and the events dropped past
// the cap. A later start of the run that traces too writes trace-2.rank<R>.json, then trace-3...
// (each rank counts its own files), so no start overwrites another's timeline. A rank whose run
// directory does not exist (a run that failed before rank 0 made it) writes nothing.
class RunTrace {
 public:
  // Starts recording for rank `rank` of `world_size` on `device`.
  RunTrace(std::string run_dir, int rank, int world_size, std::string device);
  ~RunTrace();  // stops and writes (a failure to write is reported on stderr)
  RunTrace(const RunTrace&) = delete;
  RunTrace& operator=(const RunTrace&) = delete;
  // Stops recording and writes the file; returns its path ("" when nothing was written).
  std::string finish();

 private:
  std::string run_dir_, device_;
  int rank_, world_size_;
  bool finished_ = false;
};

// A recording as Chrome-trace JSON (the object form: {"traceEvents": [...], "otherData": {...}}).
std::string chrome_trace_json(const trace::Recording& rec, int rank, int world_size, const std::string& device);

// The newest start's rank files of a run directory: RUN_DIR/<prefix>.rank<R>.json, rank 0 first,
// and the prefix ("trace", "trace-2", ...). An error where there are none.
struct TraceFiles {
  std::string prefix;
  std::vector<std::string> paths;
};
TraceFiles newest_trace_files(const std::string& run_dir);

struct MergedTrace {
  std::string path;
  int ranks = 0;
  size_t events = 0;
  std::vector<std::string> notes;  // ranks whose files are missing
};
// `tg trace merge`: the newest start's rank files as one trace (every event's pid its rank, times
// shifted to start at 0, the shift in otherData), written to `out` (default RUN_DIR/<prefix>.json).
MergedTrace merge_traces(const std::string& run_dir, const std::string& out = "");

// `tg trace plot`: the newest start's ranks merged and drawn (plot.h's draw_timeline) from the
// beginning of step `step` on the first rank to its end on the last (0: the last step; the
// whole trace where it has no steps) into out (.png or .svg). Returns the picture's title.
std::string plot_trace(const std::string& run_dir, int64_t step, const std::string& out);

}  // namespace tg::launcher
