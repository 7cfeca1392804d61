// GPU thread mapping on the kernel graph: loops onto threads, local sizes, grouped reductions,
// elementwise lanes.
//
// Note [thread mapping on the graph]: the pass takes the optimized kernel graph (rooted at STORE
// or SINK, with RANGE and REDUCE nodes) and returns a graph the linearizer lays out as it is:
//  - every output loop (the loops the linearizer would open first, kernel_loops in
//    codegen/linearize.h) is replaced by its index expression over SPECIAL thread indices, so
//    no output loop is left;
//  - the REDUCE of a grouped reduction or of a grouped row runs over the loop each thread walks
//    (the one flat loop, or the row's loop of ceil(N/L) trips) and takes the work-group's thread
//    index (a LocalId SPECIAL) as its last source: the linearizer gives it a DEFINE_ACC over that
//    loop and a GroupReduce entry, whose combine the renderer emits after the loop closes;
//  - gates are the gate sources of LOADs and STOREs; a row tail's accumulator update is a REDUCE
//    of `valid ? x : identity`;
//  - a kernel with elementwise lanes is a SINK of each lane's stores, lane by lane, whose arg is
//    the number of lanes (Note [lanes in lockstep] in codegen/linearize.cpp).
// The launch (global and local sizes) and the kernel's name, which describes the loops before
// they became threads, come back beside the graph (GpuLaunch).
//
// Note [thread mapping]: the output loops are taken outermost first (kernel_loops). The innermost
// becomes dimension 0 (the fastest-varying one, so neighbouring threads touch neighbouring
// memory), the next one dimension 1, and so on; when there are more output loops than
// dimensions, the outermost ones share one dimension through division and modulo.
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
//  - a reduction with few outputs (at most group_max_outputs) is grouped whatever its layout,
//    one with a single output from a shorter length: one thread walked the 128 rows of the CNN's
//    loss alone, each a load of the row's label and then of the logit it picks, in 33 us on an
//    H100;
//  - a long reduction (group_long_length elements or more) with up to group_long_max_outputs
//    outputs is grouped where its innermost loop is contiguous for every load that moves along
//    it: a convolution's weight gradient reduces over the batch and the image for each of its
//    tens of thousands of weights, which one thread each would walk serially (28 ms on an
//    H200 for the CNN's 5x5 32->32 convolution, batch 512).
// A reduction over a strided axis with many outputs (a column sum) stays one thread per output,
// whose neighbours read neighbouring addresses (Note [column sums] in codegen/opt_gpu.cpp gives
// each several loads in flight; Note [split column sums] in schedule/split_reduce.cpp makes
// enough of them); so does a short one whose operands are shared between outputs (a matmul, a
// convolution's forward pass), whose neighbours share their loads.
//
// Note [flat index in 32 bits]: the division and modulo that recover the reduce loops' indices
// from the flat index run in every iteration. Index arithmetic is 64-bit, and a 64-bit division
// by a constant is a long sequence of instructions on a GPU; when the reduction has fewer than
// 2^31 elements, the flat index is cast to int32 for them (a multiply-high and a shift each),
// and each loop's index back to the index type.
//
// Note [reduce lanes]: a grouped reduction's thread loads one element a trip, one 4-byte (or
// 2-byte) load instruction per element. On a device with vector accesses a thread instead takes
// V neighbouring elements a trip, a vector of the kernel's narrowest elements (as in Note
// [contiguous lanes]): flat index f = (r*L + t)*V + c for lane c, lane 0's split into the reduce
// loops' indices and c added to the innermost one's, which must hold whole vectors, as L*V must
// divide the length (V is halved until both do). The lanes' values are combined by the reduce's
// own op before the accumulator (in float32 for a half-type reduce), so a thread keeps one
// accumulator per reduce and its group combine is unchanged; loads along the innermost loop are
// then at consecutive indices from a multiple of V and become one wide access (Note [runs across
// arithmetic] in codegen/vector_access.cpp). Only where every load that moves along the innermost
// loop moves by one element; others would gain nothing from lanes. On an H100 GPT-2's LayerNorm
// row kernels (16384 rows of 768, 64 threads a row, 12 elements a thread: now 3 trips of 16
// bytes) stayed at 0.036 ms a launch: they read two or three [16384, 768] operands, near the
// memory's speed already. Rows of 64 (Note [short rows]) take a whole row a thread-group in one
// trip.
//
// Note [elementwise lanes]: with one element per thread, a copy has one 4-byte load in flight per
// thread, too little to cover the memory latency (1.7 TB/s of the H200's 4.8 measured for a copy
// of 2^24 floats). A large elementwise kernel instead gives each thread `lanes` elements of
// dimension 0, a work-group's width L apart: element g*L*lanes + c*L + t for group g, lane c and
// thread t. Every lane's loads stay coalesced across the warp and the lanes' loads are
// independent, so they are all in flight at once.
//
// Note [contiguous lanes]: on a device with vector accesses (GpuLimits::vector_bytes: CUDA's
// 16 bytes) the lanes are neighbouring elements instead: element (g*L + t)*lanes + c, with as
// many lanes as one vector of the kernel's narrowest dtype holds (8 for bfloat16, at least
// lim.lanes). The lanes' loads and stores of a buffer that is contiguous along the loop are then
// at consecutive indices whose first is a multiple of the lanes, and the renderer makes each run
// one wide access (Note [vector accesses] in codegen/vector_access.cpp): a warp's load of
// bfloat16 is 512 contiguous bytes in one instruction instead of 64 bytes in each of four. Lane
// 0's index is split into the loops' indices as before, and lane c adds c to the innermost
// loop's, which therefore must hold whole vectors (its length a multiple of the lanes; otherwise
// the lanes stay a work-group apart). Accesses along other strides stay one element each. On an
// H100 GPT-2's head split went from 0.160 to 0.114 ms, its loss gradient over the [16384, 50304]
// logits from 1.41 to 1.22 ms and the step from 45.8 to 44.8 ms.
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
// kernel: Note [row fusion] in schedule/schedule.cpp, Note [row loops] in linearize.cpp) has,
// per row, one loop per reduction and then the loop over the row's elements, all of the row's
// length N and none inside another. It runs one work-group of L threads per row (L as in a
// grouped reduction), and every such loop is split the same way: N/L trips of index r*L + t.
// Each reduction's partials meet in the group combine, which leaves the result in every thread,
// so the next reduction and the element loop read it directly; each thread stores its own
// elements (stores are gated to thread 0 only where their address is the same for the whole
// group). The row's later passes re-read it from L1/L2 instead of memory. Loads that move along
// the loops must move by one element (coalesced), others (a LayerNorm's weight) may not move.
//
// Note [short rows]: a row of 64 (attention's rowsum(dO * O) over a head's 64 elements, 192 x
// 1024 rows) has too few elements for 16 threads of 8 each, the smallest group; one thread per
// row, walking it alone, made each warp load touch 32 rows 260 bytes apart (0.081 ms on an H100
// for 75 MB). Contiguous rows of at least row_min_length (64) therefore get groups of 16 threads
// even when each then takes fewer than group_min_per_thread elements, several groups to a
// work-group (Note [packed groups]): 0.038 ms for GPT-2's rows on an H100, the step 0.5 ms less.
//
// Note [packed groups]: a work-group of fewer than 32 threads leaves most of a warp idle, and a
// multiprocessor holds at most 32 work-groups: rows of 64 in groups of 16 ran 512 threads a
// multiprocessor, a quarter of what it can. Where the device combines a group's partials in
// warp shuffles (group_threads_per_slot of a warp: CUDA), groups of L < 32 threads are packed P
// to a work-group of P*L (PACKED_BLOCK threads, at least a warp; P divides the outputs): thread
// g of the launch is thread g % L of group g / L, and each group's butterfly stays within its L
// lanes of the warp (Note [warp combine] in codegen/render_cuda.cpp).
//
// Note [row tails]: a row whose length N has no power-of-two divisor of at least 16 (1000 = 8 x
// 125) still gets a group: L is the largest power of two within the same limits, every loop runs
// ceil(N/L) trips, and in the last one the threads whose index r*L + t is past the row load
// nothing (gated loads), leave their partial as it was and store nothing.
//
// Note [launch limits]: a launch holds at most max_groups_yz groups in dimensions 1 and 2 (CUDA:
// gridDim.y and gridDim.z, 65535), max_group_z work-items per group in dimension 2 and
// max_group_threads per group. The mapping puts the outermost output loops on the last dimension;
// when that gives a grid the device refuses, the kernel is laid out again with every output loop
// on dimension 0 (up to max_groups_x groups). Local sizes above the limits are clamped to their
// largest divisor within them (global ids do not depend on the split); a grouped reduction keeps
// its group, whose size its shared array fixes.
#include "tinygrad/codegen/gpu_dims.h"

