// GPU register tiles (Note [gpu register tiles]) and partial sums for column sums (Note [column
// sums]).
//
// Note [gpu register tiles]: on a GPU every output loop becomes threads, so a thread computes
// one output and loads each operand once per multiply-add: a convolution (no library product
// takes its sliding-window operands) is then bound by load instructions, not by arithmetic.
// Upcasting output loops that some operand does not move along gives each thread a tile of
// outputs that share that operand's loads from registers (Note [upcast and unroll] in opt.h):
//  - a kernel with many outputs and a short reduction (a convolution's forward pass or its input
//    gradient) gets a TILE x TILE_OTHER tile: the innermost output loop that the stores are
//    contiguous along (the output column, which the weights do not move along; on the output row
//    instead where the same operand moves along it, Note [row tiles]) and a loop of the other
//    operand (the output channel, which the input does not move along). Each step of the
//    reduce loop then loads TILE + TILE_OTHER values for TILE*TILE_OTHER multiply-adds instead of
//    2 for 1. On an H200 a 4 x 8 tile took the CNN's 5x5 32->32 forward pass from 0.59 to 0.45 ms
//    and its input gradient from 0.78 to 0.64 ms against 4 x 4 (the 3x3 layers' four kernels
//    0.57 -> 0.48 ms);
//  - a long reduction (at least LONG_REDUCE elements: a convolution's weight gradient, which
//    gpu_dims runs as a grouped reduction) has its small output loops (the filter's rows and
//    columns, at most SMALL_AXIS long) upcast whole, innermost first, while at least MIN_GROUPS
//    work-groups remain: the incoming gradient is loaded once for every filter tap, and the
//    input's taps are neighbouring elements that the cache serves. Then a loop of the other
//    operand (the output channel, along which the input's taps do not move) is upcast by up to
//    LONG_OTHER_TILE where MIN_GROUPS work-groups still remain, so each of the 25 input taps
//    loaded serves 4 channels: a step of the reduce loop loads 29 values for 100 multiply-adds
//    instead of 26 for 25 (the 5x5 32->32 weight gradient 1.39 -> 1.01 ms on an H200, in groups of
//    128 threads, Note [grouped reduction]).
// Reductions without reuse (a sum, BatchNorm's statistics) get no tile.
//
// Note [tile lengths]: a short reduction's tile loads TILE_OTHER weights and about TILE + filter
// rows inputs (taps shared between rows once unrolled) per filter column and input channel for
// TILE * TILE_OTHER multiply-adds, so the loads per multiply-add fall with TILE, the lanes along
// the row. Rows of 20 and 24 have no power-of-two divisor above 4, so TILE is the largest divisor
// up to 6 of the row count, any divisor, while TILE_OTHER (channels, 32 or 64) stays a power of
// two. On an H200, batch 512, against 4 x 8 tiles: the 5x5 32->32 forward pass 0.384 -> 0.332 ms
// (5 x 8), its input gradient 0.558 -> 0.450 ms (6 x 8), the 3x3 layers' four kernels 0.436 ->
// 0.365 ms, the step 2.79 -> 2.56 ms. Also measured (the largest divisor up to the first figure):
// 8 x 4 (2.65 ms), 10 x 4 (2.57), 5 x 8 (4 x 8 for rows of 24: 2.68), 8 x 8 (2.63), 10 x 8 (2.66).
//
// Note [row tiles]: the TILE lanes of a short reduction's tile run along the output row (the loop
// next out from the contiguous one that the same operand moves along: the input moves along
// both), not along the contiguous column. With column lanes a thread's TILE outputs were
// neighbours, so for one lane the threads of a warp were TILE elements apart and each load
// instruction touched TILE times as many cache sectors as elements; with row lanes the columns
// stay on the threads, neighbouring threads load neighbouring elements for every lane, and the
// stores are coalesced too. The lanes still share the weights' loads, and with the filter loops
// unrolled (Note [unrolled short loops] in render_cuda.cpp) row lane r of filter row i reads
// what lane r+1 of row i-1 read, as column lanes did along the filter's columns. On an H200,
// both unrolled: the 5x5 32->32 forward pass 0.426 -> 0.401 ms, the 3x3 layers' 0.144 ->
// 0.135 and 0.116 -> 0.109 ms, the input gradient unchanged (0.564 / 0.565 ms), the step 3.12 ->
// 3.06 ms; with rolled loops the forward pass got slower (0.451 -> 0.483 ms). Where no such
// loop exists (a matmul: each of its output loops moves a different operand) the column is
// tiled as before.
//
// Note [column sums]: a reduction over a strided loop whose innermost output loop is contiguous (a
// column sum over the rows of a row-major matrix: a bias gradient, LayerNorm's weight gradient,
// which also reads the row's statistics) runs one thread per output where gpu_dims does not group
// it (Note [grouped reduction]): neighbouring threads take neighbouring columns, so each load of
// a warp reads contiguous memory, but a thread's loads follow one another down its column, one
// in flight at a time. The innermost reduce loop is unrolled by up to COLUMN_UNROLL into partial
// sums, so a thread has that many independent loads (of rows one stride apart) in flight: the
// first stage of a split column sum (Note [split column sums] in schedule/split_reduce.cpp) keeps
// about 3 MB in flight with 98304 threads, what an H100's or H200's memory needs to run at full
// speed. Kernels with shorter columns (fewer than COLUMN_MIN_ROWS, as the second stages of the
// other split reductions) or fewer than COLUMN_MIN_ELEMENTS elements keep their loops. A matrix
// product is no column sum: its operands each move along an output loop that the other does not,
// where a column sum's loads move along the contiguous output loop or along no output loop.
#include "tinygrad/codegen/opt_gpu.h"

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "tinygrad/codegen/gpu_dims.h"

