// Long reductions in two stages, with few outputs (Note [split reductions]), many (Note [split
// long reductions]) or over rows of a matrix whose columns are the outputs (Note [split column
// sums]).
//
// Note [split reductions]: a GPU runs a reduction with few outputs as one work-group per output
// (Note [grouped reduction] in codegen/gpu_dims.cpp). BatchNorm's statistics and their gradient
// sums over N, H and W have one output per channel, 32 or 64 work-groups on a GPU of 132
// multiprocessors, each walking hundreds of thousands of elements: most of the chip idles. On
// devices whose policy says split_reductions (GPU-style ones) such a reduce (at most SPLIT_GROUPS / 2 outputs,
// at least SPLIT_MIN_LENGTH elements each) is cut in two: its outermost reduced axis that splits
// best, of size D, is reshaped into (S, D/S), the first stage reduces everything but S into
// partial results (outputs * S of them, at most SPLIT_GROUPS, each of at least SPLIT_MIN_PART
// elements), a kernel of its own with as many work-groups, and the kernel that held the reduce
// reduces the S partials instead (a short loop per output) and keeps its epilogue (a mean's
// scale). Neither stage needs atomics, so results do not depend on timing. Half-type reductions
// keep their partials in float32 and round once, as a one-stage reduce does. The CPU keeps one
// stage: its thread pool splits the output loop and a core walks a long reduction at memory speed.
// SPLIT_REDUCE=0 turns this off.
//
// Note [split long reductions]: a long reduction with many outputs (a convolution's weight
// gradient: 25600 weights of the CNN's 5x5 32->32 layer, each a sum over N*H*W = 204800
// products) is a grouped reduction too (Note [grouped reduction] in codegen/gpu_dims.cpp), one
// work-group per register tile of outputs (codegen/opt_gpu.cpp), but a tile of 100 accumulators
// leaves room for groups of 128 threads only, and 256 such groups put 8 warps on each of the
// H200's 132 multiprocessors: too few to hide the latency of their loads. Such a reduce (more
// than SPLIT_GROUPS / 2 and at most LONG_MAX_OUTPUTS outputs, at least LONG_MIN_LENGTH elements
// each) is split the same way into at most SPLIT_PARTS partials per output, along its reduced
// axis that splits best (the batch), each part at least LONG_MIN_PART elements long so that the
// first stage is still a long reduction with the same register tile: S times as many
// work-groups walk S times shorter loops, and the second stage adds S numbers per output (a
// column sum over partials that are contiguous across outputs). The partials are at most
// LONG_MAX_PARTIALS (4 MiB of float32), which also keeps the first stage's work-groups (partials
// over a register tile's lanes) within what gpu_dims groups. On an H200, batch 512, 8 parts took
// the 5x5 32->32 weight gradient from 1.00 to 0.57 + 0.007 ms and the 5x5 1->32 one from 0.164
// to 0.079 + 0.007 ms (16 parts: 0.59 and 0.10; 32 were slower again). Shorter long reductions
// (the 3x3 layers', 18432 and 32768 elements) run enough threads in one stage already: their
// groups hold up to 256 threads of 36 accumulators, and split into 4 or 8 parts they got slower
// (0.107 -> 0.131 and 0.080 -> 0.115 ms, each plus its second stage), hence LONG_MIN_LENGTH.
// On the tensor cores (CUDA with TF32 >= 1: Note [tensor-core contractions] in
// codegen/tensor_core.cpp) the first stage is a contraction of 32 x 800 outputs per part whose
// warp tiles need many parts to give each SM enough warps: 32 parts (6400 elements each) took
// the 5x5 32->32 weight gradient from 0.584 ms (8 parts, FMA kernels) to 0.459 ms and the CNN's
// step from 2.23 to 2.10 ms; with 16 parts too few warps remain and the FMA kernel stays (2.29).
// Splitting the 3x3 layers' weight gradients too (parts of at least 1024 elements: 16 and 32 of
// them, which then run on the tensor cores, 0.186 -> 0.154 ms) left the step where it was (1.90
// ms) and the CNN's accuracy lower (mean 89.03% over three seeds against 89.35%): not kept.
// SPLIT_PARTS=n sets the number for every device, SPLIT_PARTS=1 turns only this off.
//
// Note [split column sums]: a reduction over the outer axes of a row-major tensor whose innermost
// axis it keeps (a column sum: a bias gradient, LayerNorm's weight and bias gradients, the sum
// of a [B, T, C] gradient over B and T) reads memory coalesced only with neighbouring threads on
// neighbouring columns, one thread per output walking down the rows (Note [column sums] in
// codegen/opt_gpu.cpp). GPT-2's [16 * 1024, 768] ones have 768 outputs: as one work-group per
// output (Note [grouped reduction]) every load of a warp touched 32 rows 3 KB apart (0.57 ms on
// an H100, for 50 MB that take 0.02 ms at the memory's speed), and as 768 threads on 132
// multiprocessors nearly all of the chip would idle. So such a reduce (its innermost axis kept,
// at least COLUMN_MIN_WIDTH wide and not moved by the kernel's views, COLUMN_MIN_ELEMENTS
// elements or more in all) is split along a reduced axis into S parts, S*outputs up to
// the device's GpuLimits::column_partials (2^17 by default) and each part at
// least COLUMN_MIN_PART rows: the first stage runs S*outputs threads (98304 for 768 columns in
// 128 parts of 128 rows), each with several loads in flight, whose warps read 128 contiguous
// bytes per row; the second sums S partials per column, one thread per column or, from 256
// partials, a group per column (Note [grouped reduction]). CUDA takes 2^18 partials: GPT-2's
// [16, 1024, 768] column sums in 256 parts of 16 x 4 rows, whose loops are short enough to be
// unrolled whole (Note [unrolled short loops] in codegen/render_cuda.cpp), so all of a thread's
// 64 loads are in flight at once; on an H100 the first stage went from 0.0383 to 0.029-0.031 ms
// a launch, the second from 0.0076 to 0.007-0.009 (two leases), GPT-2's step (74 such pairs)
// from 42.4 to 41.5 ms.
// This rule comes before the two above: a column sum with few outputs would otherwise get a
// strided grouped first stage, one with many at most SPLIT_PARTS parts.
#include "tinygrad/schedule/split_reduce.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"

