// The kernel pipeline.
//
// Note [the pass list]: a scheduled kernel (its graph rooted at STORE, as schedule/lower.cpp
// left it) becomes device source through these passes, in this order, and nowhere else:
//   choose      the optimizer's choice: hand-coded heuristics, or BEAM's search (BEAM=n), among
//               generated kernels with opts, the tensor-core layout and the device's library
//   optimize    apply the opts (codegen/opt.h): register tiles, unrolls, cache blocks
//   reduce bounds CPU-style devices: sum-reduce loops skip the iterations a gate on their
//               variable makes zero (codegen/reduce_bounds.h)
//   map threads GPU-style devices: output loops become thread indices, long reductions are
//               shared by a work-group, on the graph (codegen/gpu_dims.h); the launch sizes
//               come back beside it
//   decompose   transcendental functions in plain arithmetic where the device has no fast ones
//               (codegen/transcendental.h)
//   linearize   the graph as uops in execution order, loops opened and closed, reduces as
//               accumulators, half types computed in float32 (codegen/linearize.h)
//   host threads CPU-style devices: the outermost loop is what a launch splits over the thread
//               pool (Note [when to thread] in codegen/linearize.cpp)
//   render      the device's source (codegen/render_*.h)
// A tensor-core choice replaces optimize, map threads and linearize by its own layout
// (codegen/tensor_core.h), and a bf16 dot choice optimize and linearize (codegen/cpu_dot.h); a
// library choice stops after choose (the library runs the kernel). A TEMPLATE_KERNEL item skips
// them all: its template is rendered for the device (Note [template kernels] in
// codegen/attention_kernel.cpp).
// With DEBUG=5 every pass prints the kernel as it leaves it, under the pass's name.
#include "tinygrad/codegen/pipeline.h"

#include <cstdio>
#include <sstream>
#include <unordered_map>

#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/codegen/cpu_dot.h"
#include "tinygrad/codegen/gpu_dims.h"
#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/opt_gpu.h"
#include "tinygrad/codegen/reduce_bounds.h"
#include "tinygrad/codegen/tensor_core.h"
#include "tinygrad/codegen/transcendental.h"
#include "tinygrad/engine/beam.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

namespace {

// ---- DEBUG=5: the kernel after each pass ----

std::string arg_text(const UOp& u) {
  if (u.op == Op::CONST) {
    std::ostringstream os;
    os << u.const_value();
    return " " + os.str();
  }
  if (auto* v = std::get_if<int64_t>(&u.arg)) return " {" + std::to_string(*v) + "}";
  if (auto* v = std::get_if<Op>(&u.arg)) return std::string(" {") + op_name(*v) + "}";
  if (auto* v = std::get_if<std::vector<int64_t>>(&u.arg)) return " {" + shape_str(*v) + "}";
  return "";
}

// One line per node, sources by number: "%7 = ADD float32 %5 %6".
std::string graph_text(const UOpPtr& root) {
  std::unordered_map<const UOp*, size_t> id;
  std::string out;
  for (auto& n : toposort({root})) {
    id[n.get()] = id.size();
    out += "  %" + std::to_string(id[n.get()]) + " = " + op_name(n->op) + " " + dtype_name(n->dtype);
    for (auto& s : n->src) out += " %" + std::to_string(id.at(s.get()));
    out += arg_text(*n) + "\n";
  }
  return out;
}

// One line per uop, indented by loop depth; constants inline.
std::string linear_text(const LinearKernel& k) {
  std::unordered_map<const UOp*, size_t> id;
  std::string out = "  global " + shape_str(k.global_size) + " local " + shape_str(k.local_size) + "\n";
  int depth = 0;
  for (auto& u : k.uops) {
    if (u->op == Op::ENDRANGE) depth--;
    id[u.get()] = id.size();
    out += std::string(static_cast<size_t>(2 + 2 * std::max(depth, 0)), ' ') + "%" + std::to_string(id[u.get()]) +
           " = " + op_name(u->op) + " " + dtype_name(u->dtype);
    for (auto& s : u->src) {
      auto it = id.find(s.get());
      if (it != id.end()) out += " %" + std::to_string(it->second);
      else if (s->op == Op::CONST) out += " (" + arg_text(*s).substr(1) + ")";
      else out += " ?";
    }
    if (u->op != Op::CONST) out += arg_text(*u);
    out += "\n";
    if (u->op == Op::RANGE) depth++;
  }
  return out;
}

// Prints what a pass left with DEBUG=5.
class PassLog {
 public:
  explicit PassLog(std::string kernel) : kernel_(std::move(kernel)), on_(knobs::DEBUG >= 5) {}
  // The graph after `pass`; `before` is what the pass was given (a pass that changed nothing
  // prints only its name).
  void graph(const char* pass, const UOpPtr& ast, const UOpPtr& before = nullptr) const {
    if (!on_) return;
    if (ast == before) std::fprintf(stderr, "--- %s: %s (unchanged)\n", pass, kernel_.c_str());
    else std::fprintf(stderr, "--- %s: %s\n%s", pass, kernel_.c_str(), graph_text(ast).c_str());
  }
  void linear(const char* pass, const LinearKernel& k) const {
    if (on_) std::fprintf(stderr, "--- %s: %s\n%s", pass, k.name.c_str(), linear_text(k).c_str());
  }
  void source(const LinearKernel& k, const std::string& src) const {
    if (on_) std::fprintf(stderr, "--- render: %s\n%s\n", k.name.c_str(), src.c_str());
  }