namespace tg {

namespace {

constexpr int64_t TILE = 6;
constexpr int64_t TILE_OTHER = 8;
constexpr int64_t MANY_OUTPUTS = int64_t{1} << 18;
constexpr int64_t LONG_REDUCE = 4096;
constexpr int64_t SMALL_AXIS = 8;
constexpr int64_t MAX_LONG_LANES = 32;
constexpr int64_t LONG_OTHER_TILE = 4;
constexpr int64_t MIN_GROUPS = 128;
constexpr int64_t COLUMN_UNROLL = 8;
constexpr int64_t COLUMN_MIN_ROWS = 64;
constexpr int64_t COLUMN_MIN_ELEMENTS = int64_t{1} << 16;

// The largest of tile, tile/2, ... 2 that divides n (0: none).
int64_t tile_amount(int64_t n, int64_t tile) {
  for (int64_t a = tile; a >= 2; a /= 2)
    if (n % a == 0) return a;
  return 0;
}

// The largest divisor of n from 2 to TILE (0: none): image rows of 20 in tiles of 5, of 24 in
// tiles of 6 (Note [tile lengths]).
int64_t row_tile(int64_t n) {
  for (int64_t a = std::min(n, TILE); a >= 2; a--)
    if (n % a == 0) return a;
  return 0;
}

// Note [column sums]: the partial sums of a column sum, or nothing for other kernels.
std::optional<Opt> column_sum_unroll(const UOpPtr& ast, const std::vector<KernelAxis>& axes, const GpuLimits& limits) {
  const KernelAxis *column = nullptr, *row = nullptr;  // the stores' contiguous loop, the innermost reduce loop
  int64_t n_out = 1, n_red = 1;
  auto stores = stores_of(ast);
  for (auto& a : axes) {
    if (a.size <= 1) continue;
    (a.reduce ? n_red : n_out) *= a.size;
    bool contiguous = !a.reduce && !a.carried;
    for (auto& s : stores) contiguous = contiguous && index_stride(s->src[1], a.range) == 1;
    if (a.reduce) row = &a;  // axes are in loop order
    else if (contiguous) column = &a;
  }
  if (!column || !row || n_red < COLUMN_MIN_ROWS || n_out * n_red < COLUMN_MIN_ELEMENTS) return std::nullopt;
  std::vector<std::unordered_set<const UOp*>> others;  // the loops of loads that stay in a column
  std::unordered_set<const UOp*> column_loops;          // ... and of those that move along it
  for (auto& n : toposort({ast})) {
    if (n->op != Op::LOAD) continue;
    auto moves = ranges_in(n->src[1]);
    if (!moves.count(row->range.get())) continue;
    if (!moves.count(column->range.get())) {
      others.push_back(std::move(moves));
      continue;
    }
    // a gated load (a part of a concatenation) has no address at index 0 to take strides at
    bool gated = n->src.size() > 2;
    if (!gated && (index_stride(n->src[1], row->range) == 1 || index_stride(n->src[1], column->range) != 1))
      return std::nullopt;
    column_loops.insert(moves.begin(), moves.end());
  }
  if (column_loops.empty()) return std::nullopt;
  for (auto& loops : others)  // an operand of a product moves along an output loop the other does not
    for (const UOp* r : loops)
      if (!column_loops.count(r)) return std::nullopt;
  if (grouped_reduction(ast, limits)) return std::nullopt;
  const KernelAxis* unrolled = nullptr;  // the reduce loop with the most partial sums, the innermost of equals
  int64_t amount = 0;
  for (auto& a : axes)
    if (int64_t t = a.reduce ? tile_amount(a.size, COLUMN_UNROLL) : 0; t && t >= amount) unrolled = &a, amount = t;
  if (!unrolled) return std::nullopt;
  return Opt{OptOp::UNROLL, unrolled->id, amount};
}

}  // namespace

// Note [gpu register tiles]
std::vector<Opt> gpu_hand_coded_opts(const UOpPtr& ast, const GpuLimits& limits) {
  std::vector<const KernelAxis*> outputs;
  auto axes = kernel_axes(ast);
  int64_t n_out = 1, n_red = 1;
  for (auto& a : axes) {
    if (a.size <= 1) continue;
    if (a.reduce) {
      n_red *= a.size;
    } else {
      outputs.push_back(&a);
      n_out *= a.size;
    }
  }
  if (n_red == 1) return {};
  if (auto unroll = column_sum_unroll(ast, axes, limits)) return {*unroll};  // Note [column sums]
  std::vector<std::unordered_set<const UOp*>> loads;  // the loops each load's address moves along
  std::vector<UOpPtr> store_index;
  for (auto& n : toposort({ast})) {
    if (n->op == Op::LOAD) loads.push_back(ranges_in(n->src[1]));
    if (n->op == Op::STORE) store_index.push_back(n->src[1]);
  }
  auto moves = [](const std::unordered_set<const UOp*>& l, const KernelAxis* ax) {
    return l.count(ax->range.get()) > 0;
  };
  auto reused_along = [&](const KernelAxis* ax) {
    bool dependent = false, independent = false;
    for (auto& l : loads) (moves(l, ax) ? dependent : independent) = true;
    return dependent && independent;
  };

  std::vector<Opt> opts;
  if (n_red >= LONG_REDUCE) {
    int64_t lanes = 1;
    std::vector<const KernelAxis*> upcast;
    for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {
      const KernelAxis* ax = *it;
      if (!reused_along(ax) || ax->size > SMALL_AXIS || lanes * ax->size > MAX_LONG_LANES) continue;
      if (n_out / (lanes * ax->size) < MIN_GROUPS) break;
      opts.push_back({OptOp::UPCAST, ax->id, ax->size});
      upcast.push_back(ax);
      lanes *= ax->size;
    }
    if (LONG_OTHER_TILE > 1 && !upcast.empty()) {
      for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {
        const KernelAxis* ax = *it;
        if (std::count(upcast.begin(), upcast.end(), ax) || !reused_along(ax)) continue;
        bool other_operand = true;  // no load moves along it and along the upcast loops
        for (auto& l : loads)
          for (auto* u : upcast) other_operand &= !(moves(l, u) && moves(l, ax));
        if (!other_operand) continue;
        int64_t b = tile_amount(ax->size, LONG_OTHER_TILE);
        if (b && n_out / (lanes * b) >= MIN_GROUPS) opts.push_back({OptOp::UPCAST, ax->id, b});
        break;
      }
    }
    return opts;
  }
  if (n_out < MANY_OUTPUTS) return {};
  const KernelAxis* wide = nullptr;
  for (auto it = outputs.rbegin(); it != outputs.rend() && !wide; ++it) {
    bool contiguous = reused_along(*it);
    for (auto& s : store_index) contiguous &= index_stride(s, (*it)->range) == 1;
    if (contiguous) wide = *it;
  }
  if (!wide) return {};
  // Note [row tiles]: the tile runs along the next loop out that the same loads move along (the
  // output row), where there is one, and the contiguous loop stays on the threads
  auto moved_by = [&](const KernelAxis* ax) {
    std::vector<bool> m;
    for (auto& l : loads) m.push_back(moves(l, ax));
    return m;
  };
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it)
    if (*it != wide && reused_along(*it) && moved_by(*it) == moved_by(wide) && row_tile((*it)->size)) {
      wide = *it;
      break;
    }
  if (int64_t a = row_tile(wide->size)) opts.push_back({OptOp::UPCAST, wide->id, a});
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {
    const KernelAxis* ax = *it;
    if (ax == wide || !reused_along(ax)) continue;
    bool other_operand = true;  // no load moves along both
    for (auto& l : loads) other_operand &= !(moves(l, wide) && moves(l, ax));
    if (!other_operand) continue;
    if (int64_t b = tile_amount(ax->size, TILE_OTHER)) opts.push_back({OptOp::UPCAST, ax->id, b});
    break;
  }
  return opts;
}

}  // namespace tg
