// The timeline recorder (see trace.h): one process-wide event list behind a mutex, thread lanes
// numbered in order of first use, and the clock of Note [trace clock].
#include "tinygrad/engine/trace.h"

#include <chrono>
#include <mutex>
#include <unordered_map>

namespace tg::trace {

namespace {

struct Recorder {
  std::mutex mu;
  Recording rec;
  size_t max_events = 0;
  std::unordered_map<std::string, int> lane_ids;  // named lanes that are no thread
  int next_tid = 1;
  std::chrono::steady_clock::time_point steady0 = std::chrono::steady_clock::now();
  double wall0_us = 0;
};

Recorder& recorder() {
  static auto* r = new Recorder();  // never destroyed: threads may record during exit
  return *r;
}

// Note [trace event cap]: a long run with tracing on would grow the list without bound (a
// kernel is one event), so past max_events the recorder counts instead of keeping, and the
// written trace says how many it dropped.
void add_locked(Recorder& r, Event e) {
  if (r.rec.events.size() >= r.max_events) {
    r.rec.dropped++;
    return;
  }
  r.rec.events.push_back(std::move(e));
}

}  // namespace

void start(size_t max_events) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rec.events.clear();
  r.rec.dropped = 0;
  r.max_events = max_events;
  r.steady0 = std::chrono::steady_clock::now();
  r.wall0_us = std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
  detail::recording.store(true, std::memory_order_relaxed);
}

Recording stop() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  detail::recording.store(false, std::memory_order_relaxed);
  Recording out = std::move(r.rec);
  r.rec = {};
  r.rec.lanes = out.lanes;  // lanes stay named for a later recording
  return out;
}

double now_us() {
  Recorder& r = recorder();
  return r.wall0_us + std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - r.steady0).count();
}

int thread_id(const std::string& name) {
  thread_local int tid = 0;
  thread_local bool named = false;
  if (tid && (named || name.empty())) return tid;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!tid) tid = r.next_tid++;
  if (!name.empty()) {
    r.rec.lanes.push_back({tid, name});
    named = true;
  }
  return tid;
}

int lane(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, fresh] = r.lane_ids.try_emplace(name, 0);
  if (fresh) {
    it->second = r.next_tid++;
    r.rec.lanes.push_back({it->second, name});
  }
  return it->second;
}

void complete(Event e) {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  add_locked(r, std::move(e));
}

Span::Span(const char* category, std::string_view name) : on_(enabled()) {
  if (!on_) return;
  e_.category = category;
  e_.name = name;
  e_.tid = thread_id();
  t0_ = now_us();
}

Span::~Span() {
  if (!on_) return;
  e_.ts_us = t0_;
  e_.dur_us = now_us() - t0_;
  complete(std::move(e_));
}

void Span::arg(std::string_view key, double value) {
  if (on_) e_.args.emplace_back(std::string(key), value);
}

void Span::arg(std::string_view key, std::string_view value) {
  if (on_) e_.args.emplace_back(std::string(key), std::string(value));
}

void Span::on_lane(int tid) {
  if (on_) e_.tid = tid;
}

void Span::rename(std::string_view name) {
  if (on_) e_.name = name;
}

}  // namespace tg::trace
