// GPU kernel transforms: loops onto threads, local sizes, grouped reductions.
//
// Note [thread mapping]: the linearizer opens the output loops first (outermost first). Here the
// innermost output loop becomes dimension 0 (the fastest-varying one, so neighbouring threads
// touch neighbouring memory), the next one dimension 1, and so on; when there are more output
// loops than dimensions, the outermost ones share one dimension through division and modulo.
//
// Note [grouped reduction]: a kernel with one accumulator over one reduce loop of length N, few
// outputs and a long N runs one work-group of L threads per output: thread t accumulates the
// elements t, t+L, t+2L, ... (the loop becomes N/L trips of index r*L+t), then the renderer's
// group combine (render_c.cpp, Note [group combine]) meets the partials in local memory. L is a
// power of two that divides N, so no thread reads out of range; only thread 0 stores.
#include "tinygrad/codegen/gpu_dims.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/error.h"

namespace tg {

namespace {

int64_t trip(const UOpPtr& range) { return static_cast<int64_t>(range->src[0]->const_value()); }

// The largest power of two <= cap that divides n.
int64_t pow2_divisor(int64_t n, int64_t cap) {
  int64_t p = 1;
  while (p * 2 <= cap && n % (p * 2) == 0) p *= 2;
  return p;
}

UOpPtr special(SpecialKind kind, int dim, int64_t size) {
  return make_uop(Op::SPECIAL, dtypes::index, {kint(size)}, Arg{special_arg(kind, dim)});
}

struct Grouping {
  UOpPtr acc, range;
  Op op;
  int64_t threads = 0;
};

Grouping find_grouping(const LinearKernel& k, const GpuLimits& lim) {
  Grouping g;
  int64_t outputs = 1;
  for (auto s : k.global_size) outputs *= s;
  int accs = 0;
  for (auto& u : k.uops)
    if (u->op == Op::DEFINE_ACC) accs++, g.acc = u;
  if (accs != 1 || g.acc->src.size() != 2 || g.acc->dtype == DType::Bool || outputs > lim.group_max_outputs) return {};
  g.range = g.acc->src[1];
  if (trip(g.range) < lim.group_min_length) return {};
  for (auto& u : k.uops)
    if (u->op == Op::ASSIGN && u->src[0] == g.acc) g.op = u->src[1]->op;
  g.threads = pow2_divisor(trip(g.range), lim.group_threads);
  if (g.threads < 16) return {};
  return g;
}

}  // namespace

void gpu_dims(LinearKernel& k, const GpuLimits& lim) {
  size_t n_outer = k.global_size.size();
  std::vector<UOpPtr> outer(k.uops.begin(), k.uops.begin() + static_cast<std::ptrdiff_t>(n_outer));
  for (auto& r : outer) TG_ASSERT(r->op == Op::RANGE, "gpu_dims: kernel does not open with its output loops");
  Grouping grp = find_grouping(k, lim);
  bool grouped = grp.threads > 0;

  // output loops -> dimensions (Note [thread mapping]); grouped: dimension 0 is the group's threads
  int first_dim = grouped ? 1 : 0;
  int out_dims = std::min<int>(static_cast<int>(n_outer), lim.max_dims - first_dim);
  std::vector<UOpPtr> prologue;  // thread indices and the index arithmetic over them
  std::unordered_map<const UOp*, UOpPtr> sub;
  std::vector<int64_t> global, local;
  SpecialKind kind = grouped ? SpecialKind::GroupId : SpecialKind::GlobalId;
  UOpPtr lid;
  if (grouped) {
    lid = special(SpecialKind::LocalId, 0, grp.threads);
    prologue.push_back(lid);
    global.push_back(grp.threads);
    local.push_back(grp.threads);
  }
  for (int d = 0; d < out_dims; d++) {
    // dimension first_dim+d holds outer loop n_outer-1-d; the last dimension also the ones above it
    size_t hi = n_outer - static_cast<size_t>(d);
    size_t lo = d == out_dims - 1 ? 0 : hi - 1;
    int64_t size = 1;
    for (size_t i = lo; i < hi; i++) size *= trip(outer[i]);
    UOpPtr idx = special(kind, first_dim + d, size);
    prologue.push_back(idx);
    int64_t inner = 1;
    for (size_t i = hi; i-- > lo;) {
      UOpPtr e = idx;
      if (inner > 1) prologue.push_back(e = kalu(Op::IDIV, e, kint(inner)));
      if (i != lo) prologue.push_back(e = kalu(Op::MOD, e, kint(trip(outer[i]))));
      sub[outer[i].get()] = e;
      inner *= trip(outer[i]);
    }
    global.push_back(size);
    local.push_back(grouped ? 1 : 0);  // chosen below
  }
  if (global.empty()) global = {1}, local = {1};
  if (!grouped) {
    int64_t budget = lim.max_local;
    for (size_t d = 0; d < global.size(); d++) {
      local[d] = pow2_divisor(global[d], budget);
      budget /= local[d];
    }
  }

  // the reduce loop of a grouped reduction: N/L trips of index r*L + lid
  std::unordered_map<const UOp*, UOpPtr> range_sub;
  std::vector<UOpPtr> range_index;
  if (grouped) {
    auto r = make_uop(Op::RANGE, dtypes::index, {kint(trip(grp.range) / grp.threads)}, grp.range->arg);
    range_sub[grp.range.get()] = r;
    auto mul = kalu(Op::MUL, r, kint(grp.threads));
    auto add = kalu(Op::ADD, mul, lid);
    range_index = {mul, add};
    sub[grp.range.get()] = add;
  }

  std::unordered_map<const UOp*, UOpPtr> memo;
  std::function<UOpPtr(const UOpPtr&)> rebuild = [&](const UOpPtr& u) -> UOpPtr {
    if (auto it = sub.find(u.get()); it != sub.end()) return it->second;
    if (auto it = memo.find(u.get()); it != memo.end()) return it->second;
    if (u->op == Op::CONST) return u;
    std::vector<UOpPtr> src;
    for (auto& s : u->src) {
      auto rs = range_sub.find(s.get());  // loops keep being loops where they are opened and closed
      bool loop_ref = (u->op == Op::DEFINE_ACC || u->op == Op::ENDRANGE) && rs != range_sub.end();
      src.push_back(loop_ref ? rs->second : rebuild(s));
    }
    UOpPtr out = src == u->src ? u : make_uop(u->op, u->dtype, src, u->arg);
    return memo[u.get()] = out;
  };

  std::unordered_set<const UOp*> outer_set;
  for (auto& r : outer) outer_set.insert(r.get());
  std::vector<UOpPtr> uops = prologue;
  for (size_t i = n_outer; i < k.uops.size(); i++) {
    const UOpPtr& u = k.uops[i];
    if (u->op == Op::ENDRANGE && outer_set.count(u->src[0].get())) continue;
    if (grouped && u == grp.range) {
      uops.push_back(range_sub.at(u.get()));
      uops.insert(uops.end(), range_index.begin(), range_index.end());
      continue;
    }
    UOpPtr n = rebuild(u);
    if (grouped && n->op == Op::STORE) {  // only thread 0 of the group stores
      auto gate = kalu(Op::CMPLT, lid, kint(1));
      uops.push_back(gate);
      auto src = n->src;
      src.push_back(gate);
      n = make_uop(Op::STORE, n->dtype, src, n->arg);
    }
    uops.push_back(n);
  }
  k.uops = std::move(uops);
  k.global_size = global;
  k.local_size = local;
  if (grouped) k.group_reduces.push_back({rebuild(grp.acc), lid, grp.threads, grp.op});
}

}  // namespace tg