#include <algorithm>
#include <limits>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/opt.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

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

// What the mapping reads from the kernel graph.
struct KernelInfo {
  KernelLoops loops;             // loops.outer: the output loops, outermost first
  std::vector<UOpPtr> reduces;   // every REDUCE
  std::vector<UOpPtr> loads;     // every LOAD
  int64_t outputs = 1;           // iterations of the output loops
  int64_t narrowest = 8;         // bytes of the smallest element loaded or stored
};

KernelInfo kernel_info(const UOpPtr& ast) {
  KernelInfo info{kernel_loops(ast), {}, {}, 1};
  for (auto& n : toposort({ast})) {
    if (n->op == Op::REDUCE) info.reduces.push_back(n);
    if (n->op == Op::LOAD) info.loads.push_back(n);
    if (n->op == Op::LOAD || n->op == Op::STORE)
      info.narrowest = std::min(info.narrowest, static_cast<int64_t>(itemsize(n->src[0]->dtype)));
  }
  for (auto& r : info.loops.outer) info.outputs *= trip(r);
  return info;
}

std::vector<UOpPtr> loops_of(const UOpPtr& reduce) { return {reduce->src.begin() + 1, reduce->src.end()}; }

// Every load whose address moves along the loop `range` moves by one element along it, and at
// least one does: the threads of a group, which take neighbouring iterations, load neighbouring
// elements.
bool contiguous_loads(const KernelInfo& k, const UOpPtr& range) {
  bool any = false;
  for (auto& u : k.loads) {
    if (!depends_on(u->src[1], range)) continue;
    if (index_stride(u->src[1], range) != 1) return false;
    any = true;
  }
  return any;
}

