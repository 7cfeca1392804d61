// The linearizer.
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

#include "tinygrad/error.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {

UOpPtr to_float32(const UOpPtr& x) {
  if (!is_half(x->dtype)) return x;
  if (x->op == Op::CONST) {  // the constant as the half type holds it
    double v = x->const_value();
    float r = x->dtype == DType::Float16 ? half_to_float(float_to_half(static_cast<float>(v)))
                                         : bfloat_to_float(float_to_bfloat(static_cast<float>(v)));
    return kconst(DType::Float32, r);
  }
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

double reduce_identity(Op op, DType dt) {
  if (op == Op::ADD) return 0;
  if (op == Op::MUL) return 1;
  return dtype_min(dt);  // MAX
}

}  // namespace

LinearKernel linearize(const UOpPtr& store_in, const std::vector<DType>& param_dtypes) {
  UOpPtr store = upcast_half_alu(store_in);
  LinearKernel k;
  for (size_t i = 0; i < param_dtypes.size(); i++) k.params.push_back({param_dtypes[i], i == 0});

  // REDUCE -> DEFINE_ACC (read) + ASSIGN (update)
  std::unordered_map<const UOp*, UOpPtr> remap;
  std::unordered_map<const UOp*, UOpPtr> assign_of;  // DEFINE_ACC -> ASSIGN
  std::vector<UOpPtr> accs;                          // in creation order
  int64_t acc_id = 0;
  for (auto& n : toposort({store})) {
    std::vector<UOpPtr> src;
    for (auto& s : n->src) src.push_back(remap.at(s.get()));
    if (n->op == Op::REDUCE) {
      Op rop = std::get<Op>(n->arg);
      std::vector<UOpPtr> acc_src{kconst(n->dtype, reduce_identity(rop, n->dtype))};
      acc_src.insert(acc_src.end(), src.begin() + 1, src.end());
      auto acc = make_uop(Op::DEFINE_ACC, n->dtype, acc_src, Arg{acc_id++});
      assign_of[acc.get()] = make_uop(Op::ASSIGN, n->dtype, {acc, make_uop(rop, n->dtype, {acc, src[0]})});
      accs.push_back(acc);
      remap[n.get()] = acc;
    } else {
      remap[n.get()] = src == n->src ? n : make_uop(n->op, n->dtype, src, n->arg);
    }
  }
  store = remap.at(store.get());

  std::unordered_set<const UOp*> reduce_ranges;
  for (auto& [acc, assign] : assign_of)
    for (size_t i = 1; i < acc->src.size(); i++) reduce_ranges.insert(acc->src[i].get());

  // which ranges each node depends on (not through an accumulator's own loops)
  std::unordered_map<const UOp*, std::set<const UOp*>> deps;
  std::function<const std::set<const UOp*>&(const UOpPtr&)> depends = [&](const UOpPtr& u) -> const std::set<const UOp*>& {
    if (auto it = deps.find(u.get()); it != deps.end()) return it->second;
    std::set<const UOp*> d;
    if (u->op == Op::RANGE) d.insert(u.get());
    if (u->op == Op::DEFINE_ACC) {
      for (auto* r : depends(assign_of.at(u.get())->src[1]->src[1])) d.insert(r);
      for (size_t i = 1; i < u->src.size(); i++) d.erase(u->src[i].get());
    } else {
      for (auto& s : u->src)
        for (auto* r : depends(s)) d.insert(r);
    }
    return deps[u.get()] = d;
  };

  auto order = toposort({store});
  std::vector<UOpPtr> outer, row_elements;  // Note [row loops]
  std::set<const UOp*> acc_deps;
  for (auto& a : accs)
    for (auto* r : depends(a)) acc_deps.insert(r);
  for (auto& n : order)
    if (n->op == Op::RANGE && !reduce_ranges.count(n.get()))
      (accs.empty() || acc_deps.count(n.get()) ? outer : row_elements).push_back(n);
  auto by_id = [](const UOpPtr& a, const UOpPtr& b) { return a->arg_int() < b->arg_int(); };
  std::sort(outer.begin(), outer.end(), by_id);
  std::sort(row_elements.begin(), row_elements.end(), by_id);
  for (auto& r : outer) {
    k.uops.push_back(r);
    k.global_size.push_back(static_cast<int64_t>(r->src[0]->const_value()));
  }

  std::unordered_set<const UOp*> emitted;
  for (auto& r : outer) emitted.insert(r.get());
  std::function<void(const UOpPtr&, const std::set<const UOp*>*)> emit_tree;
  // Accumulators over the same loops share one loop nest (Note [accumulator groups]).
  std::function<void(const UOpPtr&)> emit_group = [&](const UOpPtr& first) {
    auto loops_of = [](const UOpPtr& acc) { return std::vector<UOpPtr>(acc->src.begin() + 1, acc->src.end()); };
    std::vector<UOpPtr> group;
    for (auto& a : accs)
      if (!emitted.count(a.get()) && loops_of(a) == loops_of(first)) group.push_back(a);
    std::set<const UOp*> mine;
    for (auto& r : loops_of(first)) mine.insert(r.get());
    for (auto& a : group) emit_tree(assign_of.at(a.get())->src[1]->src[1], &mine);  // hoisted parts
    for (auto& a : group) {
      k.uops.push_back(a);
      emitted.insert(a.get());
    }
    for (auto& r : loops_of(first)) {
      k.uops.push_back(r);
      emitted.insert(r.get());
    }
    for (auto& a : group) {
      auto& assign = assign_of.at(a.get());
      emit_tree(assign->src[1]->src[1], nullptr);
      emit_tree(assign->src[1], nullptr);
      k.uops.push_back(assign);
    }
    auto loops = loops_of(first);
    for (size_t i = loops.size(); i-- > 0;) k.uops.push_back(make_uop(Op::ENDRANGE, dtypes::index, {loops[i]}));
  };
  // Emits the not-yet-emitted part of `root`'s graph; with `only_without`, only the nodes that
  // depend on none of those ranges.
  emit_tree = [&](const UOpPtr& root, const std::set<const UOp*>* only_without) {
    for (auto& n : toposort({root}, [&](const UOp& u) { return !emitted.count(&u); })) {
      if (emitted.count(n.get()) || n->op == Op::CONST || n->op == Op::SINK) continue;
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
      k.uops.push_back(n);
      emitted.insert(n.get());
    }
  };
  if (!row_elements.empty()) {
    std::set<const UOp*> element_loops;
    for (auto& r : row_elements) element_loops.insert(r.get());
    emit_tree(store, &element_loops);
    for (auto& r : row_elements) {
      k.uops.push_back(r);
      emitted.insert(r.get());
    }
  }
  emit_tree(store, nullptr);
  for (size_t i = row_elements.size(); i-- > 0;)
    k.uops.push_back(make_uop(Op::ENDRANGE, dtypes::index, {row_elements[i]}));
  for (size_t i = outer.size(); i-- > 0;) k.uops.push_back(make_uop(Op::ENDRANGE, dtypes::index, {outer[i]}));
  k.name = kernel_name(k);
  return k;
}

