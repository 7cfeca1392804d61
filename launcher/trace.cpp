// A rank's timeline as a Chrome-trace file, and the merge of a run's rank files (see trace.h).
#include "launcher/trace.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <iomanip>
#include <sstream>

#include "launcher/plot.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tg::launcher {

namespace {

std::string rank_file_name(const std::string& prefix, int rank) { return prefix + ".rank" + std::to_string(rank) + ".json"; }

// The prefix of this start's files for `rank`: "trace", or "trace-K" past the K-1 earlier ones.
std::string free_prefix(const fs::path& dir, int rank) {
  std::string prefix = "trace";
  for (int k = 2; fs::exists(dir / rank_file_name(prefix, rank)); k++) prefix = "trace-" + std::to_string(k);
  return prefix;
}

json metadata(const char* name, int pid, int tid, const std::string& value) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", value}}}};
}

json event_json(const trace::Event& e, int pid) {
  json j = {{"name", e.name}, {"cat", e.category}, {"ph", "X"},       {"pid", pid},
            {"tid", e.tid},   {"ts", e.ts_us},     {"dur", e.dur_us}};
  if (!e.args.empty()) {
    json args = json::object();
    for (const auto& [k, v] : e.args) {
      if (auto* d = std::get_if<double>(&v)) args[k] = *d;
      else args[k] = std::get<std::string>(v);
    }
    j["args"] = std::move(args);
  }
  return j;
}

void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    TG_CHECK(out.good(), "trace: cannot write '", tmp.string(), "'");
  }
  fs::rename(tmp, path);
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TG_CHECK(in.good(), "tg trace: cannot read '", path.string(), "'");
  json j = json::parse(in, nullptr, false);
  TG_CHECK(!j.is_discarded() && j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), "tg trace: '",
           path.string(), "' is no Chrome-trace file (a JSON object with traceEvents)");
  return j;
}

}  // namespace

bool trace_requested(const Config& cfg) { return cfg.get_bool("train.trace") || knobs::TRACE.get() != 0; }

RunTrace::RunTrace(std::string run_dir, int rank, int world_size, std::string device)
    : run_dir_(std::move(run_dir)), device_(std::move(device)), rank_(rank), world_size_(world_size) {
  trace::thread_id("main");
  trace::start();
}

RunTrace::~RunTrace() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "trace: rank " << rank_ << "'s timeline was not written: " << e.what() << "\n";
  }
}

std::string RunTrace::finish() {
  if (finished_) return "";
  finished_ = true;
  trace::Recording rec = trace::stop();
  if (!fs::is_directory(run_dir_)) return "";  // Note [trace files]
  const fs::path path = fs::path(run_dir_) / rank_file_name(free_prefix(run_dir_, rank_), rank_);
  write_file(path, chrome_trace_json(rec, rank_, world_size_, device_));
  return path.string();
}

std::string chrome_trace_json(const trace::Recording& rec, int rank, int world_size, const std::string& device) {
  json events = json::array();
  events.push_back(metadata("process_name", rank, 0, "rank " + std::to_string(rank) + " (" + device + ")"));
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank}, {"tid", 0}, {"args", {{"sort_index", rank}}}});
  std::set<int> used;  // lanes of threads that recorded nothing this time (a finished run's loaders) are left out
  for (const auto& e : rec.events) used.insert(e.tid);
  for (const auto& lane : rec.lanes) {
    if (!used.count(lane.tid)) continue;
    events.push_back(metadata("thread_name", rank, lane.tid, lane.name));
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank}, {"tid", lane.tid},
                      {"args", {{"sort_index", lane.tid}}}});
  }
  for (const auto& e : rec.events) events.push_back(event_json(e, rank));
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"rank", rank}, {"world_size", world_size}, {"device", device}, {"dropped_events", rec.dropped},
                {"clock", "microseconds since the Unix epoch"}}}};
  return out.dump();
}

TraceFiles newest_trace_files(const std::string& run_dir) {
  TG_CHECK(fs::is_directory(run_dir), "tg trace: no run directory '", run_dir, "'");
  static const std::regex name(R"((trace(?:-([0-9]+))?)\.rank([0-9]+)\.json)");
  std::map<int, std::map<int, std::string>> by_start;  // start (1, 2, ...) -> rank -> path
  std::map<int, std::string> prefix_of;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(file, m, name)) continue;
    const int start = m[2].matched ? std::stoi(m[2].str()) : 1;
    by_start[start][std::stoi(m[3].str())] = entry.path().string();
    prefix_of[start] = m[1].str();
  }
  TG_CHECK(!by_start.empty(), "tg trace: no trace.rank<R>.json in '", run_dir,
           "' (train with train.trace=true or TRACE=1 to record one)");
  auto& [start, ranks] = *by_start.rbegin();
  TraceFiles out{prefix_of[start], {}};
  for (auto& [rank, path] : ranks) out.paths.push_back(path);
  return out;
}