// Note [rows with a shared operand]: a reduction over rows has its loads contiguous along the
// reduce loop `range` and at least one of them moving along every output loop, so each output
// has a row of its own. Other loads may be shared by all or some of the outputs: LayerNorm's
// weight, a position embedding that the batch shares, a causal mask's row; each is one row that
// the cache serves to every group. A matmul's operands each miss one output loop (A the columns,
// B the rows), so no load has rows of its own: those stay one thread per output, whose neighbours
// share one operand's loads. Requiring every load to move along every output loop, as this once
// did, left GPT-2's LayerNorm statistics (which read the position embedding) and its attention
// softmax rows (which read the mask's positions) one thread per row: 0.74 ms for a [16384, 768]
// reduction on an H200, strided loads walked serially by 16384 threads.
bool row_loads(const KernelInfo& k, const UOpPtr& range) {
  if (!contiguous_loads(k, range)) return false;
  for (auto& u : k.loads) {
    if (!depends_on(u->src[1], range)) continue;
    bool own_row = true;
    for (auto& r : k.loops.outer) own_row = own_row && (trip(r) == 1 || depends_on(u->src[1], r));
    if (own_row) return true;
  }
  return false;
}

struct Grouping {
  // a grouped reduction (Note [grouped reduction]): its reduce loops, outermost first, and their
  // product, the elements of one reduction; they become one flat loop
  std::vector<UOpPtr> loops;
  int64_t length = 0;
  std::vector<UOpPtr> ranges;  // grouped rows (Note [grouped rows]): loops each split over the group
  int64_t threads = 0;         // 0: not grouped
  int64_t lanes = 1;           // Note [reduce lanes]: neighbouring elements a thread takes a trip
  int64_t per_block = 1;       // Note [packed groups]: groups sharing a work-group
  bool tail = false;  // threads does not divide the loops: the last trip is gated (Note [row tails])
};

// Loop nests below the output loops, one after the other, as the linearizer opens them: one per
// set of reduce loops outside every other reduce's loops (Note [accumulator groups] in
// codegen/linearize.cpp), and one of the row's element loops (Note [row loops]).
size_t sequential_loop_nests(const KernelInfo& k) {
  std::vector<std::vector<UOpPtr>> nests;
  for (auto& r : k.loops.top_reduces)
    if (std::find(nests.begin(), nests.end(), loops_of(r)) == nests.end()) nests.push_back(loops_of(r));
  return nests.size() + (k.loops.row_elements.empty() ? 0 : 1);
}

