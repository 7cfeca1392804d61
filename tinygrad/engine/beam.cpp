// BEAM search. Each round extends every opt list in the beam by one more UPCAST or UNROLL,
// compiles and times each candidate on the kernel's buffers (the output buffer is scratch until
// the real launch), and keeps the `width` fastest; it stops when a round finds nothing faster.
#include "tinygrad/engine/beam.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <unordered_map>

#include <unistd.h>

#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/renderer.h"
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
  std::string key = dev.compiler().cache_key() + "\n";
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
// Seconds for one launch of item's kernel with opts (the best of TIMING_RUNS), or infinity when
// the candidate fails to compile.
double time_candidate(const ScheduleItem& item, Device& dev, const std::vector<Opt>& opts,
                      const std::vector<void*>& ptrs) {
  std::vector<DType> dtypes;
  for (auto& b : item.buffers) dtypes.push_back(b->dtype());
  try {
    LinearKernel k = linearize(device_kernel_graph(item, opts), dtypes);
    dev.renderer().prepare(k);
    Program& prog = dev.get_program(k.name, dev.renderer().render(k));
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < TIMING_RUNS; i++)
      best = std::min(best, prog.launch(ptrs, k.global_size, k.local_size, true).value_or(best));
    return best;
  } catch (const CompileError& e) {
    if (knobs::DEBUG >= 3) std::fprintf(stderr, "beam: %s failed: %s\n", opts_str(opts).c_str(), e.what());
    return std::numeric_limits<double>::infinity();
  }
}

}  // namespace

std::vector<Opt> beam_search(const ScheduleItem& item, int width) {
  Device& dev = get_device(item.device);
  TG_CHECK(dev.supports(Feature::Timing), "BEAM: device ", item.device, " cannot time kernels");
  std::string path = cache_path(item, dev);
  if (std::ifstream in(path); in) {
    std::string text((std::istreambuf_iterator<char>(in)), {});
    try {
      auto opts = parse_opts(text);
      apply_opts(item.ast, opts);  // still valid for this kernel
      return opts;
    } catch (const Error&) {
      // a damaged or stale entry: search again and overwrite it
    }
  }
  std::vector<void*> ptrs;
  for (auto& b : item.buffers) ptrs.push_back(b->ensure_allocated());

  auto t0 = std::chrono::steady_clock::now();
  std::vector<Opt> best_opts;
  double best = time_candidate(item, dev, {}, ptrs);
  std::vector<std::vector<Opt>> beam{{}};
  int tried = 1;
  for (int round = 0; round < MAX_ROUNDS; round++) {
    std::multimap<double, std::vector<Opt>> timed;
    for (auto& base : beam) {
      UOpPtr ast = apply_opts(item.ast, base);
      for (auto& a : actions(ast)) {
        std::vector<Opt> cand = base;
        cand.push_back(a);
        if (lane_count(cand) > MAX_LANES) continue;
        timed.emplace(time_candidate(item, dev, cand, ptrs), cand);
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
  if (knobs::DEBUG >= 2)
    std::fprintf(stderr, "beam: %d candidates in %.2f s, best %.3f ms: %s\n", tried,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), best * 1e3,
                 opts_str(best_opts).c_str());
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  { std::ofstream(tmp) << opts_str(best_opts) << "\n"; }
  std::filesystem::rename(tmp, path);
  return best_opts;
}

}  // namespace tg