namespace tg {

namespace {

constexpr int64_t SPLIT_GROUPS = 1024;
constexpr int64_t SPLIT_MIN_LENGTH = 16384;
constexpr int64_t SPLIT_MIN_PART = 1024;
constexpr int64_t LONG_MAX_OUTPUTS = int64_t{1} << 16;  // gpu_dims' group_long_max_outputs
constexpr int64_t LONG_MIN_LENGTH = int64_t{1} << 16;
constexpr int64_t LONG_MIN_PART = 4096;  // opt_gpu's LONG_REDUCE, gpu_dims' group_long_length
constexpr int64_t LONG_MAX_PARTIALS = int64_t{1} << 20;
constexpr int64_t LONG_PARTS = 8, TENSOR_CORE_PARTS = 32;
constexpr int64_t COLUMN_MIN_WIDTH = 8;  // a 32-byte sector of float32
constexpr int64_t COLUMN_MIN_ELEMENTS = int64_t{1} << 20;
constexpr int64_t COLUMN_MIN_PART = 64;

// SPLIT_PARTS, or where it is 0 (the default) LONG_PARTS, or TENSOR_CORE_PARTS where the first
// stage runs on the tensor cores (Note [split long reductions]).
int64_t long_parts(const std::string& device) {
  if (knobs::SPLIT_PARTS.get() > 0) return knobs::SPLIT_PARTS.get();
  bool tensor_cores = tf32_for(Float32Product::Convolution) && get_device(device).supports(Feature::TensorCores);
  return tensor_cores ? TENSOR_CORE_PARTS : LONG_PARTS;
}

// Note [split column sums]: the most partial sums of a column sum on `device`.
int64_t column_partials(const std::string& device) {
  const auto& gpu = get_device(device).policy().gpu;
  return gpu ? gpu->column_partials : GpuLimits{}.column_partials;
}

// The largest divisor s of n with s <= max_parts and length / s >= min_part.
int64_t split_factor(int64_t n, int64_t max_parts, int64_t length, int64_t min_part) {
  for (int64_t s = std::min(n, max_parts); s >= 2; s--)
    if (n % s == 0 && length / s >= min_part) return s;
  return 1;
}

// Note [split column sums]: the reduce keeps x's innermost axis, at least COLUMN_MIN_WIDTH wide; no
// view of the kernel (`nodes`) moves the innermost axis of its source elsewhere (a transpose), so
// neighbouring outputs read neighbouring elements; and no operand broadcast to x's shape along a
// kept axis moves along another kept axis and a reduced one (an operand of a matrix product, which
// the product's own kernels and Note [split long reductions] take). A row's LayerNorm statistics
// (broadcast along the columns), a bias or a position embedding (broadcast along rows or the
// batch) may be broadcast; in a shape of other axes, a constant or a value per row along the
// innermost axis.
bool column_sum(const UOp& reduce, const std::vector<const UOp*>& nodes) {
  const Shape& x = reduce.src[0]->shape;
  const auto& axes = reduce.arg_reduce().axes;
  auto reduced = [&](size_t a) { return std::find(axes.begin(), axes.end(), static_cast<int64_t>(a)) != axes.end(); };
  if (x.empty() || x.back() < COLUMN_MIN_WIDTH || reduced(x.size() - 1)) return false;
  for (const UOp* n : nodes) {
    if (n->op == Op::PERMUTE && n->arg_ints().back() != static_cast<int64_t>(n->shape.size()) - 1) return false;
    if (n->op != Op::EXPAND) continue;
    const Shape& from = n->src[0]->shape;
    if (n->shape != x) {  // in other axes than x's: a constant, or a value per row broadcast along its innermost axis
      Shape row = n->shape;
      row.back() = 1;
      if (prod(from) > 1 && from != row) return false;
      continue;
    }
    bool along_reduced = false, along_kept = false, broadcast_kept = false;
    for (size_t a = 0; a < x.size(); a++) {
      if (from[a] > 1) (reduced(a) ? along_reduced : along_kept) = true;
      broadcast_kept |= !reduced(a) && from[a] == 1 && x[a] > 1;
    }
    if (along_reduced && along_kept && broadcast_kept) return false;
  }
  return true;
}

}  // namespace

// Note [split reductions]
std::optional<SplitReduce> split_reduce(const UOpPtr& root, const std::function<bool(const UOp*)>& is_input) {
  // the kernel's reduces: nodes reached from the root before its inputs
  UOpPtr reduce;
  std::vector<const UOp*> stack{root.get()};
  std::unordered_set<const UOp*> seen;
  std::vector<const UOp*> nodes;  // the kernel's nodes, inputs excluded
  std::unordered_map<const UOp*, UOpPtr> owner;  // raw pointer -> shared pointer of the kernel's nodes
  owner[root.get()] = root;
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second || (n != root.get() && is_input(n))) continue;
    nodes.push_back(n);
    if (n->op == Op::REDUCE_AXIS) {
      if (reduce) return std::nullopt;
      reduce = owner.at(n);
    }
    for (size_t i = 0; i < value_src_count(*n); i++) {
      owner[n->src[i].get()] = n->src[i];
      stack.push_back(n->src[i].get());
    }
  }
  if (!reduce) return std::nullopt;
  const UOpPtr& x = reduce->src[0];
  const auto& ra = reduce->arg_reduce();
  int64_t outputs = prod(reduce->shape);
  if (outputs <= 0) return std::nullopt;
  int64_t length = prod(x->shape) / outputs;
  int64_t max_parts = 1, min_part = 0;
  bool columns = outputs * length >= COLUMN_MIN_ELEMENTS && column_sum(*reduce, nodes);
  if (columns) {  // Note [split column sums]
    max_parts = column_partials(reduce->device) / outputs, min_part = COLUMN_MIN_PART;
  } else if (outputs * 2 <= SPLIT_GROUPS && length >= SPLIT_MIN_LENGTH) {
    max_parts = SPLIT_GROUPS / outputs, min_part = SPLIT_MIN_PART;
  } else if (outputs * 2 > SPLIT_GROUPS && outputs <= LONG_MAX_OUTPUTS && length >= LONG_MIN_LENGTH) {
    // Note [split long reductions]
    max_parts = std::min<int64_t>(long_parts(reduce->device), LONG_MAX_PARTIALS / outputs),
    min_part = LONG_MIN_PART;
  }
  int64_t axis = -1, s = 1;
  for (auto a : ra.axes) {
    int64_t f = split_factor(x->shape[static_cast<size_t>(a)], max_parts, length, min_part);
    if (f > s) axis = a, s = f;
  }
  if (s < 2) return std::nullopt;
  if (knobs::DEBUG >= 3)
    std::fprintf(stderr, "split %s of %s over %s: %lld parts of axis %lld%s\n", op_name(ra.op), shape_str(x->shape).c_str(),
                 shape_str(ra.axes).c_str(), static_cast<long long>(s), static_cast<long long>(axis),
                 columns ? " (column sum)" : "");

  // first stage: (.., D, ..) as (.., S, D/S, ..), reduced over all but S
  bool half = reduce->dtype == DType::Float16 || reduce->dtype == DType::BFloat16;
  UOpPtr src = half ? lazy::cast(x, DType::Float32) : x;
  Shape split = x->shape;
  auto at = split.begin() + axis;
  int64_t d = *at;
  *at = s;
  split.insert(at + 1, d / s);
  std::vector<int64_t> axes;
  for (auto a : ra.axes) axes.push_back(a < axis ? a : a + 1);
  UOpPtr partial = lazy::reduce(lazy::reshape(src, split), ra.op, axes);
  UOpPtr combined = lazy::reshape(lazy::reduce(partial, ra.op, {axis}), reduce->shape);
  if (half) combined = lazy::cast(combined, reduce->dtype);

  // the root again, with the reduce replaced (its inputs stay as they are)
  std::unordered_map<const UOp*, UOpPtr> memo{{reduce.get(), combined}};
  std::function<UOpPtr(const UOpPtr&)> rebuild = [&](const UOpPtr& n) -> UOpPtr {
    if (auto it = memo.find(n.get()); it != memo.end()) return it->second;
    if (n != root && is_input(n.get())) return n;
    auto srcs = n->src;
    for (size_t i = 0; i < value_src_count(*n); i++) srcs[i] = rebuild(n->src[i]);
    UOpPtr out = srcs == n->src ? n : make_uop(n->op, n->dtype, srcs, n->arg, n->shape, n->device);
    return memo[n.get()] = out;
  };
  return SplitReduce{partial, rebuild(root)};
}

}  // namespace tg