 private:
  std::string kernel_;
  bool on_;
};

// ---- the passes after the choice ----

UOpPtr decompose(const UOpPtr& ast, const CodegenTarget& target) {
  return target.native_transcendentals ? ast : decompose_transcendentals(ast);
}

LoweredKernel rendered(const KernelChoice& choice, LinearKernel k, const CodegenTarget& target, const PassLog& log) {
  std::string src = target.renderer.render(k);
  log.source(k, src);
  return LoweredKernel{choice, std::move(k), std::move(src)};
}

LoweredKernel tensor_core_passes(const UOpPtr& ast, const std::vector<DType>& dtypes, const CodegenTarget& target,
                                 const KernelChoice& choice, const PassLog& log) {
  UOpPtr g = decompose(ast, target);
  log.graph("decompose", g, ast);
  std::optional<LinearKernel> k = tensor_core_kernel(g, dtypes);
  TG_ASSERT(k, "tensor-core layout chosen for a kernel it does not take");
  log.linear("tensor-core layout", *k);
  return rendered(choice, std::move(*k), target, log);
}

LoweredKernel bf16_dot_passes(const UOpPtr& ast, const std::vector<DType>& dtypes, const CodegenTarget& target,
                              const KernelChoice& choice, const PassLog& log) {
  UOpPtr g = decompose(ast, target);
  log.graph("decompose", g, ast);
  std::optional<LinearKernel> k = bf16_dot_kernel(g, dtypes, target.policy.cpu.l2_bytes);
  TG_ASSERT(k, "bf16 dot tiles chosen for a kernel they do not take");
  log.linear("bf16 dot tiles", *k);
  k->global_size = launch_size(*k);
  log.linear("host threads", *k);
  return rendered(choice, std::move(*k), target, log);
}

// ---- the choice ----

// The library's choice when it runs item's kernel (a matrix product, MATMUL_LIB=1).
std::optional<KernelChoice> library_choice(const ScheduleItem& item, Device& dev) {
  if (!knobs::MATMUL_LIB.get()) return std::nullopt;
  auto spec = match_matmul(item.ast, param_dtypes(item));
  if (!spec) return std::nullopt;
  spec->allow_tf32 = tf32_for(Float32Product::Matmul);
  if (!dev.get_matmul_program(*spec)) return std::nullopt;
  return KernelChoice{KernelChoice::Kind::Library, {}, *spec};
}

// The tensor-core choice when the device has them, the precision policy lets this product use
// them (Note [float32 precision policy] in knobs.h) and the layout takes the kernel.
std::optional<KernelChoice> tensor_core_choice(const ScheduleItem& item, Device& dev) {
  if (knobs::NOOPT.get() || !dev.supports(Feature::TensorCores)) return std::nullopt;
  std::vector<DType> dtypes = param_dtypes(item);
  bool matmul = match_matmul(item.ast, dtypes).has_value();
  if (!tf32_for(matmul ? Float32Product::Matmul : Float32Product::Convolution)) return std::nullopt;
  if (!tensor_core_kernel(decompose(item.ast, CodegenTarget::of(dev)), dtypes)) return std::nullopt;
  return KernelChoice{KernelChoice::Kind::TensorCores, {}, std::nullopt};
}

// The bf16 dot tiles where the CPU has them (CpuLimits::bf16_dot) and they take the kernel.
std::optional<KernelChoice> bf16_dot_choice(const ScheduleItem& item, Device& dev) {
  const DevicePolicy& policy = dev.policy();
  if (knobs::NOOPT.get() || policy.gpu || !policy.cpu.bf16_dot) return std::nullopt;
  if (!bf16_dot_kernel(decompose(item.ast, CodegenTarget::of(dev)), param_dtypes(item), policy.cpu.l2_bytes))
    return std::nullopt;
  return KernelChoice{KernelChoice::Kind::Bf16Dot, {}, std::nullopt};
}

std::vector<Opt> hand_coded_for(const UOpPtr& ast, const DevicePolicy& policy) {
  if (knobs::NOOPT.get()) return {};
  return policy.gpu ? gpu_hand_coded_opts(ast, *policy.gpu) : hand_coded_opts(ast, policy.cpu);
}

}  // namespace

std::vector<DType> param_dtypes(const ScheduleItem& item) {
  std::vector<DType> d;
  for (auto& b : item.buffers) d.push_back(b->dtype());
  return d;
}

CodegenTarget CodegenTarget::of(const Device& dev) {
  return CodegenTarget{dev.renderer(), dev.policy(), dev.supports(Feature::NativeTranscendentals),
                       dev.supports(Feature::TensorCores)};
}

