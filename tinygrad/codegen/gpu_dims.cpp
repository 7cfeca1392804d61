// GPU kernel transforms: loops onto threads, local sizes, grouped reductions, elementwise lanes.
//
// Note [thread mapping]: the linearizer opens the output loops first (outermost first). Here the
// innermost output loop becomes dimension 0 (the fastest-varying one, so neighbouring threads
// touch neighbouring memory), the next one dimension 1, and so on; when there are more output
// loops than dimensions, the outermost ones share one dimension through division and modulo.
//
// Note [local sizes]: a dimension of at most SHORT_DIM (a warp's width) work-items takes the
// largest divisor of its size within what the dimensions inside it left of max_local (the whole
// dimension where it fits), not only a power of two: global ids need no bounds check when the
// local size divides the global one. With powers of two alone, a short innermost dimension such
// as a register-tiled convolution's column tiles (20 columns in tiles of 4: 5) got a local size
// of 1, and a warp's 32 threads then spread over the outermost dimension (images and
// output-channel tiles): its weight loads were 8 different addresses instead of one broadcast,
// and its input loads 32 rows of different images. With 5 x 20 x 2 a warp covers the rows of one
// image and one channel tile (on an H200 the CNN's 5x5 forward pass went from 1.52 to 0.59 ms,
// its 3x3 layers' four kernels from 1.50 to 0.57 ms). Longer dimensions keep the power-of-two
// divisor: a matmul-like kernel (the MLP's 784 -> 512 weight gradient, 196 column tiles of 4 by
// 512 rows) ran 2.6 times slower with blocks of 196 x 1 than of 4 x 64, whose threads share both
// operands' loads. A group that is not a whole number of warps leaves the last warp partly idle.
//
// Note [grouped reduction]: a kernel whose accumulators all run over the same reduce loops (one
// reduction, or the lanes of a register tile, codegen/opt_gpu.h) of N elements in all runs one
// work-group of L threads per output: the reduce loops become one loop over the flat index
// f = r*L + t of thread t (N/L trips), each loop's index is recovered from f by division and
// modulo with the loop sizes (innermost fastest), then the renderer's group combine
// (render_c.cpp, Note [group combine]; CUDA: Note [warp combine]) meets each accumulator's
// partials. L is a power of two that divides N, at most group_threads and at most
// N/group_min_per_thread, so no thread reads out of range and each has a few loads to overlap,
// and small enough for every accumulator's combine to fit group_local_bytes; only thread 0
// stores. A group also holds at most group_accumulators accumulators in all (a register tile's
// lanes each have one per thread), which leaves registers for the loads in flight. Work-groups
// are numbered on dimension 0 (all output loops flattened into the group
// id), so any number of outputs fits a CUDA grid. Neighbouring threads take neighbouring
// elements of the innermost reduce loop, so a warp's loads are contiguous where that loop is
// (BatchNorm's statistics over N, H, W of an NCHW tensor read whole rows and images).
// Grouping pays when each warp's loads are contiguous or when one thread per output would
// leave the GPU idle:
//  - a reduction over a contiguous row (softmax, layernorm, a sum over the last axis) is
//    grouped however many rows there are;
//  - a reduction with few outputs (at most group_max_outputs) is grouped whatever its layout;
//  - a long reduction (group_long_length elements or more) with up to group_long_max_outputs
//    outputs is grouped where its innermost loop is contiguous for every load that moves along
//    it: a convolution's weight gradient reduces over the batch and the image for each of its
//    tens of thousands of weights, which one thread each would walk serially (28 ms on an
//    H200 for the CNN's 5x5 32->32 convolution, batch 512).
// A reduction over a strided axis with many outputs (a column sum) stays one thread per output,
// whose neighbours read neighbouring addresses; so does a short one whose operands are shared
// between outputs (a matmul, a convolution's forward pass), whose neighbours share their loads.
//
// Note [flat index in 32 bits]: the division and modulo that recover the reduce loops' indices
// from the flat index run in every iteration. Index arithmetic is 64-bit, and a 64-bit division
// by a constant is a long sequence of instructions on a GPU; when the reduction has fewer than
// 2^31 elements, the flat index is cast to int32 for them (a multiply-high and a shift each),
// and each loop's index back to the index type.
//
// Note [elementwise lanes]: with one element per thread, a copy has one 4-byte load in flight per
// thread, too little to cover the memory latency (1.7 TB/s of the H200's 4.8 measured for a copy
// of 2^24 floats). A large elementwise kernel instead gives each thread `lanes` elements of
// dimension 0, a work-group's width L apart: element g*L*lanes + c*L + t for group g, lane c and
// thread t. Every lane's loads stay coalesced across the warp and the lanes' loads are
// independent, so they are all in flight at once.
//
// Note [merged inner loops]: lanes split dimension 0, the innermost output loop, over a
// work-group's width, the largest power of two dividing its length / lanes. For an image's
// columns (20 of a 20 x 20 activation: 5 after lanes) that is a width of 1: a warp's threads then
// take neighbouring rows, 4 scalar loads each 80 bytes apart, and the CNN's elementwise kernels
// ran at a quarter of the copy's bandwidth (0.08 ms for a 512 x 32 x 20 x 20 bias and relu on an
// H200). So an elementwise kernel whose innermost loop gives lanes fewer than a warp's width
// (SHORT_DIM) of threads takes the fewest innermost loops together into dimension 0 that do
// (20 x 20 x 32: 3200 per lane, a width of 128), and recovers each loop's index from the flat one
// by division and modulo, in 32 bits where the flat index fits (Note [flat index in 32 bits]).
// The same narrowing serves the outermost loops sharing the last dimension.
//
// Note [grouped rows]: a kernel that reads a row's reductions back over the row (softmax as one
// kernel: Note [row fusion] in schedule/schedule.cpp, Note [row loops] in linearize.cpp) opens,
// per row, one loop per reduction and then the loop over the row's elements, all of the row's
// length N and none inside another. It runs one work-group of L threads per row (L as in a
// grouped reduction), and every such loop is split the same way: N/L trips of index r*L + t.
// Each reduction's partials meet in the group combine, which leaves the result in every thread,
// so the next reduction and the element loop read it directly; each thread stores its own
// elements (stores are gated to thread 0 only where their address is the same for the whole
// group). The row's later passes re-read it from L1/L2 instead of memory. Loads that move along
// the loops must move by one element (coalesced), others (a LayerNorm's weight) may not move.
//
// Note [row tails]: a row whose length N has no power-of-two divisor of at least 16 (1000 = 8 x
// 125) still gets a group: L is the largest power of two within the same limits, every loop runs
// ceil(N/L) trips, and in the last one the threads whose index r*L + t is past the row load
// nothing (gated loads), leave their partial as it was and store nothing.
// Note [launch limits]: a launch holds at most max_groups_yz groups in dimensions 1 and 2 (CUDA:
// gridDim.y and gridDim.z, 65535), max_group_z work-items per group in dimension 2 and
// max_group_threads per group. gpu_dims puts the outermost output loops on the last dimension;
// when that gives a grid the device refuses, the kernel is laid out again with every output loop
// on dimension 0 (up to max_groups_x groups). Local sizes above the limits are clamped to their
// largest divisor within them (global ids do not depend on the split); a grouped reduction keeps
// its group, whose size its shared array fixes.
#include "tinygrad/codegen/gpu_dims.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/opt.h"
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

