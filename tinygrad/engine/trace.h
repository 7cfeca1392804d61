// The timeline recorder: spans ("complete" events: a name, a category, a thread or lane, a start
// and a duration) that the engine, the distributed layer and the trainer record while a
// recording is on, for a Chrome-trace file (launcher/trace.h writes and merges those files).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tg::trace {

// Note [tracing costs nothing when off]: every hook first asks enabled(), one relaxed atomic
// load; only a recording pays for clocks, names and the event list's lock. A kernel launched
// while recording is launched with `wait` (Program::launch), so that its duration is the
// device's own measurement where the device measures it (CUDA events) and the host's time of
// the launch otherwise (the CPU's launch returns when the kernel is done). On CUDA this
// serialises the compute stream against the host while a trace records, which the timeline then
// shows; a trace is a profile, not a timing run. For the same reason a JIT replay that would be
// one device graph runs item by item while a trace records (Note [a traced replay runs item by
// item] in jit.cpp).
namespace detail {
inline std::atomic<bool> recording{false};
}
inline bool enabled() { return detail::recording.load(std::memory_order_relaxed); }

using ArgValue = std::variant<double, std::string>;

struct Event {
  std::string name;
  std::string category;  // "kernel", "compile", "schedule", "collective", "jit", "data", "step", ...
  int tid = 0;           // a thread (thread_id()) or a named lane (lane())
  double ts_us = 0;      // start: microseconds since the Unix epoch (Note [trace clock])
  double dur_us = 0;
  std::vector<std::pair<std::string, ArgValue>> args;
};

// The lanes' names, for the trace's thread-name metadata.
struct Lane {
  int tid = 0;
  std::string name;
};

struct Recording {
  std::vector<Event> events;
  std::vector<Lane> lanes;
  uint64_t dropped = 0;  // events past the cap (Note [trace event cap])
};

// Starts recording (clearing what an earlier recording left). max_events caps the list.
void start(size_t max_events = 2'000'000);
// Stops recording and returns the events, in the order they ended, and the lanes.
Recording stop();

// Note [trace clock]: times are microseconds since the Unix epoch, taken as the wall clock at
// start() plus the steady clock's progress since, so spans within a process never go backwards
// and the ranks of one job (processes of one or several hosts, with synchronised clocks) share
// one time axis in a merged trace.
double now_us();

// The calling thread's lane (a small number, the same for the thread's life), named `name` in the
// trace when given (the first name given sticks).
int thread_id(const std::string& name = "");
// A lane that is no thread (a device's communication stream), by name: the same name, the same id.
int lane(const std::string& name);

// Adds a finished span (ignored when not recording).
void complete(Event e);

// A span from construction to destruction on the calling thread's lane. Constructed while not
// recording it records nothing and copies nothing (the enabled() check alone).
class Span {
 public:
  Span(const char* category, std::string_view name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  // Arguments shown with the span (copied only while recording).
  void arg(std::string_view key, double value);
  void arg(std::string_view key, std::string_view value);
  void rename(std::string_view name);
  void on_lane(int tid);  // a lane() instead of the thread's

 private:
  bool on_;
  double t0_ = 0;
  Event e_;
};

}  // namespace tg::trace