// Note [contiguous lanes]: the lanes of one vector of the kernel's narrowest elements (at least
// lim.lanes, at most MAX_VECTOR_LANES), or 0 where the device has no vector accesses or the
// innermost output loop does not hold whole vectors.
constexpr int64_t MAX_VECTOR_LANES = 8;
int64_t lanes_of_a_vector(const KernelInfo& k, const GpuLimits& lim) {
  if (lim.vector_bytes == 0 || !knobs::VECTORS) return 0;
  return std::max(lim.lanes, std::min(MAX_VECTOR_LANES, lim.vector_bytes / k.narrowest));
}
int64_t vector_lanes(const KernelInfo& k, const GpuLimits& lim) {
  int64_t lanes = lanes_of_a_vector(k, lim);
  if (lanes == 0 || k.loops.outer.empty()) return 0;
  return trip(k.loops.outer.back()) % lanes == 0 ? lanes : 0;
}

// Note [contiguous lanes], Note [reduce lanes]: lane c's loop indices, lane 0's with c added to
// the innermost loop's.
std::unordered_map<const UOp*, UOpPtr> lane_indices(const std::unordered_map<const UOp*, UOpPtr>& lane0, const UOp* inner,
                                                    int64_t c) {
  auto sub = lane0;
  sub[inner] = kalu(Op::ADD, lane0.at(inner), kint(c));
  return sub;
}

// Note [reduce lanes]: the lanes of a grouped reduction (g.loops, g.threads set), 1 for none.
int64_t reduce_lanes(const KernelInfo& k, const Grouping& g, const GpuLimits& lim) {
  int64_t lanes = lanes_of_a_vector(k, lim);
  if (lanes < 2 || !contiguous_loads(k, g.loops.back())) return 1;
  while (lanes > 1 && (g.length % (g.threads * lanes) != 0 || trip(g.loops.back()) % lanes != 0)) lanes /= 2;
  return lanes;
}

// Note [packed groups]: groups of `threads` per work-group, 1 where they are not packed.
constexpr int64_t PACKED_BLOCK = 64;
int64_t packed_groups(const KernelInfo& k, int64_t threads, const GpuLimits& lim) {
  if (threads >= SHORT_DIM || lim.group_threads_per_slot < SHORT_DIM) return 1;
  int64_t p = pow2_divisor(k.outputs, PACKED_BLOCK / threads);
  return p * threads >= SHORT_DIM ? p : 1;
}

// Note [grouped rows]: every loop of the row is one loop of N trips, none inside another.
Grouping find_row_grouping(const KernelInfo& k, const GpuLimits& lim) {
  if (k.loops.top_reduces.size() != k.reduces.size() || k.loops.row_elements.size() > 1) return {};
  Grouping g;
  for (auto& r : k.reduces) {
    if (r->src.size() != 2 || r->dtype == DType::Bool) return {};
    if (std::find(g.ranges.begin(), g.ranges.end(), r->src[1]) == g.ranges.end()) g.ranges.push_back(r->src[1]);
  }
  for (auto& r : k.loops.row_elements) g.ranges.push_back(r);
  int64_t n = trip(g.ranges[0]);
  for (auto& r : g.ranges)
    if (trip(r) != n) return {};
  if (k.reduces.empty() || n < lim.row_min_length) return {};
  for (auto& u : k.loads)
    for (auto& r : g.ranges)
      if (depends_on(u->src[1], r) && index_stride(u->src[1], r) != 1) return {};
  int64_t cap = std::min(lim.group_threads, n / lim.group_min_per_thread);
  g.threads = pow2_divisor(n, cap);
  if (g.threads < 16) g.threads = pow2_at_most(cap), g.tail = true;  // Note [row tails]
  if (g.threads < 16) return {};
  return g;
}

