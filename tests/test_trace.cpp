// The timeline: the recorder (nothing while off, spans and their arguments while on, the event
// cap), a traced single-process run's trace.rank0.json (kernels, scheduling, compiles, JIT
// replays, steps, data loading, on named threads; Chrome-trace JSON read back with
// nlohmann-json), a later traced start writing trace-2 beside it, `tg trace merge` and its
// errors; and a 2-rank DDP run of `tg train` under mpirun whose merged trace holds both ranks and,
// on each, an all-reduce that starts after a backward kernel and has kernels run after it before
// the host waits for it (skipped without MPI or Fashion-MNIST).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "launcher/plot.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "launcher/trace.h"
#include "tests/run_util.h"
#include "tests/synth_images.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tg;
using namespace tg::launcher;

namespace {

using testutil::synth_images;
TG_REGISTER_MODEL("trace_mlp", [](const Config&) { return make_mlp({16}, 4, 3); });
TG_REGISTER_DATASET("trace_synth", [](const Config&) { return image_splits(synth_images(48, 0), synth_images(24, 1), 0.3, 0.3, 3); });

json read_json(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return json::parse(in);
}

std::vector<json> events_of(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == ph) out.push_back(e);
  return out;
}

std::set<std::string> categories(const json& trace) {
  std::set<std::string> out;
  for (const auto& e : events_of(trace, "X")) out.insert(e["cat"].get<std::string>());
  return out;
}

std::set<std::string> thread_names(const json& trace) {
  std::set<std::string> out;
  for (const auto& e : events_of(trace, "M"))
    if (e["name"] == "thread_name") out.insert(e["args"]["name"].get<std::string>());
  return out;
}

std::vector<std::string> synth_run(const fs::path& dir, int steps) {
  return {"model.name=trace_mlp", "data.name=trace_synth", "data.batch_size=8", "train.steps=" + std::to_string(steps),
          "train.log_every=2", "optim.lr=0.05", "train.checkpoint_every=2", "train.run_dir=" + dir.string()};
}

struct Span {
  double begin, end;
  bool contains(const Span& o) const { return begin <= o.begin && o.end <= end; }
};
Span span_of(const json& e) {
  double ts = e["ts"].get<double>();
  return {ts, ts + e["dur"].get<double>()};
}

// Per rank of a merged trace: the steps, kernels, all-reduces (on the communication thread) and
// the main thread's queueing of and waiting for each all-reduce, by sequence number.
struct RankEvents {
  std::vector<Span> steps, kernels, compiles;
  std::map<int, Span> all_reduces, queued, waits;
};
std::map<int, RankEvents> rank_events(const json& merged) {
  std::map<int, RankEvents> ranks;
  for (const auto& e : events_of(merged, "X")) {
    RankEvents& r = ranks[e["pid"].get<int>()];
    const Span s = span_of(e);
    const bool all_reduce = e["name"] == "all_reduce" || (e.contains("args") && e["args"].value("for", "") == "all_reduce");
    if (e["cat"] == "step") r.steps.push_back(s);
    if (e["cat"] == "kernel") r.kernels.push_back(s);
    if (e["cat"] == "compile") r.compiles.push_back(s);
    if (!all_reduce) continue;
    const int seq = e["args"]["seq"].get<int>();
    if (e["cat"] == "collective") r.all_reduces[seq] = s;
    if (e["cat"] == "queue") r.queued[seq] = s;
    if (e["cat"] == "wait") r.waits[seq] = s;
  }
  return ranks;
}

// Note [an all-reduce between backward kernels]: does some step of r have an all-reduce A and a
// later B with kernels between their queueing, B queued before the wait for A, and A running
// while one of those kernels ran?
bool all_reduce_between_backward_kernels(const RankEvents& r) {
  for (const auto& [a, queued_a] : r.queued)
    for (const auto& [b, queued_b] : r.queued) {
      if (b <= a || !r.waits.count(a) || !r.all_reduces.count(a) || queued_b.begin >= r.waits.at(a).begin) continue;
      const Span& ran = r.all_reduces.at(a);
      const auto step = std::find_if(r.steps.begin(), r.steps.end(), [&](const Span& s) { return s.contains(queued_a); });
      if (step == r.steps.end()) continue;
      bool made_a = false, overlapped = false;
      for (const Span& k : r.kernels) {
        made_a = made_a || (step->contains(k) && k.end <= queued_a.begin);
        overlapped = overlapped || (k.begin >= queued_a.end && k.end <= queued_b.begin && ran.begin < k.end);
      }
      if (made_a && overlapped) return true;
    }
  return false;
}