// Note [when to thread]: waking the pool's threads costs some microseconds, so a kernel whose
// loop bodies run fewer than THREAD_MIN_WORK uops in all stays on the calling thread.
std::vector<int64_t> launch_size(const LinearKernel& k) {
  constexpr double THREAD_MIN_WORK = 1 << 17;
  double iterations = 1;
  for (auto& u : k.uops)
    if (u->op == Op::RANGE) iterations *= u->src[0]->const_value();
  double work = iterations * static_cast<double>(k.uops.size());
  return work >= THREAD_MIN_WORK ? k.global_size : std::vector<int64_t>{};
}

std::string kernel_name(const LinearKernel& k) {
  const UOp* acc = nullptr;
  int64_t stores = 0;
  for (auto& u : k.uops) {
    if (u->op == Op::DEFINE_ACC && !acc) acc = u.get();
    stores += u->op == Op::STORE;
  }
  std::string name = acc ? "r" : "E";
  for (auto s : k.global_size) name += "_" + std::to_string(s);
  if (acc)
    for (size_t i = 1; i < acc->src.size(); i++)
      name += (i == 1 ? "__" : "_") + std::to_string(static_cast<int64_t>(acc->src[i]->src[0]->const_value()));
  if (stores > 1) name += "_x" + std::to_string(stores);  // upcast lanes
  return name;
}

}  // namespace tg