// Note [local sizes]: the work-group size of a dimension of n work-items, at most cap.
constexpr int64_t SHORT_DIM = 32;
int64_t local_divisor(int64_t n, int64_t cap) {
  if (n > SHORT_DIM) return pow2_divisor(n, cap);
  for (int64_t d = std::min(n, cap); d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

int64_t pow2_at_most(int64_t cap) {
  int64_t p = 1;
  while (p * 2 <= cap) p *= 2;
  return p;
}

bool depends_on(const UOpPtr& u, const UOpPtr& range) {
  for (auto& n : toposort({u}))
    if (n == range) return true;
  return false;
}

// Every load whose address moves along the loop `range` moves by one element along it, and at
// least one does: the threads of a group, which take neighbouring iterations, load neighbouring
// elements.
bool contiguous_loads(const LinearKernel& k, const UOpPtr& range) {
  bool any = false;
  for (auto& u : k.uops) {
    if (u->op != Op::LOAD || !depends_on(u->src[1], range)) continue;
    if (index_stride(u->src[1], range) != 1) return false;
    any = true;
  }
  return any;
}

// A reduction over rows: the loads are contiguous along the reduce loop `range` and each moves
// along every output loop, so no two outputs read the same row (a matmul's operands are shared
// between outputs: those stay one thread per output, whose neighbours share one operand's loads).
bool row_loads(const LinearKernel& k, const UOpPtr& range, size_t n_outer) {
  if (!contiguous_loads(k, range)) return false;
  for (auto& u : k.uops) {
    if (u->op != Op::LOAD || !depends_on(u->src[1], range)) continue;
    for (size_t i = 0; i < n_outer; i++)
      if (trip(k.uops[i]) > 1 && !depends_on(u->src[1], k.uops[i])) return false;
  }
  return true;
}

struct Grouping {
  std::vector<UOpPtr> accs;  // accumulators combined over the group
  std::vector<Op> ops;       // each accumulator's combine op
  // a grouped reduction (Note [grouped reduction]): its reduce loops, outermost first, and their
  // product, the elements of one reduction; they become one flat loop
  std::vector<UOpPtr> loops;
  int64_t length = 0;
  std::vector<UOpPtr> ranges;  // grouped rows (Note [grouped rows]): loops each split over the group
  int64_t threads = 0;
  bool tail = false;  // threads does not divide the loops: the last trip is gated (Note [row tails])
};

// Note [grouped rows]
Grouping find_row_grouping(const LinearKernel& k, const GpuLimits& lim) {
  size_t n_outer = k.global_size.size();
  Grouping g;
  std::unordered_map<const UOp*, Op> op_of;
  int64_t n = 0;
  int depth = 0;
  for (size_t i = n_outer; i < k.uops.size(); i++) {
    const UOpPtr& u = k.uops[i];
    if (u->op == Op::RANGE) {
      if (depth++ > 0 || (n && trip(u) != n)) return {};
      n = trip(u);
      g.ranges.push_back(u);
    } else if (u->op == Op::ENDRANGE && depth > 0) {
      depth--;
    } else if (u->op == Op::DEFINE_ACC) {
      if (u->src.size() != 2 || u->dtype == DType::Bool) return {};
      g.accs.push_back(u);
    } else if (u->op == Op::ASSIGN) {
      op_of[u->src[0].get()] = u->src[1]->op;
    }
  }
  if (g.accs.empty() || n < lim.row_min_length) return {};
  for (auto& u : k.uops)
    for (auto& r : g.ranges)
      if (u->op == Op::LOAD && depends_on(u->src[1], r) && index_stride(u->src[1], r) != 1) return {};
  for (auto& a : g.accs) g.ops.push_back(op_of.at(a.get()));
  int64_t cap = std::min(lim.group_threads, n / lim.group_min_per_thread);
  g.threads = pow2_divisor(n, cap);
  if (g.threads < 16) g.threads = pow2_at_most(cap), g.tail = true;  // Note [row tails]
  if (g.threads < 16) return {};
  return g;
}

// Note [grouped reduction]
Grouping find_grouping(const LinearKernel& k, const GpuLimits& lim) {
  int sequential_loops = 0, depth = 0;  // reduce loops one after the other, not nested: fused rows
  for (size_t i = k.global_size.size(); i < k.uops.size(); i++) {
    const UOpPtr& u = k.uops[i];
    if (u->op == Op::RANGE) sequential_loops += depth++ == 0;
    if (u->op == Op::ENDRANGE && depth > 0) depth--;
  }
  if (sequential_loops > 1) return find_row_grouping(k, lim);
  Grouping g;
  int64_t outputs = 1;
  for (auto s : k.global_size) outputs *= s;
  int64_t slot_bytes = 0;  // local memory of the combines, per slot
  for (auto& u : k.uops) {
    if (u->op != Op::DEFINE_ACC) continue;
    if (u->src.size() < 2 || u->dtype == DType::Bool) return {};
    std::vector<UOpPtr> loops(u->src.begin() + 1, u->src.end());
    if (!g.accs.empty() && loops != g.loops) return {};
    g.accs.push_back(u), g.loops = loops;
    slot_bytes += static_cast<int64_t>(itemsize(u->dtype));
  }
  if (g.accs.empty()) return {};
  for (auto& r : g.loops)  // the loops are opened once, one after the other (one accumulator group)
    if (std::count(k.uops.begin(), k.uops.end(), r) != 1) return {};
  auto first = static_cast<size_t>(std::find(k.uops.begin(), k.uops.end(), g.loops[0]) - k.uops.begin());
  for (size_t i = 1; i < g.loops.size(); i++)
    if (first + i >= k.uops.size() || k.uops[first + i] != g.loops[i]) return {};
  g.length = 1;
  for (auto& r : g.loops) g.length *= trip(r);
  int64_t n = g.length;
  bool few_outputs = outputs <= lim.group_max_outputs && n >= lim.group_min_length;
  bool long_reduce = outputs <= lim.group_long_max_outputs && n >= lim.group_long_length &&
                     contiguous_loads(k, g.loops.back());
  bool row = n >= lim.row_min_length && row_loads(k, g.loops.back(), k.global_size.size());
  if (!few_outputs && !long_reduce && !row) return {};
  int64_t cap = std::min(lim.group_threads, n / lim.group_min_per_thread);
  cap = std::min(cap, lim.group_local_bytes * lim.group_threads_per_slot / slot_bytes);
  cap = std::min(cap, lim.group_accumulators / static_cast<int64_t>(g.accs.size()));
  g.threads = pow2_divisor(n, cap);
  for (auto& a : g.accs) {
    g.ops.push_back(Op::ADD);
    for (auto& u : k.uops)
      if (u->op == Op::ASSIGN && u->src[0] == a) g.ops.back() = u->src[1]->op;
  }
  if (g.threads < 16) return {};
  return g;
}

// Note [elementwise lanes]: lanes per thread for a kernel without reduce loops whose dimension 0
// holds `size0` elements (1: none).
int64_t elementwise_lanes(const LinearKernel& k, size_t n_outer, int64_t size0, const GpuLimits& lim) {
  for (size_t i = n_outer; i < k.uops.size(); i++)
    if (k.uops[i]->op == Op::RANGE || k.uops[i]->op == Op::DEFINE_ACC) return 1;
  int64_t total = 1;
  for (auto s : k.global_size) total *= s;
  if (lim.lanes < 2 || size0 % lim.lanes != 0 || total / lim.lanes < lim.lanes_min_threads) return 1;
  return lim.lanes;
}

// Note [merged inner loops]: how many innermost output loops dimension 0 holds.
size_t inner_loops_of_dim0(const LinearKernel& k, const std::vector<UOpPtr>& outer, const GpuLimits& lim) {
  size_t n_outer = outer.size();
  int64_t size = 1;
  for (size_t m = 1; m <= n_outer; m++) {
    size *= trip(outer[n_outer - m]);
    int64_t lanes = elementwise_lanes(k, n_outer, size, lim);
    if (lanes > 1 && pow2_divisor(size / lanes, lim.max_local) >= SHORT_DIM) return m;
  }
  return 1;
}

}  // namespace

UOpPtr thread_index(SpecialKind kind, int dim, int64_t size) {
  return make_uop(Op::SPECIAL, dtypes::index, {kint(size)}, Arg{special_arg(kind, dim)});
}

// Note [flat index in 32 bits]
void split_flat_index(UOpPtr flat, std::span<const UOpPtr> loops, int64_t length, std::vector<UOpPtr>& code,
                      std::unordered_map<const UOp*, UOpPtr>& sub) {
  bool narrow = loops.size() > 1 && length <= std::numeric_limits<int32_t>::max();
  auto c = [&](int64_t v) { return narrow ? kconst(DType::Int32, static_cast<double>(v)) : kint(v); };
  if (narrow) code.push_back(flat = kcast(flat, DType::Int32));
  int64_t inner = 1;
  for (size_t i = loops.size(); i-- > 0;) {
    UOpPtr e = flat;
    if (inner > 1) code.push_back(e = kalu(Op::IDIV, e, c(inner)));
    if (i != 0) code.push_back(e = kalu(Op::MOD, e, c(trip(loops[i]))));
    if (narrow) code.push_back(e = kcast(e, dtypes::index));
    sub[loops[i].get()] = e;
    inner *= trip(loops[i]);
  }
}

void gpu_dims(LinearKernel& k, const GpuLimits& lim) {
  size_t n_outer = k.global_size.size();
  std::vector<UOpPtr> outer(k.uops.begin(), k.uops.begin() + static_cast<std::ptrdiff_t>(n_outer));
  for (auto& r : outer) TG_ASSERT(r->op == Op::RANGE, "gpu_dims: kernel does not open with its output loops");
  Grouping grp = find_grouping(k, lim);
  bool grouped = grp.threads > 0;

  // output loops -> dimensions (Note [thread mapping]); grouped: all of them on the group id.
  // Dimension 0 holds the `in_dim0` innermost loops (Note [merged inner loops]), each further
  // dimension the next loop out, the last one all loops above it.
  size_t in_dim0 = grouped ? 1 : inner_loops_of_dim0(k, outer, lim);
  int out_dims = std::min<int>(static_cast<int>(n_outer - in_dim0 + 1), grouped ? 1 : lim.max_dims);
  if (n_outer == 0) out_dims = 0;
  auto loops_of = [&](int d) {  // [lo, hi) of the outer loops in dimension d
    size_t hi = d == 0 ? n_outer : n_outer - in_dim0 - static_cast<size_t>(d - 1);
    size_t lo = d == out_dims - 1 ? 0 : d == 0 ? n_outer - in_dim0 : hi - 1;
    return std::pair{lo, hi};
  };
  std::vector<int64_t> dim_size;
  for (int d = 0; d < out_dims; d++) {
    auto [lo, hi] = loops_of(d);
    int64_t size = 1;
    for (size_t i = lo; i < hi; i++) size *= trip(outer[i]);
    dim_size.push_back(size);
  }
  int64_t lanes = grouped || dim_size.empty() ? 1 : elementwise_lanes(k, n_outer, dim_size[0], lim);

  std::vector<UOpPtr> prologue;  // thread indices and the index arithmetic over them
  std::vector<std::unordered_map<const UOp*, UOpPtr>> sub(static_cast<size_t>(lanes));  // per lane
  std::vector<int64_t> global, local;
  UOpPtr lid;
  if (grouped) lid = thread_index(SpecialKind::LocalId, 0, grp.threads), prologue.push_back(lid);
  int64_t budget = lim.max_local;
  for (int d = 0; d < out_dims; d++) {
    auto [lo, hi] = loops_of(d);
    int64_t size = dim_size[static_cast<size_t>(d)];
    std::vector<UOpPtr> idx;  // the dimension's element index, per lane
    if (grouped) {
      idx = {thread_index(SpecialKind::GroupId, 0, size)};
      global.push_back(size * grp.threads);
      local.push_back(grp.threads);
    } else if (d == 0 && lanes > 1) {  // Note [elementwise lanes]
      int64_t l = pow2_divisor(size / lanes, budget);
      auto g = thread_index(SpecialKind::GroupId, 0, size / lanes / l),
           t = thread_index(SpecialKind::LocalId, 0, l);
      auto base = kalu(Op::ADD, kalu(Op::MUL, g, kint(l * lanes)), t);
      prologue.insert(prologue.end(), {g, t, base->src[0], base});
      for (int64_t c = 0; c < lanes; c++) idx.push_back(c == 0 ? base : kalu(Op::ADD, base, kint(c * l)));
      for (size_t c = 1; c < idx.size(); c++) prologue.push_back(idx[c]);
      global.push_back(size / lanes);
      local.push_back(l);
      budget /= l;
    } else {
      idx = {thread_index(SpecialKind::GlobalId, d, size)};
      global.push_back(size);
      local.push_back(local_divisor(size, budget));  // Note [local sizes]
      budget /= local.back();
    }
    if (idx.size() == 1 && idx[0]->op == Op::SPECIAL) prologue.push_back(idx[0]);
    // each loop's index from the dimension's (Note [merged inner loops])
    std::span<const UOpPtr> loops(outer.begin() + static_cast<std::ptrdiff_t>(lo), hi - lo);
    for (size_t c = 0; c < sub.size(); c++)
      split_flat_index(idx[idx.size() == 1 ? 0 : c], loops, size, prologue, sub[c]);
  }
  if (global.empty()) {  // a scalar output: one group, or one thread
    int64_t l = grouped ? grp.threads : 1;
    global = {l}, local = {l};
  }

  // the reduce loops of a grouped reduction become one loop of length/L trips over the flat
  // index f = r*L + lid, from which each loop's index is recovered (Note [grouped reduction])
  UOpPtr flat;
  std::vector<UOpPtr> flat_index;
  std::unordered_set<const UOp*> loop_set;
  if (grouped && !grp.loops.empty()) {
    flat = make_uop(Op::RANGE, dtypes::index, {kint(grp.length / grp.threads)}, grp.loops[0]->arg);
    auto mul = kalu(Op::MUL, flat, kint(grp.threads));
    auto f = kalu(Op::ADD, mul, lid);
    flat_index = {mul, f};
    split_flat_index(f, grp.loops, grp.length, flat_index, sub[0]);  // Note [flat index in 32 bits]
    for (auto& l : grp.loops) loop_set.insert(l.get());
    for (auto& a : grp.accs) sub[0][a.get()] = make_uop(Op::DEFINE_ACC, a->dtype, {a->src[0], flat}, a->arg);
  }
  // grouped rows: each loop N/L trips (rounded up) of index r*L + lid (Note [grouped rows])
  std::unordered_map<const UOp*, UOpPtr> range_sub;
  std::unordered_map<const UOp*, std::vector<UOpPtr>> range_index;
  std::unordered_map<const UOp*, UOpPtr> valid;  // Note [row tails]: index < N, per loop
  for (auto& range : grp.ranges) {
    int64_t trips = (trip(range) + grp.threads - 1) / grp.threads;
    auto r = make_uop(Op::RANGE, dtypes::index, {kint(trips)}, range->arg);
    range_sub[range.get()] = r;
    auto mul = kalu(Op::MUL, r, kint(grp.threads));
    auto add = kalu(Op::ADD, mul, lid);
    range_index[range.get()] = {mul, add};
    if (grp.tail) valid[range.get()] = kalu(Op::CMPLT, add, kint(trip(range)));
    if (grp.tail) range_index[range.get()].push_back(valid[range.get()]);
    sub[0][range.get()] = add;
  }
  // the gate of a load, store or accumulator update inside a loop with a tail (Note [row tails])
  auto tail_gate = [&](const UOpPtr& u) -> UOpPtr {
    if (valid.empty()) return nullptr;
    if (u->op == Op::ASSIGN)
      if (auto it = valid.find(u->src[0]->src[1].get()); it != valid.end()) return it->second;
    if (u->op == Op::LOAD || u->op == Op::STORE)
      for (auto& r : grp.ranges)
        if (valid.count(r.get()) && depends_on(u->src[1], r)) return valid.at(r.get());
    return nullptr;
  };
  std::unordered_map<const UOp*, UOpPtr> gate_uop;  // a gated uop -> the new uop it needs first
  auto gated = [&](const UOpPtr& u, const UOpPtr& v) -> UOpPtr {
    auto src = u->src;
    UOpPtr out, first;
    if (u->op == Op::ASSIGN) {
      first = kwhere(v, src[1], src[0]);
      out = make_uop(Op::ASSIGN, u->dtype, {src[0], first}, u->arg);
    } else {
      size_t at = u->op == Op::LOAD ? 2 : 3;  // a load's gate is its third source, a store's its fourth
      if (src.size() > at) src[at] = first = kalu(Op::AND, src[at], v);
      else src.push_back(v);
      out = make_uop(u->op, u->dtype, src, u->arg);
    }
    if (first) gate_uop[out.get()] = first;
    return out;
  };

  std::vector<std::unordered_map<const UOp*, UOpPtr>> memo(sub.size());
  std::function<UOpPtr(const UOpPtr&, size_t)> rebuild = [&](const UOpPtr& u, size_t c) -> UOpPtr {
    if (auto it = sub[c].find(u.get()); it != sub[c].end()) return it->second;
    if (auto it = memo[c].find(u.get()); it != memo[c].end()) return it->second;
    if (u->op == Op::CONST) return u;
    std::vector<UOpPtr> src;
    for (auto& s : u->src) src.push_back(rebuild(s, c));
    UOpPtr out = src == u->src ? u : make_uop(u->op, u->dtype, src, u->arg);
    if (auto v = tail_gate(u)) out = gated(out, v);
    return memo[c][u.get()] = out;
  };

  std::unordered_set<const UOp*> outer_set;
  for (auto& r : outer) outer_set.insert(r.get());
  std::vector<UOpPtr> uops;
  std::unordered_set<const UOp*> emitted;
  auto emit = [&](const UOpPtr& u) {
    if (auto it = gate_uop.find(u.get()); it != gate_uop.end() && emitted.insert(it->second.get()).second)
      uops.push_back(it->second);
    if (emitted.insert(u.get()).second) uops.push_back(u);
  };
  for (auto& u : prologue) emit(u);
  for (size_t i = n_outer; i < k.uops.size(); i++) {
    const UOpPtr& u = k.uops[i];
    if (u->op == Op::ENDRANGE && outer_set.count(u->src[0].get())) continue;
    if (loop_set.count(u.get())) {  // the loops open (and close) as the one flat loop
      if (u == grp.loops[0]) {
        emit(flat);
        for (auto& r : flat_index) emit(r);
      }
      continue;
    }
    if (u->op == Op::ENDRANGE && loop_set.count(u->src[0].get())) {
      if (u->src[0] == grp.loops[0]) emit(make_uop(Op::ENDRANGE, dtypes::index, {flat}));
      continue;
    }
    if (auto it = range_index.find(u.get()); it != range_index.end()) {
      emit(range_sub.at(u.get()));
      for (auto& r : it->second) emit(r);
      continue;
    }
    // lanes only exist in kernels without loops, so each lane's uop follows its sources
    for (size_t c = 0; c < sub.size(); c++) {
      UOpPtr n = rebuild(u, c);
      // only thread 0 of the group stores an address the whole group shares
      if (grouped && n->op == Op::STORE && !depends_on(n->src[1], lid)) {
        auto gate = kalu(Op::CMPLT, lid, kint(1));
        emit(gate);
        auto src = n->src;
        src.push_back(gate);
        n = make_uop(Op::STORE, n->dtype, src, n->arg);
      }
      emit(n);
    }
  }
  k.uops = std::move(uops);
  k.global_size = global;
  k.local_size = local;
  for (size_t i = 0; i < grp.accs.size(); i++)
    k.group_reduces.push_back({rebuild(grp.accs[i], 0), lid, grp.threads, grp.ops[i]});
}

namespace {

// Note [launch limits]
bool launch_fits(const LinearKernel& k, const GpuLimits& lim) {
  if (k.local_size.size() > 2 && k.local_size[2] > lim.max_group_z) return false;
  int64_t threads = 1;
  for (size_t d = 0; d < k.global_size.size(); d++) {
    int64_t l = d < k.local_size.size() && k.local_size[d] > 0 ? k.local_size[d] : 1;
    int64_t groups = (k.global_size[d] + l - 1) / l;
    threads *= l;
    if (groups > (d == 0 ? lim.max_groups_x : lim.max_groups_yz)) return false;
  }
  return threads <= lim.max_group_threads;
}

void clamp_local_sizes(LinearKernel& k, const GpuLimits& lim) {
  if (!k.group_reduces.empty()) return;  // the group's size is fixed by its shared array
  for (size_t d = 0; d < k.local_size.size(); d++) {
    int64_t cap = d == 2 ? lim.max_group_z : lim.max_group_threads;
    int64_t l = k.local_size[d];
    if (l <= cap) continue;
    int64_t c = cap;
    while (l % c != 0) c--;
    k.local_size[d] = c;
  }
}

}  // namespace

void map_threads(LinearKernel& k, const GpuLimits& lim) {
  LinearKernel original = k;
  gpu_dims(k, lim);
  clamp_local_sizes(k, lim);
  if (launch_fits(k, lim)) return;
  // Note [launch limits]. Grouped kernels never get here: their groups are all on dimension 0.
  TG_ASSERT(k.group_reduces.empty(), "kernel '", k.name, "': grouped reduction outside the launch limits");
  k = std::move(original);
  GpuLimits flat = lim;
  flat.max_dims = 1;
  gpu_dims(k, flat);
  TG_CHECK(launch_fits(k, lim), "kernel '", k.name, "': no launch grid within the device's limits for ",
           k.global_size.empty() ? 0 : k.global_size[0], " threads");
}

}  // namespace tg