// Note [grouped reduction]; Note [short rows]
constexpr int64_t MIN_GROUP = 16;
Grouping find_grouping(const KernelInfo& k, const GpuLimits& lim) {
  if (sequential_loop_nests(k) > 1) return find_row_grouping(k, lim);
  if (k.reduces.empty()) return {};
  Grouping g;
  int64_t slot_bytes = 0;  // local memory of the combines, per slot
  for (auto& r : k.reduces) {
    if (r->src.size() < 2 || r->dtype == DType::Bool) return {};
    if (r != k.reduces[0] && loops_of(r) != g.loops) return {};
    g.loops = loops_of(r);
    slot_bytes += static_cast<int64_t>(itemsize(is_half(r->dtype) ? DType::Float32 : r->dtype));  // half in float32
  }
  g.length = 1;
  for (auto& r : g.loops) g.length *= trip(r);
  int64_t n = g.length;
  bool few_outputs = k.outputs <= lim.group_max_outputs &&
                     n >= (k.outputs == 1 ? lim.lone_min_length : lim.group_min_length);
  bool long_reduce = k.outputs <= lim.group_long_max_outputs && n >= lim.group_long_length &&
                     contiguous_loads(k, g.loops.back());
  bool row = n >= lim.row_min_length && row_loads(k, g.loops.back());
  if (!few_outputs && !long_reduce && !row) return {};
  int64_t cap = std::min(lim.group_threads, n / lim.group_min_per_thread);
  if (row) cap = std::max(cap, MIN_GROUP);  // Note [short rows]
  cap = std::min(cap, lim.group_local_bytes * lim.group_threads_per_slot / slot_bytes);
  cap = std::min(cap, lim.group_accumulators / static_cast<int64_t>(k.reduces.size()));
  g.threads = pow2_divisor(n, cap);
  if (g.threads < MIN_GROUP) return {};
  g.lanes = reduce_lanes(k, g, lim);
  return g;
}

// Note [elementwise lanes]: lanes per thread for a kernel without reduce loops whose dimension 0
// holds `size0` elements (1: none). Contiguous lanes (Note [contiguous lanes]) may be fewer than
// a vector where the kernel has too few elements for a vector per thread.
int64_t elementwise_lanes(const KernelInfo& k, int64_t size0, const GpuLimits& lim) {
  if (!k.reduces.empty() || !k.loops.row_elements.empty()) return 1;
  auto fits = [&](int64_t lanes) { return size0 % lanes == 0 && k.outputs / lanes >= lim.lanes_min_threads; };
  if (int64_t v = vector_lanes(k, lim)) {
    for (int64_t lanes = v; lanes >= 2; lanes /= 2)
      if (fits(lanes)) return lanes;
    return 1;
  }
  return lim.lanes >= 2 && fits(lim.lanes) ? lim.lanes : 1;
}

// Note [merged inner loops]: how many innermost output loops dimension 0 holds.
size_t inner_loops_of_dim0(const KernelInfo& k, const GpuLimits& lim) {
  const std::vector<UOpPtr>& outer = k.loops.outer;
  int64_t size = 1;
  for (size_t m = 1; m <= outer.size(); m++) {
    size *= trip(outer[outer.size() - m]);
    int64_t lanes = elementwise_lanes(k, size, lim);
    if (lanes > 1 && pow2_divisor(size / lanes, lim.max_local) >= SHORT_DIM) return m;
  }
  return 1;
}

// Note [thread mapping]: which output loops each dimension holds, [lo, hi) of the outer loops,
// and its size. Grouped: all of them on the group id. Dimension 0 holds the `in_dim0` innermost
// loops (Note [merged inner loops]), each further dimension the next loop out, the last one all
// loops above it.
struct Dimension {
  size_t lo, hi;
  int64_t size;
};
std::vector<Dimension> dimensions(const KernelInfo& k, bool grouped, const GpuLimits& lim) {
  const std::vector<UOpPtr>& outer = k.loops.outer;
  size_t n_outer = outer.size();
  size_t in_dim0 = grouped ? 1 : inner_loops_of_dim0(k, lim);
  int out_dims = std::min<int>(static_cast<int>(n_outer - in_dim0 + 1), grouped ? 1 : lim.max_dims);
  if (n_outer == 0) out_dims = 0;
  std::vector<Dimension> dims;
  for (int d = 0; d < out_dims; d++) {
    size_t hi = d == 0 ? n_outer : n_outer - in_dim0 - static_cast<size_t>(d - 1);
    size_t lo = d == out_dims - 1 ? 0 : d == 0 ? n_outer - in_dim0 : hi - 1;
    int64_t size = 1;
    for (size_t i = lo; i < hi; i++) size *= trip(outer[i]);
    dims.push_back({lo, hi, size});
  }
  return dims;
}