namespace {

// The newest start's rank files as one trace document (see merge_traces); notes name missing ranks.
json merged_document(const std::string& run_dir, TraceFiles& files, MergedTrace& merged) {
  files = newest_trace_files(run_dir);
  std::vector<json> ranks;
  for (const auto& p : files.paths) ranks.push_back(read_json_file(p));
  // Note [trace clock] in tinygrad/engine/trace.h: the ranks share the time axis; the merged
  // file starts it at the earliest event, which keeps the microseconds' fractions exact.
  double origin = INFINITY;
  for (const auto& r : ranks)
    for (const auto& e : r["traceEvents"])
      if (e.contains("ts") && e["ts"].is_number()) origin = std::min(origin, e["ts"].get<double>());
  if (!std::isfinite(origin)) origin = 0;
  json events = json::array();
  int world = 0;
  std::vector<int> present;
  for (auto& r : ranks) {
    const json& other = r.value("otherData", json::object());
    world = std::max(world, other.value("world_size", 0));
    present.push_back(other.value("rank", -1));
    for (auto& e : r["traceEvents"]) {
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() - origin;
      events.push_back(std::move(e));
    }
  }
  for (int rank = 0; rank < world; rank++)
    if (std::find(present.begin(), present.end(), rank) == present.end())
      merged.notes.push_back("rank " + std::to_string(rank) + " of " + std::to_string(world) + " has no " +
                             rank_file_name(files.prefix, rank) + " (merged without it)");
  merged.events = events.size();
  merged.ranks = static_cast<int>(ranks.size());
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"ranks", present}, {"world_size", world}, {"ts_origin_us", origin}}}};
}

// A merged trace's spans and lane names, and the window of one step (the last by default) over
// every rank, or the whole trace where it has no steps.
Timeline timeline_of(const json& doc, int64_t step) {
  Timeline t;
  std::map<int64_t, std::pair<double, double>> steps;  // step -> its window over the ranks
  for (const auto& e : doc["traceEvents"]) {
    const int pid = e.value("pid", 0), tid = e.value("tid", 0);
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      t.lane_names[{pid, tid}] = "rank " + std::to_string(pid) + " " + e["args"].value("name", "");
    if (e.value("ph", "") != "X") continue;
    TimelineSpan s{pid, tid, e.value("name", ""), e.value("cat", ""), e.value("ts", 0.0), e.value("dur", 0.0)};
    if (s.category == "step" && e.contains("args") && e["args"].contains("step")) {
      auto [it, fresh] = steps.try_emplace(e["args"]["step"].get<int64_t>(), s.ts_us, s.ts_us + s.dur_us);
      it->second = {std::min(it->second.first, s.ts_us), std::max(it->second.second, s.ts_us + s.dur_us)};
    }
    t.spans.push_back(std::move(s));
  }
  TG_CHECK(!t.spans.empty(), "tg trace plot: the trace has no spans");
  std::map<std::string, int> uses;  // two threads of one name (two data loaders): numbered
  for (auto& [lane, name] : t.lane_names)
    if (int n = ++uses[name]; n > 1) name += " " + std::to_string(n);
  if (steps.empty()) {
    TG_CHECK(step == 0, "tg trace plot: --step ", step, ": the trace has no training steps");
    t.from_us = INFINITY;
    t.to_us = -INFINITY;
    for (const auto& s : t.spans) {
      t.from_us = std::min(t.from_us, s.ts_us);
      t.to_us = std::max(t.to_us, s.ts_us + s.dur_us);
    }
    t.title = "the whole trace";
  } else {
    if (step == 0) step = steps.rbegin()->first;
    auto it = steps.find(step);
    TG_CHECK(it != steps.end(), "tg trace plot: --step ", step, ": the trace has steps ", steps.begin()->first, " to ",
             steps.rbegin()->first);
    const double margin = (it->second.second - it->second.first) * 0.01;
    t.from_us = it->second.first - margin;
    t.to_us = it->second.second + margin;
    t.title = "step " + std::to_string(step);
  }
  std::ostringstream ms;
  ms << std::setprecision(3) << (t.to_us - t.from_us) / 1e3;
  t.title += ": " + ms.str() + " ms";
  return t;
}

}  // namespace

MergedTrace merge_traces(const std::string& run_dir, const std::string& out) {
  TraceFiles files;
  MergedTrace merged;
  json doc = merged_document(run_dir, files, merged);
  merged.path = out.empty() ? (fs::path(run_dir) / (files.prefix + ".json")).string() : out;
  write_file(merged.path, doc.dump());
  return merged;
}

std::string plot_trace(const std::string& run_dir, int64_t step, const std::string& out) {
  TraceFiles files;
  MergedTrace merged;
  Timeline t = timeline_of(merged_document(run_dir, files, merged), step);
  t.title = fs::path(run_dir).filename().string() + ", " + t.title;
  draw_timeline(t, out);
  return t.title;
}

}  // namespace tg::launcher
