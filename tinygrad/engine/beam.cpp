// BEAM search. Each round extends every opt list in the beam by one more UPCAST or UNROLL,
// compiles and times each candidate on the kernel's buffers (the output buffer is scratch until
// the real launch), and keeps the `width` fastest; it stops when a round finds nothing faster
// (Note [beam over generated kernels]). The best generated kernel is then timed against the
// tensor-core layout and the device library where they apply. Every candidate goes through the
// kernel pipeline (codegen/pipeline.h), as the kernel that runs does.
#include "tinygrad/engine/beam.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include <unistd.h>

#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

namespace {

constexpr int MAX_ROUNDS = 4;
constexpr int64_t MAX_LANES = 128;  // wider kernels take LLVM seconds to compile and rarely win
constexpr int TIMING_RUNS = 3;
constexpr int64_t AMOUNTS[] = {2, 3, 4, 5, 8, 16, 32};

// A text that identifies a kernel graph exactly: one line per node, sources by position.
std::string kernel_key(const UOpPtr& ast) {
  std::unordered_map<const UOp*, size_t> id;
  std::string key;
  for (auto& n : toposort({ast})) {
    id[n.get()] = id.size();
    key += op_name(n->op);
    key += " ";
    key += dtype_name(n->dtype);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>) key += " i" + std::to_string(v);
          else if constexpr (std::is_same_v<T, double>) {
            char buf[32];
            std::snprintf(buf, sizeof buf, " d%a", v);
            key += buf;
          } else if constexpr (std::is_same_v<T, Op>) key += std::string(" ") + op_name(v);
          else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            for (auto x : v) key += " v" + std::to_string(x);
          }
        },
        n->arg);
    for (auto& s : n->src) key += " %" + std::to_string(id.at(s.get()));
    key += "\n";
  }
  return key;
}

std::string cache_path(const ScheduleItem& item, Device& dev) {
  std::string key = dev.compiler().cache_key() + "\n" + codegen_key() + "\n";
  for (auto& b : item.buffers) key += std::string(dtype_name(b->dtype())) + " ";
  key += "\n" + kernel_key(item.ast);
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(stable_hash(key)));
  return (std::filesystem::path(cache_dir()) / "beam" / (std::string(hex) + ".txt")).string();
}

std::vector<Opt> actions(const UOpPtr& ast) {
  std::vector<Opt> out;
  for (auto& ax : kernel_axes(ast))
    for (int64_t a : AMOUNTS) {
      Opt o{ax.reduce ? OptOp::UNROLL : OptOp::UPCAST, ax.id, a};
      if (opt_applies(ast, o)) out.push_back(o);
    }
  return out;
}

// Note [failed candidates]: a candidate fails when the device compiler refuses its source
// (CompileError, Note [compile errors] in tinygrad/error.h): a kernel too large or too wide for
// the compiler is a candidate to skip, not a reason to stop the search. Nothing else a candidate
// throws is expected: opts come from opt_applies and MAX_LANES, and a kernel that compiles also
// launches (CUDA kernels carry __launch_bounds__ of their block, so the compiler keeps them within
// the registers a launch needs). Any other error (a user mistake, a broken device, an internal
// assert) propagates to the caller.
// Seconds for one launch of the program (the best of TIMING_RUNS).
double time_program(Program& prog, const std::vector<void*>& ptrs, const LinearKernel& k) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < TIMING_RUNS; i++)
    best = std::min(best, prog.launch(ptrs, k.global_size, k.local_size, true).value_or(best));
  return best;
}

// Seconds for one launch of item's kernel as `choice` makes it, or infinity when the candidate
// fails to compile. Generated and tensor-core candidates go through the kernel pipeline
// (codegen/pipeline.h), the library's through its program.
double time_candidate(const ScheduleItem& item, Device& dev, const KernelChoice& choice, const std::vector<void*>& ptrs) {
  if (choice.kind == KernelChoice::Kind::Library) return time_program(*dev.get_matmul_program(*choice.matmul), ptrs, {});
  try {
    LoweredKernel k = lower_with_choice(item.ast, param_dtypes(item), CodegenTarget::of(dev), choice);
    return time_program(dev.get_program(k.kernel.name, k.source), ptrs, k.kernel);
  } catch (const CompileError& e) {
    if (knobs::DEBUG >= 3) std::fprintf(stderr, "beam: %s failed: %s\n", choice.str().c_str(), e.what());
    return std::numeric_limits<double>::infinity();
  }
}