// Note [contiguous lanes]: lane c's loop indices are lane 0's, whose flat index `first` is a
// multiple of the lanes, with c added to the innermost loop's (which holds whole vectors).
void contiguous_lanes(const UOpPtr& first, std::span<const UOpPtr> outer, const Dimension& dim, std::vector<UOpPtr>& code,
                      std::vector<std::unordered_map<const UOp*, UOpPtr>>& sub) {
  std::span<const UOpPtr> loops = outer.subspan(dim.lo, dim.hi - dim.lo);
  split_flat_index(first, loops, dim.size, code, sub[0]);
  for (size_t c = 1; c < sub.size(); c++) sub[c] = lane_indices(sub[0], loops.back().get(), static_cast<int64_t>(c));
}

// The output loops as thread indices, per lane, and the launch.
struct OutputMapping {
  std::vector<std::unordered_map<const UOp*, UOpPtr>> sub;  // per lane: output loop -> its index
  std::vector<int64_t> global, local;
};

OutputMapping map_output_loops(const KernelInfo& k, const Grouping& grp, const GpuLimits& lim) {
  bool grouped = grp.threads > 0;
  std::vector<Dimension> dims = dimensions(k, grouped, lim);
  int64_t lanes = grouped || dims.empty() ? 1 : elementwise_lanes(k, dims[0].size, lim);
  OutputMapping m;
  m.sub.resize(static_cast<size_t>(lanes));
  std::vector<UOpPtr> code;  // the index arithmetic (reached through m.sub)
  int64_t budget = lim.max_local;
  for (size_t d = 0; d < dims.size(); d++) {
    int64_t size = dims[d].size;
    std::vector<UOpPtr> idx;  // the dimension's element index, per lane
    if (grouped) {
      idx = {grp.per_block > 1  // Note [packed groups]
                 ? kalu(Op::IDIV, thread_index(SpecialKind::GlobalId, 0, size * grp.threads), kint(grp.threads))
                 : thread_index(SpecialKind::GroupId, 0, size)};
      m.global.push_back(size * grp.threads);
      m.local.push_back(grp.threads * grp.per_block);
    } else if (d == 0 && lanes > 1) {  // Note [elementwise lanes]
      int64_t l = pow2_divisor(size / lanes, budget);
      auto g = thread_index(SpecialKind::GroupId, 0, size / lanes / l), t = thread_index(SpecialKind::LocalId, 0, l);
      m.global.push_back(size / lanes);
      m.local.push_back(l);
      budget /= l;
      if (vector_lanes(k, lim)) {  // Note [contiguous lanes]
        contiguous_lanes(kalu(Op::MUL, kalu(Op::ADD, kalu(Op::MUL, g, kint(l)), t), kint(lanes)),
                         k.loops.outer, dims[0], code, m.sub);
        continue;
      }
      auto base = kalu(Op::ADD, kalu(Op::MUL, g, kint(l * lanes)), t);
      for (int64_t c = 0; c < lanes; c++) idx.push_back(c == 0 ? base : kalu(Op::ADD, base, kint(c * l)));
    } else {
      idx = {thread_index(SpecialKind::GlobalId, static_cast<int>(d), size)};
      m.global.push_back(size);
      m.local.push_back(local_divisor(size, budget));  // Note [local sizes]
      budget /= m.local.back();
    }
    // each loop's index from the dimension's (Note [merged inner loops])
    std::span<const UOpPtr> loops(k.loops.outer.begin() + static_cast<std::ptrdiff_t>(dims[d].lo), dims[d].hi - dims[d].lo);
    for (size_t c = 0; c < m.sub.size(); c++)
      split_flat_index(idx[idx.size() == 1 ? 0 : c], loops, size, code, m.sub[c]);
  }
  if (m.global.empty()) {  // a scalar output: one group, or one thread
    int64_t l = grouped ? grp.threads : 1;
    m.global = {l}, m.local = {l};
  }
  return m;
}

class GroupRewrite;
UOpPtr rewrite_kernel(const UOpPtr& ast, const std::unordered_map<const UOp*, UOpPtr>& sub, const GroupRewrite& group);