// How many of the merged trace's ranks have their `steps` steps and an all-reduce between
// backward kernels.
int ranks_between(const json& merged, size_t steps) {
  int n = 0;
  for (const auto& [rank, r] : rank_events(merged)) {
    EXPECT_EQ(r.steps.size(), steps) << "rank " << rank;
    EXPECT_GE(r.all_reduces.size(), 2 * steps) << "rank " << rank;
    const bool between = all_reduce_between_backward_kernels(r);
    EXPECT_TRUE(between) << "rank " << rank << ": no all-reduce between backward kernels";
    n += between;
  }
  return n;
}

// The fill colours of an SVG's paths (cairo writes fill:rgb(R%,G%,B%)), as 8-bit RGB.
std::set<std::array<int, 3>> svg_fills(const fs::path& svg) {
  std::ifstream in(svg);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  static const std::regex fill(R"(fill:\s*rgb\(\s*([0-9.]+)%\s*,\s*([0-9.]+)%\s*,\s*([0-9.]+)%\s*\))");
  std::set<std::array<int, 3>> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), fill); it != std::sregex_iterator(); ++it)
    out.insert({static_cast<int>(std::lround(std::stod((*it)[1]) * 2.55)), static_cast<int>(std::lround(std::stod((*it)[2]) * 2.55)),
                static_cast<int>(std::lround(std::stod((*it)[3]) * 2.55))});
  return out;
}

std::array<int, 3> as_ints(std::array<uint8_t, 3> c) { return {c[0], c[1], c[2]}; }

}  // namespace

TEST(TraceRecorder, RecordsOnlyWhileOnAndCapsTheList) {
  EXPECT_FALSE(trace::enabled());
  { trace::Span off("test", "before"); }
  trace::start(3);
  const int main_tid = trace::thread_id();
  {
    trace::Span s("test", "outer");
    s.arg("n", 7.0);
    s.arg("what", "text");
    { trace::Span inner("test", "inner"); }
  }
  const int stream = trace::lane("a stream");
  EXPECT_EQ(trace::lane("a stream"), stream);
  trace::complete({"queued", "test", stream, trace::now_us(), 5});
  for (int i = 0; i < 4; i++) trace::Span extra("test", "past the cap");
  trace::Recording rec = trace::stop();
  EXPECT_FALSE(trace::enabled());
  { trace::Span after("test", "after"); }
  ASSERT_EQ(rec.events.size(), 3u);
  EXPECT_EQ(rec.dropped, 4u);
  EXPECT_EQ(rec.events[0].name, "inner");  // in the order they ended
  EXPECT_EQ(rec.events[1].name, "outer");
  EXPECT_EQ(rec.events[1].tid, main_tid);
  ASSERT_EQ(rec.events[1].args.size(), 2u);
  EXPECT_EQ(std::get<double>(rec.events[1].args[0].second), 7.0);
  EXPECT_EQ(std::get<std::string>(rec.events[1].args[1].second), "text");
  EXPECT_LE(rec.events[1].ts_us, rec.events[0].ts_us);
  EXPECT_GE(rec.events[1].ts_us + rec.events[1].dur_us, rec.events[0].ts_us + rec.events[0].dur_us);
  EXPECT_EQ(rec.events[2].tid, stream);
  EXPECT_DOUBLE_EQ(rec.events[2].dur_us, 5);
  bool named = false;
  for (const auto& l : rec.lanes) named = named || (l.tid == stream && l.name == "a stream");
  EXPECT_TRUE(named);
  EXPECT_TRUE(trace::stop().events.empty());  // the "after" span went nowhere
}