// A choice read back from the disk cache, or nullopt when the entry is damaged or stale.
std::optional<KernelChoice> cached_choice(const std::string& path, const ScheduleItem& item, Device& dev) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), {});
  try {
    KernelChoice c = parse_choice(text);
    if (c.kind == KernelChoice::Kind::Generated) {
      apply_opts(item.ast, c.opts);  // still valid for this kernel
      return c;
    }
    for (auto& alt : alternative_choices(item, dev))
      if (alt.kind == c.kind) return alt;
  } catch (const Error&) {
  }
  return std::nullopt;  // search again and overwrite it
}

// Note [beam over generated kernels]: the search starts from the kernel without opts and from the
// heuristics' opts, extends the beam by one UPCAST or UNROLL per round and keeps the `width`
// fastest, until a round finds nothing faster.
std::pair<double, std::vector<Opt>> search_opts(const ScheduleItem& item, Device& dev, int width,
                                                const std::vector<void*>& ptrs, int& tried) {
  std::vector<Opt> best_opts;
  double best = time_candidate(item, dev, KernelChoice::generated({}), ptrs);
  std::vector<std::vector<Opt>> beam{{}};
  KernelChoice heuristic = heuristic_choice(item, dev);
  tried = 1;
  if (heuristic.kind == KernelChoice::Kind::Generated && !heuristic.opts.empty() &&
      lane_count(heuristic.opts) <= MAX_LANES) {
    double t = time_candidate(item, dev, heuristic, ptrs);
    tried++;
    if (t < best) best = t, best_opts = heuristic.opts;
  }
  for (int round = 0; round < MAX_ROUNDS; round++) {
    std::multimap<double, std::vector<Opt>> timed;
    for (auto& base : beam) {
      UOpPtr ast = apply_opts(item.ast, base);
      for (auto& a : actions(ast)) {
        std::vector<Opt> cand = base;
        cand.push_back(a);
        if (lane_count(cand) > MAX_LANES) continue;
        timed.emplace(time_candidate(item, dev, KernelChoice::generated(cand), ptrs), cand);
        tried++;
      }
    }
    if (timed.empty() || !(timed.begin()->first < best)) break;
    best = timed.begin()->first;
    best_opts = timed.begin()->second;
    beam.clear();
    for (auto& [t, c] : timed) {
      if (static_cast<int>(beam.size()) >= width || !(t < std::numeric_limits<double>::infinity())) break;
      beam.push_back(c);
    }
  }
  return {best, best_opts};
}

}  // namespace

KernelChoice beam_search(const ScheduleItem& item, int width) {
  Device& dev = get_device(item.device);
  TG_CHECK(dev.supports(Feature::Timing), "BEAM: device ", item.device, " cannot time kernels");
  std::string path = cache_path(item, dev);
  if (auto c = cached_choice(path, item, dev)) return *c;
  // Candidates write scratch outputs: an accumulating store (Note [accumulating stores] in
  // schedule/lower.cpp) would otherwise add into the real output once per timed launch.
  std::vector<std::shared_ptr<Buffer>> scratch;
  std::vector<void*> ptrs;
  for (size_t p = 0; p < item.buffers.size(); p++) {
    auto& b = item.buffers[p];
    if (p < item.outputs) scratch.push_back(std::make_shared<Buffer>(b->device(), b->dtype(), b->numel()));
    ptrs.push_back(p < item.outputs ? scratch.back()->ensure_allocated() : b->ensure_allocated());
  }

  auto t0 = std::chrono::steady_clock::now();
  int tried = 0;
  auto [best, best_opts] = search_opts(item, dev, width, ptrs, tried);
  KernelChoice choice = KernelChoice::generated(best_opts);
  for (auto& alt : alternative_choices(item, dev)) {  // the tensor cores and the library
    double t = time_candidate(item, dev, alt, ptrs);
    tried++;
    if (t < best) best = t, choice = alt;
  }
  if (knobs::DEBUG >= 2)
    std::fprintf(stderr, "beam: %d candidates in %.2f s, best %.3f ms: %s\n", tried,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), best * 1e3,
                 choice.str().c_str());
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  { std::ofstream(tmp) << choice.str() << "\n"; }
  std::filesystem::rename(tmp, path);
  return choice;
}

}  // namespace tg