// The graph of a grouped kernel's REDUCEs, loads and stores as the group's threads run them.
class GroupRewrite {
 public:
  GroupRewrite(const Grouping& grp, std::unordered_map<const UOp*, UOpPtr>& sub) : grp_(grp) {
    if (grp.threads == 0) return;
    lid_ = thread_index(SpecialKind::LocalId, 0, grp.threads * grp.per_block);
    if (grp.per_block > 1) lid_ = kalu(Op::MOD, lid_, kint(grp.threads));  // Note [packed groups]
    if (!grp.loops.empty()) {
      // Note [grouped reduction]: the reduce loops become one loop of length/L trips over the flat
      // index f = r*L + lid, from which each loop's index is recovered; with lanes (Note [reduce
      // lanes]) length/(L*V) trips over f = (r*L + lid)*V + c
      flat_ = make_uop(Op::RANGE, dtypes::index, {kint(grp.length / (grp.threads * grp.lanes))}, grp.loops[0]->arg);
      std::vector<UOpPtr> code;
      UOpPtr first = kalu(Op::ADD, kalu(Op::MUL, flat_, kint(grp.threads)), lid_);
      if (grp.lanes > 1) first = kalu(Op::MUL, first, kint(grp.lanes));
      split_flat_index(first, grp.loops, grp.length, code, sub);  // Note [flat index in 32 bits]
      for (int64_t c = 1; c < grp.lanes; c++) lane_sub_.push_back(lane_indices(sub, grp.loops.back().get(), c));
    }
    // Note [grouped rows]: each loop N/L trips (rounded up) of index r*L + lid
    for (auto& range : grp.ranges) {
      int64_t trips = (trip(range) + grp.threads - 1) / grp.threads;
      auto r = make_uop(Op::RANGE, dtypes::index, {kint(trips)}, range->arg);
      auto index = kalu(Op::ADD, kalu(Op::MUL, r, kint(grp.threads)), lid_);
      loop_of_[range.get()] = r;
      if (grp.tail) valid_[range.get()] = kalu(Op::CMPLT, index, kint(trip(range)));  // Note [row tails]
      sub[range.get()] = index;
    }
  }

  // n (of the mapped kernel), whose sources are now `src`, as the group runs it.
  UOpPtr rebuild(const UOpPtr& n, std::vector<UOpPtr> src) const {
    if (n->op == Op::REDUCE && lid_) return grouped_reduce(n, src);
    UOpPtr out = src == n->src ? n : make_uop(n->op, n->dtype, src, n->arg);
    if (n->op == Op::LOAD || n->op == Op::STORE)
      if (auto v = tail_gate(n)) out = gated(out, v);
    // only thread 0 of the group stores an address the whole group shares
    if (lid_ && out->op == Op::STORE && !depends_on(out->src[1], lid_)) out = gated(out, kalu(Op::CMPLT, lid_, kint(1)));
    return out;
  }

 private:
  const Grouping& grp_;
  UOpPtr lid_, flat_;
  std::unordered_map<const UOp*, UOpPtr> loop_of_;  // a row's loop -> the loop its threads walk
  std::unordered_map<const UOp*, UOpPtr> valid_;    // Note [row tails]: a row's loop -> index < N
  std::vector<std::unordered_map<const UOp*, UOpPtr>> lane_sub_;  // Note [reduce lanes]: lanes 1..V-1

  UOpPtr grouped_reduce(const UOpPtr& n, const std::vector<UOpPtr>& src) const {
    if (flat_ && lane_sub_.empty()) return make_uop(Op::REDUCE, n->dtype, {src[0], flat_, lid_}, n->arg);
    if (flat_) return lanes_reduce(n, src[0]);
    const UOp* range = n->src[1].get();
    UOpPtr x = src[0];
    if (auto it = valid_.find(range); it != valid_.end())  // past the row: the update keeps the partial
      x = kwhere(it->second, x, kconst(n->dtype, reduce_identity(std::get<Op>(n->arg), n->dtype)));
    return make_uop(Op::REDUCE, n->dtype, {x, loop_of_.at(range), lid_}, n->arg);
  }
  // Note [reduce lanes]: every lane's value, combined by the reduce's op (in float32 for a half
  // type) before the accumulator; lane 0's is `x`, the others are n's source under lane_sub_.
  UOpPtr lanes_reduce(const UOpPtr& n, const UOpPtr& x) const {
    Op op = std::get<Op>(n->arg);
    DType acc = is_half(n->dtype) ? DType::Float32 : n->dtype;
    auto widened = [&](const UOpPtr& v) { return v->dtype == acc ? v : kcast(v, acc); };
    UOpPtr value = widened(x);
    for (auto& sub : lane_sub_) value = kalu(op, value, widened(rewrite_kernel(n->src[0], sub, *this)));
    UOpPtr r = make_uop(Op::REDUCE, acc, {value, flat_, lid_}, n->arg);
    return acc == n->dtype ? r : kcast(r, n->dtype);
  }
  // the gate of a load or store whose address moves along a loop with a tail (Note [row tails])
  UOpPtr tail_gate(const UOpPtr& u) const {
    for (auto& r : grp_.ranges)
      if (valid_.count(r.get()) && depends_on(u->src[1], r)) return valid_.at(r.get());
    return nullptr;
  }
  static UOpPtr gated(const UOpPtr& u, const UOpPtr& v) {
    auto src = u->src;
    size_t at = u->op == Op::LOAD ? 2 : 3;  // a load's gate is its third source, a store's its fourth
    if (src.size() > at) src[at] = kalu(Op::AND, src[at], v);
    else src.push_back(v);
    return make_uop(u->op, u->dtype, src, u->arg);
  }
};