TEST(TraceRun, ATracedRunWritesItsTimelineAndAnUntracedOneNothing) {
  fs::path dir = testutil::fresh_run_dir("trace", "single"), plain = testutil::fresh_run_dir("trace", "plain");
  std::vector<std::string> o = synth_run(dir, 4);
  o.push_back("train.trace=true");
  run_train(parse_config("", "trace.yaml", o), {.progress = false});  // the first run of the process: it compiles
  EXPECT_FALSE(trace::enabled());  // stopped at the end of the run
  ASSERT_TRUE(fs::exists(dir / "trace.rank0.json"));
  json t = read_json(dir / "trace.rank0.json");
  EXPECT_EQ(t["otherData"]["rank"], 0);
  EXPECT_EQ(t["otherData"]["world_size"], 1);
  EXPECT_EQ(t["otherData"]["dropped_events"], 0);
  std::set<std::string> cats = categories(t);
  for (const char* c : {"kernel", "schedule", "compile", "jit", "step", "data", "eval", "checkpoint"})
    EXPECT_TRUE(cats.count(c)) << c;
  std::set<std::string> threads = thread_names(t);
  EXPECT_TRUE(threads.count("main"));
  EXPECT_TRUE(threads.count("data loader"));

  std::vector<Span> steps, replays;
  std::vector<json> kernels;
  for (const auto& e : events_of(t, "X")) {
    EXPECT_EQ(e["pid"], 0);
    EXPECT_GE(e["dur"].get<double>(), 0);
    if (e["cat"] == "step") steps.push_back(span_of(e));
    if (e["cat"] == "jit" && e["name"] == "replay") replays.push_back(span_of(e));
    if (e["cat"] == "kernel") kernels.push_back(e);
  }
  EXPECT_EQ(steps.size(), 4u);
  EXPECT_EQ(replays.size(), 2u);  // steps 3 and 4: step 1 runs normally, step 2 is captured
  // every replay is inside a step, and holds kernels
  for (const Span& r : replays) {
    bool inside = false;
    for (const Span& s : steps) inside = inside || s.contains(r);
    EXPECT_TRUE(inside);
    size_t held = 0;
    for (const auto& k : kernels) held += r.contains(span_of(k));
    EXPECT_GT(held, 3u);
  }
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels[0]["args"]["device"], "CPU");

  // A resume that traces too writes trace-2 beside the first start's file; merge takes the newest.
  std::vector<std::string> more = synth_run(dir, 6);
  more.push_back("train.resume=true");
  more.push_back("train.trace=true");
  run_train(parse_config("", "trace.yaml", more), {.progress = false});
  EXPECT_TRUE(fs::exists(dir / "trace.rank0.json"));
  ASSERT_TRUE(fs::exists(dir / "trace-2.rank0.json"));
  MergedTrace m = merge_traces(dir.string());
  EXPECT_EQ(m.path, (dir / "trace-2.json").string());
  EXPECT_EQ(m.ranks, 1);
  EXPECT_TRUE(m.notes.empty());
  json merged = read_json(m.path);
  EXPECT_EQ(merged["traceEvents"].size(), m.events);
  size_t merged_steps = 0;
  double earliest = 1e300;
  for (const auto& e : events_of(merged, "X")) {
    merged_steps += e["cat"] == "step";
    earliest = std::min(earliest, e["ts"].get<double>());
  }
  EXPECT_EQ(merged_steps, 2u);  // steps 5 and 6
  EXPECT_EQ(earliest, 0);       // shifted to start at 0
  EXPECT_GT(merged["otherData"]["ts_origin_us"].get<double>(), 1.5e15);  // 2017 and later, in microseconds
  fs::remove_all(dir);

  run_train(parse_config("", "trace.yaml", synth_run(plain, 4)), {.progress = false});
  EXPECT_FALSE(fs::exists(plain / "trace.rank0.json"));  // off by default
  EXPECT_FALSE(trace::enabled());
  fs::remove_all(plain);
}