std::string KernelChoice::str() const {
  switch (kind) {
    case Kind::Generated: return opts_str(opts);
    case Kind::TensorCores: return "tensor cores";
    case Kind::Library: return "library" + (matmul ? " " + matmul->key() : std::string());
    case Kind::Template: return "template";
    case Kind::Bf16Dot: return "bf16 dot";
  }
  return "";
}

KernelChoice parse_choice(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (t == "tensor cores") return KernelChoice{KernelChoice::Kind::TensorCores, {}, std::nullopt};
  if (t == "bf16 dot") return KernelChoice{KernelChoice::Kind::Bf16Dot, {}, std::nullopt};
  if (t.rfind("library", 0) == 0) return KernelChoice{KernelChoice::Kind::Library, {}, std::nullopt};
  return KernelChoice::generated(parse_opts(t));
}

LoweredKernel lower_with_choice(const UOpPtr& ast, const std::vector<DType>& param_dtypes, const CodegenTarget& target,
                                const KernelChoice& choice) {
  TG_ASSERT(choice.kind != KernelChoice::Kind::Library, "lower_with_choice: a library kernel has no source");
  PassLog log(op_name(ast->op));
  log.graph("scheduled kernel", ast);
  if (choice.kind == KernelChoice::Kind::TensorCores) return tensor_core_passes(ast, param_dtypes, target, choice, log);
  if (choice.kind == KernelChoice::Kind::Bf16Dot) return bf16_dot_passes(ast, param_dtypes, target, choice, log);
  UOpPtr g = choice.opts.empty() ? ast : apply_opts(ast, choice.opts);
  log.graph("optimize", g, ast);
  std::optional<ThreadMappedKernel> mapped;
  if (!target.policy.gpu) {  // Note [reduce loops skip gated zeros] in codegen/reduce_bounds.cpp
    UOpPtr before = g;
    g = bound_reduce_loops(g);
    log.graph("reduce bounds", g, before);
  }
  if (target.policy.gpu) {
    mapped = map_threads(g, *target.policy.gpu);
    log.graph("map threads", mapped->ast, g);
    g = mapped->ast;
  }
  UOpPtr before = g;
  g = decompose(g, target);
  log.graph("decompose", g, before);
  LinearKernel k = linearize(g, param_dtypes);
  if (mapped) set_launch(k, mapped->launch);
  log.linear("linearize", k);
  if (!mapped) {
    k.global_size = launch_size(k);
    log.linear("host threads", k);
  }
  return rendered(choice, std::move(k), target, log);
}

KernelChoice heuristic_choice(const ScheduleItem& item, Device& dev) {
  if (auto lib = library_choice(item, dev)) return *lib;
  if (auto tc = tensor_core_choice(item, dev)) return *tc;
  if (auto dot = bf16_dot_choice(item, dev)) return *dot;
  return KernelChoice::generated(hand_coded_for(item.ast, dev.policy()));
}

std::vector<KernelChoice> alternative_choices(const ScheduleItem& item, Device& dev) {
  std::vector<KernelChoice> out;
  if (auto tc = tensor_core_choice(item, dev)) out.push_back(*tc);
  if (auto dot = bf16_dot_choice(item, dev)) out.push_back(*dot);
  if (auto lib = library_choice(item, dev)) out.push_back(*lib);
  return out;
}

LoweredKernel lower_kernel_item(const ScheduleItem& item, Device& dev) {
  if (item.ast->op == Op::TEMPLATE_KERNEL) {  // Note [template kernels] in codegen/attention_kernel.cpp
    TemplateSource t = render_template_kernel(*item.ast, dev.renderer());
    PassLog(t.kernel.name).source(t.kernel, t.source);
    if (knobs::DEBUG >= 3) std::fprintf(stderr, "opts %-40s template\n", t.kernel.name.c_str());
    if (knobs::DEBUG >= 4) std::fprintf(stderr, "%s\n", t.source.c_str());
    return LoweredKernel{KernelChoice{KernelChoice::Kind::Template, {}, std::nullopt}, std::move(t.kernel),
                         std::move(t.source)};
  }
  bool search = knobs::BEAM.get() > 0 && !knobs::NOOPT.get();
  KernelChoice choice = search ? beam_search(item, knobs::BEAM.get()) : heuristic_choice(item, dev);
  if (choice.kind == KernelChoice::Kind::Library) {
    if (knobs::DEBUG >= 3)
      std::fprintf(stderr, "library %-40s %s\n", choice.matmul->name().c_str(), choice.matmul->key().c_str());
    return LoweredKernel{choice, {}, ""};
  }
  LoweredKernel lowered = lower_with_choice(item.ast, param_dtypes(item), CodegenTarget::of(dev), choice);
  if (knobs::DEBUG >= 3) std::fprintf(stderr, "opts %-40s %s\n", lowered.kernel.name.c_str(), choice.str().c_str());
  if (knobs::DEBUG >= 4) std::fprintf(stderr, "%s\n", lowered.source.c_str());
  return lowered;
}

}  // namespace tg
