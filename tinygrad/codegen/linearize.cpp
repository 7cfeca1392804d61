// The linearizer: a kernel graph as uops in execution order. On GPU-style devices the graph
// comes thread-mapped (codegen/gpu_dims.h): its output loops are already thread indices, and a
// REDUCE shared by a work-group carries the group's thread index (it becomes a GroupReduce).
//
// Note [placement]: the outer loops (the output's dimensions) are opened first. Uops then follow
// in topological order. An accumulator (DEFINE_ACC) is declared where its REDUCE was; before it
// come the parts of the reduce's input that do not depend on the reduce loops (hoisted), then the
// reduce loops open, the dependent part and the ASSIGN run inside, and the loops close.
//
// Note [accumulator groups]: after UPCAST and UNROLL (codegen/opt.h) a kernel has one accumulator
// per lane, all over the same reduce loops. They form a group that opens those loops once: every
// member's hoisted part first, then all the declarations, the loops, every member's update, and
// the loops close. The lanes' arithmetic thus sits side by side in one loop body, where the
// backend compiler can vectorize it.
//
// Note [row loops]: in a kernel that reads a reduce back over the reduced row (softmax as one
// kernel, Note [row fusion] in schedule/schedule.cpp) some output loops are ones no accumulator
// depends on: the loops over a row's elements. Only the others (the row loops) open first and
// are the kernel's global size; everything that does not depend on the row's element loops (the
// row's reductions, in order) comes next, then those loops open around the rest.
#include "tinygrad/codegen/linearize.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/reduce_bounds.h"
#include "tinygrad/error.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {

// v rounded to half type `half` and widened back: the value an element of that type holds.
float held_by(DType half, float v) {
  return half == DType::Float16 ? half_to_float(float_to_half(v)) : bfloat_to_float(float_to_bfloat(v));
}

// Whether float32 value y is one that half type `half` holds exactly: a widened half of that
// type, a constant it holds, or a select, maximum or negation of such values (each returns one
// of its operands' values, or its negation).
bool exact_in(const UOpPtr& y, DType half, int depth = 0) {
  if (y->dtype != DType::Float32 || depth > 8) return false;
  switch (y->op) {
    case Op::CAST: return y->src[0]->dtype == half;
    case Op::CONST: {
      auto v = static_cast<float>(y->const_value());
      return v == held_by(half, v);
    }
    case Op::WHERE: return exact_in(y->src[1], half, depth + 1) && exact_in(y->src[2], half, depth + 1);
    case Op::MAX: return exact_in(y->src[0], half, depth + 1) && exact_in(y->src[1], half, depth + 1);
    case Op::NEG: return exact_in(y->src[0], half, depth + 1);
    default: return false;
  }
}

// Note [exact half results]: half-type ALU runs in float32 and is rounded back after every op, so
// a value crossing from one op to the next is rounded and widened again. Where the float32 value
// is already one the half type holds (a select between half values, as a PAD's gate makes: the
// q/k/v gradient assembly of GPT-2 rounded each of its three pieces twice), the rounding is the
// identity and the value is used as it is.
UOpPtr to_float32(const UOpPtr& x) {
  if (!is_half(x->dtype)) return x;
  if (x->op == Op::CAST && exact_in(x->src[0], x->dtype)) return x->src[0];  // Note [exact half results]
  if (x->op == Op::CONST)  // the constant as the half type holds it
    return kconst(DType::Float32, held_by(x->dtype, static_cast<float>(x->const_value())));
  return kcast(x, DType::Float32);
}