TEST(TraceMerge, CommandAndErrors) {
  fs::path dir = testutil::fresh_run_dir("trace", "merge");
  fs::create_directories(dir);
  auto run = [](std::vector<std::string> args, std::string* err) {
    testutil::CliRun r = testutil::tg_run(std::move(args));
    *err = r.err;
    return std::make_pair(r.rc, r.out);
  };
  std::string err;
  EXPECT_EQ(run({"tg", "trace", "merge", (dir / "nope").string()}, &err).first, 1);
  EXPECT_EQ(err, "error: tg trace: no run directory '" + (dir / "nope").string() + "'\n");
  EXPECT_EQ(run({"tg", "trace", "merge", dir.string()}, &err).first, 1);
  EXPECT_EQ(err, "error: tg trace: no trace.rank<R>.json in '" + dir.string() +
                     "' (train with train.trace=true or TRACE=1 to record one)\n");
  EXPECT_EQ(run({"tg", "trace"}, &err).first, 1);
  EXPECT_NE(err.find("tg help trace"), std::string::npos) << err;

  // two ranks' files of a world of 3: merged with a note on the missing rank
  for (int r : {0, 2}) {
    trace::Recording rec;
    rec.events.push_back({"k", "kernel", 1, 1.7e15 + r * 10, 2});
    rec.lanes = {{1, "main"}, {5, "idle"}};  // a lane without events is left out
    std::ofstream(dir / ("trace.rank" + std::to_string(r) + ".json")) << chrome_trace_json(rec, r, 3, "CPU");
  }
  std::ofstream(dir / "trace.rank7.json.tmp") << "ignored";
  auto [rc, out] = run({"tg", "trace", "merge", dir.string(), "-o", (dir / "all.json").string()}, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(err, "tg trace: rank 1 of 3 has no trace.rank1.json (merged without it)\n");
  EXPECT_NE(out.find("wrote " + (dir / "all.json").string()), std::string::npos) << out;
  json merged = read_json(dir / "all.json");
  std::map<int, double> ts;
  for (const auto& e : events_of(merged, "X")) ts[e["pid"].get<int>()] = e["ts"].get<double>();
  EXPECT_EQ(ts, (std::map<int, double>{{0, 0.0}, {2, 20.0}}));
  EXPECT_EQ(thread_names(merged), (std::set<std::string>{"main"}));

  std::ofstream(dir / "trace.rank0.json") << "{\"traceEvents\": 3}";
  EXPECT_EQ(run({"tg", "trace", "merge", dir.string()}, &err).first, 1);
  EXPECT_EQ(err, "error: tg trace: '" + (dir / "trace.rank0.json").string() +
                     "' is no Chrome-trace file (a JSON object with traceEvents)\n");
  fs::remove_all(dir);
}

// Note [an all-reduce between backward kernels]: the gradients are bucketed so that the last
// layer's bucket is all-reduced while the first layer's gradient kernels still run. On each rank,
// in some step, the main thread queues an all-reduce A after a kernel (the one that made A's
// bucket), then runs kernels and queues a later all-reduce B before it waits for A: those kernels
// did not read A's result and made B's bucket, the rest of the backward pass; and A, on the
// communication thread, ran while one of them did. With one bucket there is no such B (the
// step's check all-reduce reads A's result, so it is queued after the wait for A).
TEST(TraceDdp, MergedTraceOfTwoRanksHasAllReducesBetweenBackwardKernels) {
#if !defined(TG_BIN) || !defined(MPIEXEC)
  GTEST_SKIP() << "built without MPI: no mpirun to start two ranks";
#else
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (package dataset-fashion-mnist)";
  fs::path dir = testutil::fresh_run_dir("trace", "ddp");
  fs::create_directories(dir);
  const std::string cmd = "timeout 180 " + std::string(MPIEXEC) + " --oversubscribe -np 2 " + TG_BIN + " train " +
                          TG_SOURCE_DIR + "/configs/fmnist_mlp.yaml distributed.strategy=ddp train.steps=4 " +
                          "distributed.bucket_mb=0.05 train.eval_batches=1 train.trace=true train.progress=off " +
                          "train.run_dir=" + (dir / "run").string() + " >" + (dir / "mpirun.out").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "mpirun.out");
  std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << cmd << "\n" << log_text;
  MergedTrace m = merge_traces((dir / "run").string());
  EXPECT_EQ(m.ranks, 2);
  EXPECT_TRUE(m.notes.empty());
  json merged = read_json(m.path);  // parses as JSON

  ASSERT_EQ(ranks_between(merged, 4), 2) << "ranks with an all-reduce between backward kernels";
  // a replayed step (the third) compiles nothing on either rank; the plot of step 3 spans both
  // ranks' third steps, so under load it may show a compile of the other rank's second step
  for (const auto& [rank, r] : rank_events(merged)) {
    std::vector<Span> steps = r.steps;
    std::sort(steps.begin(), steps.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    ASSERT_GE(steps.size(), 3u) << "rank " << rank;
    for (const Span& c : r.compiles)
      EXPECT_FALSE(c.end > steps[2].begin && c.begin < steps[2].end) << "rank " << rank << " compiled in step 3";
  }

  // tg trace plot: a replayed step's lanes as boxes in their categories' colours
  if (built_with_cairo()) {
    const fs::path svg = dir / "step.svg";
    EXPECT_EQ(plot_trace((dir / "run").string(), 3, svg.string()).rfind("run, step 3: ", 0), 0u);
    std::set<std::array<int, 3>> fills = svg_fills(svg);
    for (const char* cat : {"kernel", "collective", "wait", "jit", "step"})
      EXPECT_TRUE(fills.count(as_ints(category_colour(cat)))) << cat;
    EXPECT_TRUE(svg_fills(dir / "nothing.svg").empty());
    try {
      plot_trace((dir / "run").string(), 9, (dir / "x.png").string());
      ADD_FAILURE() << "step 9 was drawn";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "tg trace plot: --step 9: the trace has steps 1 to 4");
    }
  }
  fs::remove_all(dir);
#endif
}