// ast with each node in `sub` replaced by its image and the grouped nodes rebuilt by `group`.
UOpPtr rewrite_kernel(const UOpPtr& ast, const std::unordered_map<const UOp*, UOpPtr>& sub, const GroupRewrite& group) {
  std::unordered_map<const UOp*, UOpPtr> image;
  for (auto& n : toposort({ast})) {
    if (auto it = sub.find(n.get()); it != sub.end()) {
      image[n.get()] = it->second;
      continue;
    }
    std::vector<UOpPtr> src;
    for (auto& s : n->src) src.push_back(image.at(s.get()));
    image[n.get()] = group.rebuild(n, std::move(src));
  }
  return image.at(ast.get());
}

struct Mapped {
  ThreadMappedKernel kernel;
  bool grouped = false;
};

Mapped gpu_dims(const UOpPtr& ast, const GpuLimits& lim) {
  KernelInfo info = kernel_info(ast);
  Grouping grp = find_grouping(info, lim);
  if (grp.threads > 0) grp.per_block = packed_groups(info, grp.threads, lim);
  OutputMapping m = map_output_loops(info, grp, lim);
  GroupRewrite group(grp, m.sub[0]);
  UOpPtr out;
  if (m.sub.size() == 1) {
    out = rewrite_kernel(ast, m.sub[0], group);
  } else {  // lane by lane (Note [lanes in lockstep] in codegen/linearize.cpp)
    std::vector<UOpPtr> stores;
    for (auto& sub : m.sub)
      for (auto& s : stores_of(rewrite_kernel(ast, sub, group))) stores.push_back(s);
    out = make_uop(Op::SINK, DType::Float32, stores, Arg{static_cast<int64_t>(m.sub.size())});
  }
  return {{out, {kernel_name(ast), m.global, m.local}}, grp.threads > 0};
}

// Note [launch limits]
bool launch_fits(const GpuLaunch& k, const GpuLimits& lim) {
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

void clamp_local_sizes(GpuLaunch& k, const GpuLimits& lim) {
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

void set_launch(LinearKernel& k, const GpuLaunch& launch) {
  k.name = launch.name;
  k.global_size = launch.global_size;
  k.local_size = launch.local_size;
}

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

bool grouped_reduction(const UOpPtr& ast, const GpuLimits& lim) { return find_grouping(kernel_info(ast), lim).threads > 0; }

ThreadMappedKernel map_threads(const UOpPtr& ast, const GpuLimits& lim) {
  Mapped m = gpu_dims(ast, lim);
  if (!m.grouped) clamp_local_sizes(m.kernel.launch, lim);  // a group's size is fixed by its shared array
  if (launch_fits(m.kernel.launch, lim)) return m.kernel;
  // Note [launch limits]. Grouped kernels never get here: their groups are all on dimension 0.
  TG_ASSERT(!m.grouped, "kernel '", m.kernel.launch.name, "': grouped reduction outside the launch limits");
  GpuLimits flat = lim;
  flat.max_dims = 1;
  ThreadMappedKernel k = gpu_dims(ast, flat).kernel;
  TG_CHECK(launch_fits(k.launch, lim), "kernel '", k.launch.name, "': no launch grid within the device's limits for ",
           k.launch.global_size.empty() ? 0 : k.launch.global_size[0], " threads");
  return k;
}

}  // namespace tg