// ALU on float16/bfloat16 runs in float32, rounded back after every op.
UOpPtr upcast_half_alu(const UOpPtr& store) {
  PatternMatcher pm({{{}, "half alu in float32", [](const UOpPtr& u) -> UOpPtr {
                        if (!is_alu(u->op) || u->op == Op::CAST || u->op == Op::BITCAST) return nullptr;
                        bool any = is_half(u->dtype);
                        for (auto& s : u->src) any |= is_half(s->dtype);
                        if (!any) return nullptr;
                        std::vector<UOpPtr> src;
                        for (auto& s : u->src) src.push_back(to_float32(s));
                        DType out = is_half(u->dtype) ? DType::Float32 : u->dtype;
                        return kcast(make_uop(u->op, out, src, u->arg), u->dtype);
                      }},
                     {{Op::REDUCE}, "half reduce in float32", [](const UOpPtr& u) -> UOpPtr {
                        if (!is_half(u->dtype)) return nullptr;
                        auto src = u->src;
                        src[0] = to_float32(src[0]);
                        return kcast(make_uop(Op::REDUCE, DType::Float32, src, u->arg), u->dtype);
                      }}});
  return graph_rewrite(store, pm);
}

}  // namespace

double reduce_identity(Op op, DType dt) {
  if (op == Op::ADD) return 0;
  if (op == Op::MUL) return 1;
  return dtype_min(dt);  // MAX
}

UOpPtr group_lid(const UOpPtr& reduce) {
  if (reduce->op != Op::REDUCE) return nullptr;
  const UOpPtr& last = reduce->src.back();
  bool packed = last->op == Op::MOD && last->src[0]->op == Op::SPECIAL;  // Note [packed groups] in gpu_dims.cpp
  return last->op == Op::SPECIAL || packed ? last : nullptr;
}

namespace {

// A grouped reduction's GroupReduce from its accumulator and thread index: threads lid's range
// (a SPECIAL's size) or the modulus that packs several groups into a work-group.
GroupReduce group_reduce(const UOpPtr& acc, const UOpPtr& lid, Op op) {
  if (lid->op == Op::SPECIAL) return {acc, lid, static_cast<int64_t>(lid->src[0]->const_value()), op};
  auto size = static_cast<int64_t>(lid->src[1]->const_value());
  return {acc, lid, size, op, static_cast<int64_t>(lid->src[0]->src[0]->const_value()) / size};
}

// The loops a reduce runs over (its sources after the value, less a work-group's thread index).
std::vector<UOpPtr> reduce_loops(const UOpPtr& reduce) {
  size_t end = reduce->src.size() - (group_lid(reduce) ? 1 : 0);
  return std::vector<UOpPtr>(reduce->src.begin() + 1, reduce->src.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

// Note [row loops]
KernelLoops kernel_loops(const UOpPtr& ast) {
  auto order = toposort({ast});
  std::unordered_set<const UOp*> reduce_ranges;
  std::vector<UOpPtr> reduces;
  for (auto& n : order)
    if (n->op == Op::REDUCE) {
      reduces.push_back(n);
      for (auto& r : reduce_loops(n)) reduce_ranges.insert(r.get());
    }
  // which ranges each node depends on (not through a reduce's own loops)
  std::unordered_map<const UOp*, std::set<const UOp*>> deps;
  for (auto& n : order) {
    std::set<const UOp*>& d = deps[n.get()];
    if (n->op == Op::RANGE) d.insert(n.get());
    if (n->op == Op::REDUCE) {
      d = deps.at(n->src[0].get());
      for (auto& r : reduce_loops(n)) d.erase(r.get());
    } else {
      for (auto& s : n->src) d.insert(deps.at(s.get()).begin(), deps.at(s.get()).end());
    }
  }
  std::set<const UOp*> reduce_deps;
  for (auto& r : reduces) reduce_deps.insert(deps.at(r.get()).begin(), deps.at(r.get()).end());
  KernelLoops loops;
  for (auto& n : order)
    if (n->op == Op::RANGE && !reduce_ranges.count(n.get()))
      (reduces.empty() || reduce_deps.count(n.get()) ? loops.outer : loops.row_elements).push_back(n);
  auto by_id = [](const UOpPtr& a, const UOpPtr& b) { return a->arg_int() < b->arg_int(); };
  std::sort(loops.outer.begin(), loops.outer.end(), by_id);
  std::sort(loops.row_elements.begin(), loops.row_elements.end(), by_id);
  for (auto& r : reduces)
    if (std::none_of(reduces.begin(), reduces.end(), [&](const UOpPtr& other) {
          auto other_loops = reduce_loops(other);
          return std::any_of(other_loops.begin(), other_loops.end(),
                             [&](const UOpPtr& l) { return deps.at(r.get()).count(l.get()) > 0; });
        }))
      loops.top_reduces.push_back(r);
  return loops;
}

std::string kernel_name(const UOpPtr& ast) {
  KernelLoops loops = kernel_loops(ast);
  UOpPtr first_reduce;
  int64_t stores = 0;
  std::set<const UOp*> outputs;
  for (auto& n : toposort({ast})) {
    if (n->op == Op::REDUCE && !first_reduce) first_reduce = n;
    stores += n->op == Op::STORE;
    if (n->op == Op::STORE) outputs.insert(n->src[0].get());
  }
  std::string name = first_reduce ? "r" : "E";
  for (auto& r : loops.outer) name += "_" + std::to_string(static_cast<int64_t>(r->src[0]->const_value()));
  if (first_reduce) {
    auto rl = reduce_loops(first_reduce);
    for (size_t i = 0; i < rl.size(); i++)
      name += (i == 0 ? "__" : "_") + std::to_string(max_trip(*rl[i]));
  }
  auto n_outputs = static_cast<int64_t>(outputs.size());
  if (stores > n_outputs) name += "_x" + std::to_string(stores / n_outputs);  // upcast lanes
  if (n_outputs > 1) name += "_o" + std::to_string(n_outputs);  // Note [kernels with several outputs]
  return name;
}

namespace {

// Builds a LinearKernel from a kernel graph (Note [placement], [accumulator groups], [row loops],
// [lanes in lockstep]).
class Linearizer {
 public:
  Linearizer(const UOpPtr& ast, const std::vector<DType>& param_dtypes) : ast_(upcast_half_alu(ast)) {
    std::set<int64_t> stored;  // the parameters the kernel's STOREs write
    for (auto& n : toposort({ast_}))
      if (n->op == Op::STORE && n->src[0]->op == Op::DEFINE_GLOBAL) stored.insert(n->src[0]->arg_int());
    for (size_t i = 0; i < param_dtypes.size(); i++)
      k_.params.push_back({param_dtypes[i], stored.count(static_cast<int64_t>(i)) > 0});
  }

  LinearKernel run() {
    KernelLoops loops = kernel_loops(ast_);
    UOpPtr root = make_accumulators();
    for (auto& r : loops.outer) {
      k_.uops.push_back(r);
      k_.global_size.push_back(static_cast<int64_t>(r->src[0]->const_value()));
      emitted_.insert(r.get());
    }
    if (!loops.row_elements.empty()) {
      std::set<const UOp*> element_loops;
      for (auto& r : loops.row_elements) element_loops.insert(r.get());
      emit_tree(root, &element_loops);
      for (auto& r : loops.row_elements) append(r);
    }
    if (lane_count(root) > 1) emit_lanes(root);
    emit_tree(root, nullptr);
    for (size_t i = loops.row_elements.size(); i-- > 0;) close(loops.row_elements[i]);
    for (size_t i = loops.outer.size(); i-- > 0;) close(loops.outer[i]);
    for (auto& u : k_.uops)
      if (auto it = group_lid_.find(u.get()); it != group_lid_.end())
        k_.group_reduces.push_back(group_reduce(u, it->second, assign_of_.at(u.get())->src[1]->op));
    k_.name = kernel_name(ast_);
    return std::move(k_);
  }

 private:
  UOpPtr ast_;
  LinearKernel k_;
  std::unordered_map<const UOp*, UOpPtr> assign_of_;  // DEFINE_ACC -> ASSIGN
  std::unordered_map<const UOp*, UOpPtr> group_lid_;  // DEFINE_ACC of a work-group -> its thread index
  std::vector<UOpPtr> accs_;                          // in creation order
  std::unordered_map<const UOp*, std::set<const UOp*>> deps_;
  std::unordered_set<const UOp*> emitted_;

  void append(const UOpPtr& u) {  // a uop; a RANGE opens its loop
    k_.uops.push_back(u);
    emitted_.insert(u.get());
  }
  void close(const UOpPtr& r) { k_.uops.push_back(make_uop(Op::ENDRANGE, dtypes::index, {r})); }

  // REDUCE -> DEFINE_ACC (read) + ASSIGN (update); returns the root over the accumulators.
  UOpPtr make_accumulators() {
    std::unordered_map<const UOp*, UOpPtr> remap;
    int64_t acc_id = 0;
    for (auto& n : toposort({ast_})) {
      std::vector<UOpPtr> src;
      for (auto& s : n->src) src.push_back(remap.at(s.get()));
      if (n->op != Op::REDUCE) {
        remap[n.get()] = src == n->src ? n : make_uop(n->op, n->dtype, src, n->arg);
        continue;
      }
      Op rop = std::get<Op>(n->arg);
      std::vector<UOpPtr> acc_src{kconst(n->dtype, reduce_identity(rop, n->dtype))};
      for (auto& r : reduce_loops(n)) acc_src.push_back(remap.at(r.get()));
      auto acc = make_uop(Op::DEFINE_ACC, n->dtype, acc_src, Arg{acc_id++});
      assign_of_[acc.get()] = make_uop(Op::ASSIGN, n->dtype, {acc, make_uop(rop, n->dtype, {acc, src[0]})});
      if (auto lid = group_lid(n)) group_lid_[acc.get()] = lid;
      accs_.push_back(acc);
      remap[n.get()] = acc;
    }
    return remap.at(ast_.get());
  }

  // which ranges a node depends on (not through an accumulator's own loops)
  const std::set<const UOp*>& depends(const UOpPtr& u) {
    if (auto it = deps_.find(u.get()); it != deps_.end()) return it->second;
    std::set<const UOp*> d;
    if (u->op == Op::RANGE) d.insert(u.get());
    if (u->op == Op::DEFINE_ACC) {
      for (auto* r : depends(assign_of_.at(u.get())->src[1]->src[1])) d.insert(r);
      for (size_t i = 1; i < u->src.size(); i++) d.erase(u->src[i].get());
    } else {
      for (auto& s : u->src)
        for (auto* r : depends(s)) d.insert(r);
    }
    return deps_[u.get()] = d;
  }

  // Accumulators over the same loops share one loop nest (Note [accumulator groups]).
  void emit_group(const UOpPtr& first) {
    auto loops_of = [](const UOpPtr& acc) { return std::vector<UOpPtr>(acc->src.begin() + 1, acc->src.end()); };
    std::vector<UOpPtr> loops = loops_of(first), group;
    for (auto& a : accs_)
      if (!emitted_.count(a.get()) && loops_of(a) == loops) group.push_back(a);
    std::set<const UOp*> mine;
    for (auto& r : loops) mine.insert(r.get());
    for (auto& a : group) emit_tree(assign_of_.at(a.get())->src[1]->src[1], &mine);  // hoisted parts
    for (auto& a : group)  // a work-group's thread index, which its combine reads after the loops
      if (auto it = group_lid_.find(a.get()); it != group_lid_.end()) emit_tree(it->second, nullptr);
    for (auto& a : group) append(a);
    for (auto& r : loops) append(r);
    for (auto& a : group) {
      auto& assign = assign_of_.at(a.get());
      emit_tree(assign->src[1]->src[1], nullptr);
      emit_tree(assign->src[1], nullptr);
      k_.uops.push_back(assign);
    }
    for (size_t i = loops.size(); i-- > 0;) close(loops[i]);
  }

  // Emits the not-yet-emitted part of `root`'s graph; with `only_without`, only the nodes that
  // depend on none of those ranges.
  void emit_tree(const UOpPtr& root, const std::set<const UOp*>* only_without) {
    for (auto& n : toposort({root}, [&](const UOp& u) { return !emitted_.count(&u); })) {
      if (emitted_.count(n.get()) || n->op == Op::CONST || n->op == Op::SINK) continue;
      if (only_without) {
        bool dep = false;
        for (auto* r : depends(n)) dep |= only_without->count(r) > 0;
        if (dep || n->op == Op::RANGE) continue;
      }
      if (n->op == Op::DEFINE_ACC) {
        emit_group(n);
        continue;
      }
      if (n->op == Op::RANGE) continue;  // a reduce's loop: opened with its accumulator
      append(n);
    }
  }

  // Note [lanes in lockstep]: a SINK whose arg is n holds n copies of one kernel body, lane by
  // lane (codegen/gpu_dims.cpp, Note [elementwise lanes]). Each node of lane 0 is followed by
  // its copy in every other lane, so the lanes' loads come before any lane's store and are in
  // flight together (the compiler may not move a load above a store to memory it cannot prove
  // distinct).
  static int64_t lane_count(const UOpPtr& root) {
    auto* n = std::get_if<int64_t>(&root->arg);
    return root->op == Op::SINK && n ? *n : 1;
  }
  void emit_lanes(const UOpPtr& sink) {
    size_t lanes = static_cast<size_t>(lane_count(sink)), per_lane = sink->src.size() / lanes;
    std::vector<UOpPtr> lane0(sink->src.begin(), sink->src.begin() + static_cast<std::ptrdiff_t>(per_lane));
    std::vector<std::unordered_map<const UOp*, UOpPtr>> copy(lanes);
    for (size_t c = 1; c < lanes; c++)
      for (size_t j = 0; j < per_lane; j++) pair_copies(lane0[j], sink->src[c * per_lane + j], copy[c]);
    for (auto& n : toposort(lane0)) {
      emit_tree(n, nullptr);
      for (size_t c = 1; c < lanes; c++)
        if (auto it = copy[c].find(n.get()); it != copy[c].end()) emit_tree(it->second, nullptr);
    }
  }
  // Each node of a under its copy in b, where the two have the same structure.
  static void pair_copies(const UOpPtr& a, const UOpPtr& b, std::unordered_map<const UOp*, UOpPtr>& copy) {
    if (a->op != b->op || a->src.size() != b->src.size() || !copy.emplace(a.get(), b).second) return;
    for (size_t i = 0; i < a->src.size(); i++) pair_copies(a->src[i], b->src[i], copy);
  }
};

}  // namespace

LinearKernel linearize(const UOpPtr& ast, const std::vector<DType>& param_dtypes) {
  return Linearizer(ast, param_dtypes).run();
}

// Note [when to thread]: waking the pool's threads costs some microseconds, so a kernel whose
// loop bodies run fewer than THREAD_MIN_WORK uops in all stays on the calling thread.
std::vector<int64_t> launch_size(const LinearKernel& k) {
  constexpr double THREAD_MIN_WORK = 1 << 17;
  double iterations = 1;
  for (auto& u : k.uops) {
    if (is_accumulating_store(*u)) return {};  // Note [accumulating stores] in schedule/lower.cpp
    if (u->op == Op::RANGE) iterations *= static_cast<double>(max_trip(*u));
  }
  double work = iterations * static_cast<double>(k.uops.size());
  return work >= THREAD_MIN_WORK ? k.global_size : std::vector<int64_t>{};
}

}  // namespace tg
