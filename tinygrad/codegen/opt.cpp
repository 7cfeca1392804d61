// The kernel optimizer: UPCAST and UNROLL as graph substitutions, and the hand-coded choice of
// opts. See Note [upcast and unroll] in opt.h; BLOCK and KBLOCK live in opt_block.cpp.
#include "tinygrad/codegen/opt.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/opt_block.h"
#include "tinygrad/error.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {
constexpr const char* OPT_NAMES[] = {"UPCAST", "UNROLL", "BLOCK", "KBLOCK", "PADTO", "PREFETCH"};  // in OptOp's order
}

std::string opt_str(const Opt& o) {
  return std::string(OPT_NAMES[static_cast<int>(o.op)]) + "(" + std::to_string(o.axis) + "," +
         std::to_string(o.amount) + ")";
}

std::string opts_str(const std::vector<Opt>& opts) {
  std::string s;
  for (auto& o : opts) s += (s.empty() ? "" : " ") + opt_str(o);
  return s;
}

std::vector<Opt> parse_opts(const std::string& text) {
  std::vector<Opt> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    Opt o{};
    char name[9] = {};
    long long axis = 0, amount = 0;
    TG_CHECK(std::sscanf(word.c_str(), "%8[A-Z](%lld,%lld)", name, &axis, &amount) == 3,
             "kernel opts: cannot parse '", word,
             "' (expected NAME(axis,amount), NAME one of UPCAST, UNROLL, BLOCK, KBLOCK, PADTO, PREFETCH)");
    std::string n = name;
    auto known = std::find(std::begin(OPT_NAMES), std::end(OPT_NAMES), n);
    TG_CHECK(known != std::end(OPT_NAMES), "kernel opts: unknown opt '", n, "' in '", word, "'");
    o.op = static_cast<OptOp>(known - std::begin(OPT_NAMES));
    o.axis = axis;
    o.amount = amount;
    out.push_back(o);
  }
  return out;
}

int64_t lane_count(const std::vector<Opt>& opts) {
  int64_t n = 1;
  for (auto& o : opts) n *= o.amount;
  return n;
}

std::vector<UOpPtr> stores_of(const UOpPtr& ast) {
  if (ast->op == Op::SINK) return ast->src;
  TG_ASSERT(ast->op == Op::STORE, "kernel optimizer: a kernel is rooted at STORE or SINK, not ", op_name(ast->op));
  return {ast};
}

// root with every node in `from` replaced by its image, rebuilt bottom-up.
namespace {

// r -> r'*amount + lane, where r' runs size/amount times (a constant 0 when that is 1).
UOpPtr lane_index(const KernelAxis& ax, int64_t amount, int64_t lane) {
  if (ax.size == amount) return kint(lane);
  auto outer = make_uop(Op::RANGE, dtypes::index, {kint(ax.size / amount)}, Arg{ax.id});
  return kalu(Op::ADD, kalu(Op::MUL, outer, kint(amount)), kint(lane));
}

const KernelAxis* find_axis(const std::vector<KernelAxis>& axes, int64_t id) {
  for (auto& a : axes)
    if (a.id == id) return &a;
  return nullptr;
}

std::string why_not(const UOpPtr& ast, const Opt& opt) {
  auto axes = kernel_axes(ast);
  const KernelAxis* ax = find_axis(axes, opt.axis);
  if (!ax) return "the kernel has no loop " + std::to_string(opt.axis);
  if (opt.amount < 2) return "the amount must be at least 2";
  if (opt.op == OptOp::PADTO) return why_not_pad(*ax, opt);
  if (opt.op == OptOp::PREFETCH) return ax->reduce ? "" : "loop " + std::to_string(opt.axis) + " is an output loop (PREFETCH a reduce loop)";
  if (ax->size % opt.amount != 0)
    return "the amount does not divide loop " + std::to_string(opt.axis) + "'s size " + std::to_string(ax->size);
  if (opt.op == OptOp::BLOCK || opt.op == OptOp::KBLOCK) return why_not_block(ast, *ax, opt);
  if (ax->carried)
    return "loop " + std::to_string(opt.axis) + " carries partial sums (a KBLOCK's outer loop)";
  if (opt.op == OptOp::UPCAST && ax->reduce) return "loop " + std::to_string(opt.axis) + " is a reduce loop (UNROLL it)";
  if (opt.op == OptOp::UNROLL && !ax->reduce) return "loop " + std::to_string(opt.axis) + " is an output loop (UPCAST it)";
  return {};
}

UOpPtr upcast(const UOpPtr& ast, const KernelAxis& ax, int64_t amount) {
  std::vector<UOpPtr> stores;
  RewriteMemo memo;
  for (auto& st : stores_of(ast))
    for (int64_t c = 0; c < amount; c++)
      stores.push_back(graph_rewrite(substitute(st, {{ax.range.get(), lane_index(ax, amount, c)}}), symbolic(), memo));
  return make_uop(Op::SINK, DType::Float32, stores);
}

UOpPtr unroll(const UOpPtr& ast, const KernelAxis& ax, int64_t amount) {
  std::unordered_map<const UOp*, UOpPtr> replaced;
  RewriteMemo memo;
  UOpPtr outer = ax.size == amount ? nullptr : make_uop(Op::RANGE, dtypes::index, {kint(ax.size / amount)}, Arg{ax.id});
  for (auto& n : toposort({ast})) {
    if (n->op != Op::REDUCE) continue;
    auto pos = std::find(n->src.begin() + 1, n->src.end(), ax.range);
    if (pos == n->src.end()) continue;
    std::vector<UOpPtr> ranges;
    for (auto it = n->src.begin() + 1; it != n->src.end(); ++it)
      if (*it != ax.range) ranges.push_back(*it);
      else if (outer) ranges.push_back(outer);
    Op rop = std::get<Op>(n->arg);
    // partial accumulators of a half-type reduce are float32, rounded once at the end
    DType acc = arith_dtype(n->dtype);
    UOpPtr combined;
    for (int64_t c = 0; c < amount; c++) {
      UOpPtr v = graph_rewrite(substitute(n->src[0], {{ax.range.get(), lane_index(ax, amount, c)}}), symbolic(), memo);
      v = kcast(v, acc);
      if (!ranges.empty()) {
        std::vector<UOpPtr> src{v};
        src.insert(src.end(), ranges.begin(), ranges.end());
        v = make_uop(Op::REDUCE, acc, src, n->arg);
      }
      combined = combined ? make_uop(rop, acc, {combined, v}) : v;
    }
    replaced[n.get()] = kcast(combined, n->dtype);
  }
  UOpPtr out = substitute(ast, replaced);
  return out->op == Op::SINK ? out : make_uop(Op::SINK, DType::Float32, {out});
}

}  // namespace

std::vector<KernelAxis> kernel_axes(const UOpPtr& ast) {
  std::unordered_set<const UOp*> reduce_ranges, stored_along;
  std::vector<KernelAxis> axes;
  std::vector<UOpPtr> store_indices;
  auto order = toposort({ast});
  for (auto& n : order) {
    if (n->op == Op::REDUCE)
      for (size_t i = 1; i < n->src.size(); i++) reduce_ranges.insert(n->src[i].get());
    if (n->op == Op::STORE) store_indices.push_back(n->src[1]);
  }
  for (auto& r : toposort(store_indices))
    if (r->op == Op::RANGE) stored_along.insert(r.get());
  for (auto& n : order)
    if (n->op == Op::RANGE) {
      bool reduce = reduce_ranges.count(n.get()) > 0;
      axes.push_back({n, n->arg_int(), static_cast<int64_t>(n->src[0]->const_value()), reduce,
                      !reduce && !stored_along.count(n.get())});
    }
  std::sort(axes.begin(), axes.end(), [](const KernelAxis& a, const KernelAxis& b) { return a.id < b.id; });
  return axes;
}

bool opt_applies(const UOpPtr& ast, const Opt& opt) { return why_not(ast, opt).empty(); }

UOpPtr apply_opts(const UOpPtr& ast_in, const std::vector<Opt>& opts) {
  UOpPtr ast = ast_in->op == Op::SINK ? ast_in : make_uop(Op::SINK, DType::Float32, {ast_in});
  for (auto& opt : opts) {
    std::string err = why_not(ast, opt);
    TG_CHECK(err.empty(), "kernel optimizer: ", opt_str(opt), " does not apply: ", err);
    const KernelAxis ax = *find_axis(kernel_axes(ast), opt.axis);
    switch (opt.op) {
      case OptOp::UPCAST:
        ast = upcast(ast, ax, opt.amount);
        break;
      case OptOp::UNROLL:
        ast = unroll(ast, ax, opt.amount);
        break;
      case OptOp::BLOCK:
        ast = block_loop(ast, ax, opt.amount);
        break;
      case OptOp::KBLOCK:
        ast = block_reduce(ast, ax, opt.amount);
        break;
      case OptOp::PADTO:
        ast = pad_loop(ast, ax, opt.amount);
        break;
      case OptOp::PREFETCH:
        ast = prefetch_streams(ast, ax, opt.amount);
        break;
    }
  }
  return ast;
}

// ---- hand-coded heuristics ---------------------------------------------------------------------

namespace {

// Integer value of an index expression with the given ranges set (all others 0).
int64_t eval_index(const UOpPtr& u, const std::unordered_map<const UOp*, int64_t>& env) {
  auto s = [&](size_t i) { return eval_index(u->src[i], env); };
  switch (u->op) {
    case Op::CONST: return static_cast<int64_t>(u->const_value());
    case Op::RANGE: {
      auto it = env.find(u.get());
      return it == env.end() ? 0 : it->second;
    }
    case Op::ADD: return s(0) + s(1);
    case Op::MUL: return s(0) * s(1);
    case Op::IDIV: { int64_t d = s(1); return d == 0 ? 0 : s(0) / d; }
    case Op::MOD: { int64_t d = s(1); return d == 0 ? 0 : s(0) % d; }
    case Op::NEG: return -s(0);
    case Op::MAX: return std::max(s(0), s(1));
    case Op::CMPLT: return s(0) < s(1);
    case Op::CMPNE: return s(0) != s(1);
    case Op::AND: return s(0) & s(1);
    case Op::OR: return s(0) | s(1);
    case Op::WHERE: return s(0) ? s(1) : s(2);
    case Op::CAST: return s(0);
    default: return 0;
  }
}

struct LoadInfo {
  std::unordered_set<const UOp*> ranges;  // the loops its address depends on
  UOpPtr index;
};

int64_t stride(const UOpPtr& index, const UOpPtr& range) {
  return eval_index(index, {{range.get(), 1}}) - eval_index(index, {});
}

// The largest of the amounts that divides size (size itself when it is small enough).
int64_t pick_amount(int64_t size, const std::vector<int64_t>& amounts, int64_t max_lanes) {
  for (auto a : amounts)
    if (a <= max_lanes && size % a == 0 && size >= a) return a;
  if (size <= max_lanes && size > 1 && size <= 8) return size;
  return 0;
}

// top, top/2, ..., 2 (top a power of two): the lane counts of whole and half vectors.
std::vector<int64_t> halvings(int64_t top) {
  std::vector<int64_t> out;
  for (int64_t a = top; a >= 2; a /= 2) out.push_back(a);
  return out;
}

// most, most-1, ..., 2: the row counts of a register tile.
std::vector<int64_t> counts_down(int64_t most) {
  std::vector<int64_t> out;
  for (int64_t a = most; a >= 2; a--) out.push_back(a);
  return out;
}

// Note [fused rows]: a kernel that reads its reductions back over their rows (softmax as one
// kernel, Note [row fusion] in schedule/schedule.cpp: some reduce depends on fewer output loops
// than the store) gets partial sums along every reduce loop that is contiguous in memory, as a
// lone row reduction does (below), and no upcast: the loop over the row's elements is
// elementwise, which LLVM's loop vectorizer handles. Returns false for other kernels.
bool fused_row_opts(const UOpPtr& ast, const std::vector<const KernelAxis*>& outputs,
                    const std::vector<const KernelAxis*>& reduces, const CpuTiles& tiles,
                    std::vector<Opt>& opts) {
  bool fused = false;
  std::vector<UOpPtr> loads;
  for (auto& n : toposort({ast})) {
    if (n->op == Op::LOAD) loads.push_back(n->src[1]);
    if (n->op != Op::REDUCE) continue;
    auto in = ranges_in(n);
    for (auto* o : outputs) fused |= !in.count(o->range.get());
  }
  if (!fused) return false;
  for (auto* r : reduces) {
    bool contiguous = true;
    for (auto& l : loads)
      if (ranges_in(l).count(r->range.get()) && stride(l, r->range) != 1) contiguous = false;
    int64_t a = contiguous ? pick_amount(r->size, halvings(tiles.wide_lanes), tiles.wide_lanes) : 0;
    if (a) opts.push_back({OptOp::UNROLL, r->id, a});
  }
  return true;
}

// Note [contiguous lanes last]: the lanes of the last UPCAST are the innermost, so neighbouring
// lanes of it are neighbouring stores and accumulators. With the contiguous loop's UPCAST last,
// LLVM's SLP vectorizer packs the tile along it (a vector load of B, a broadcast of A, FMAs);
// with it first, the vectorizer packed the other loop's lanes instead (gathers of A, shuffles of
// B, about twice as many instructions in a matmul's inner loop).
std::vector<Opt> contiguous_lanes_last(std::vector<Opt> opts, int64_t contiguous_axis) {
  std::stable_partition(opts.begin(), opts.end(), [&](const Opt& o) { return o.axis != contiguous_axis; });
  return opts;
}

}  // namespace

int64_t index_stride(const UOpPtr& index, const UOpPtr& range) { return stride(index, range); }

int64_t index_at_zero(const UOpPtr& index) { return eval_index(index, {}); }

std::unordered_set<const UOp*> ranges_in(const UOpPtr& u) {
  std::unordered_set<const UOp*> r;
  for (auto& n : toposort({u}))
    if (n->op == Op::RANGE) r.insert(n.get());
  return r;
}

namespace {

constexpr int64_t MAX_LANES = 128;

// Note [register tile size]: the tile of a kernel with a contiguous wide loop is at most two
// vectors of it (16 lanes on AVX2) times at most max_tile_rows of another reuse loop,
// max_accumulators in all: on AVX2, 10 of the 16 vector registers (5 rows), which leaves
// registers for the loaded vectors and the broadcast values, so the whole tile can stay in
// registers; larger tiles (32 x 4, 128 lanes: all 16 registers for accumulators alone) ran
// about half as fast. Measured on one core (batch 512): the channel-last 5x5 convolution of the
// CNN took 125 ms with 16 x 5 against 237 ms with 32 x 4, a 1024 matmul 60 ms with 16 x 4
// against 91 ms with 32 x 4. Note [tiles from the host] derives the sizes for other CPUs.
//
// Note [tiles from the host]: the sizes come from the CPU's limits (CpuLimits in
// device_policy.h, read from the host by runtime/cpu_host.cpp), as BLIS's and oneDNN's kernels
// are sized per ISA:
//   vector lanes      vector bits / 32 (8 on AVX2, 16 on AVX-512)
//   wide lanes        two vectors: the contiguous loop's lanes, the partial sums of a reduce
//   accumulators      the registers less 6 (two loaded vectors of B, a broadcast of A, three
//                     for addresses and loads in flight): 10 of 16 on AVX2, 26 of 32 on AVX-512,
//                     and at most MAX_TILE_LANES lanes (16 vectors on AVX-512)
//   tile rows         accumulators / 2 (5 on AVX2, 8 on AVX-512; the largest that divides the loop)
//   K block           a B panel of K block x wide lanes in half the L1 (256 on a 32 KB AVX2 L1)
//   row block         an A block of row block x K block in 1/16 of the L2 (64 on a 1 MB L2)
//   cache blocks      for a B of at least half the L2
//   from B panels     K blocks of a panel in 1/16 of the L2 (1024 on a 2 MB L2 with AVX-512's
//                     32 lanes), row blocks of an A block in half the L2 (Note [blocks of B panels])
// On a 32 KB / 1 MB AVX2 core these are the constants the heuristics were tuned with. Every lane
// is written out before LLVM packs the lanes into vectors, so compile time grows with them
// faster than linearly: on the loaded 2-core Zen 4 (AVX-512), tiles of up to 26 vectors (32 x 13,
// up to 384 lanes) took the character GPT's first step from 16 s to 33 s, tiles of up to 16
// (256 lanes) to 47 s and the MLP's from about 2 s to 4-5 s. Zen 4, whose FMAs run at AVX2's
// rate, is described with AVX2's limits (Note [the host's description] in runtime/cpu_host.cpp),
// so these sizes are for cores with full-width 512-bit FMAs (Intel's, Zen 5): Note [full-width
// tiles].
//
// Note [full-width tiles]: two 512-bit FMA ports of latency 4 need 8 independent FMAs in flight.
// A tile of 8 vectors (32 x 4, 128 lanes) has exactly 8 accumulators, so each accumulator's
// chain of FMAs is the loop's critical path and every broadcast or load that comes late stalls
// both ports; the CNN's channel-last 5x5 convolutions ran at that bound (an input gradient's
// inner loop: 40 FMAs, 10 vector loads and 8 broadcasts per 5 taps, 8 chains of 5 FMAs). So a
// tile has at most MAX_TILE_LANES = 256 lanes: 32 x 8 on AVX-512, 16 accumulators, 10 of the 32
// registers left for the loaded vectors and broadcasts. On the 2-core Intel Xeon (AVX-512 and
// AMX, other builds and test suites beside it, load average 8 to 13), the CNN step's CPU time
// per step went from 566 ms with 32 x 4 to 522 ms (four interleaved rounds each: 591, 594, 569,
// 509 against 517, 534, 509, 526), and 32 x 12 (384 lanes) took 570 and 612 ms against 532 and
// 487 ms for 32 x 8 in interleaved rounds.
// First steps compile for longer: the MLP's about 2.3 s against 1.4 s, the CNN's 7.0 s against
// 6.9 s, the character GPT's 18-19 s against 14-17 s (its process's CPU time 4% more). BEAM
// keeps its own bound of 128 lanes (engine/beam.cpp).
constexpr int64_t MAX_TILE_LANES = 256;

// A reduce kernel's loops and memory accesses, as the heuristics see them: the loads inside a
// reduce loop (those that decide reuse and contiguity) and the stores' indices.
struct ReduceAccesses {
  std::vector<const KernelAxis*> outputs, reduces;  // loops longer than 1
  std::vector<LoadInfo> loads;
  std::vector<UOpPtr> store_index;

  // Some loads move along ax and some do not: a tile along ax reuses the latter.
  bool reused_along(const KernelAxis& ax) const {
    int independent = 0, dependent = 0;
    for (auto& l : loads) (l.ranges.count(ax.range.get()) ? dependent : independent)++;
    return independent > 0 && dependent > 0;
  }
  // contiguous: every load that moves along ax moves by one element (and the stores do too)
  bool contiguous(const KernelAxis& ax, bool check_stores) const {
    for (auto& l : loads)
      if (l.ranges.count(ax.range.get()) && stride(l.index, ax.range) != 1) return false;
    if (check_stores)
      for (auto& s : store_index)
        if (stride(s, ax.range) != 1) return false;
    return true;
  }
  // Note [divided loads]: a load that moves along a loop only through a division (a max pool's
  // backward reads the pooled gradient at x/2) repeats its element between neighbours; the
  // partial sums of an unrolled loop load it once per pair, so it does not stop the unroll.
  bool contiguous_or_divided(const KernelAxis& ax) const {
    bool one_contiguous = false;
    for (auto& l : loads) {
      if (!l.ranges.count(ax.range.get())) continue;
      int64_t s = stride(l.index, ax.range);
      if (s != 0 && s != 1) return false;
      one_contiguous |= s == 1;
    }
    return one_contiguous;
  }
  // No load moves along both a and b: b belongs to the other operand than a.
  bool other_operand(const KernelAxis& a, const KernelAxis& b) const {
    for (auto& l : loads)
      if (l.ranges.count(a.range.get()) && l.ranges.count(b.range.get())) return false;
    return true;
  }
};

ReduceAccesses reduce_accesses(const UOpPtr& ast, std::vector<const KernelAxis*> outputs,
                               std::vector<const KernelAxis*> reduces) {
  ReduceAccesses k{std::move(outputs), std::move(reduces), {}, {}};
  std::unordered_set<const UOp*> reduce_set;
  for (auto* r : k.reduces) reduce_set.insert(r->range.get());
  for (auto& n : toposort({ast})) {
    if (n->op == Op::STORE) k.store_index.push_back(n->src[1]);
    if (n->op != Op::LOAD) continue;
    LoadInfo li{ranges_in(n->src[1]), n->src[1]};
    bool in_loop = false;
    for (auto* r : li.ranges) in_loop |= reduce_set.count(r) > 0;
    if (in_loop) k.loads.push_back(std::move(li));
  }
  return k;
}

// The innermost output loop that is reused and contiguous for the loads and the stores (null
// when there is none): the loop whose lanes become vector lanes.
const KernelAxis* contiguous_reuse_loop(const ReduceAccesses& k) {
  const KernelAxis* wide = nullptr;
  for (auto* ax : k.outputs)
    if (k.reused_along(*ax) && k.contiguous(*ax, true)) wide = ax;
  return wide;
}

// A narrow tile along the first reuse loop that the other operand moves along (no load that
// moves along `wide` moves along it), within the lanes left.
void upcast_other_operand(const ReduceAccesses& k, const KernelAxis& wide, int64_t lanes, std::vector<Opt>& opts) {
  for (auto* ax : k.outputs) {
    if (ax == &wide || !k.reused_along(*ax) || !k.other_operand(wide, *ax)) continue;
    if (int64_t b = pick_amount(ax->size, {4, 2}, MAX_LANES / lanes)) opts.push_back({OptOp::UPCAST, ax->id, b});
    return;
  }
}

// Note [rows of a narrow tile]: the most rows of a register tile whose contiguous loop has
// `lanes` lanes: max_tile_rows for a tile two vectors wide (or narrower than one vector), twice
// that for a tile of one vector, which so keeps the accumulators a wide tile has (16 on AVX-512,
// where 8 leave both FMA ports waiting on each chain: Note [full-width tiles]). The MLP's weight
// gradient of its first layer, 784 columns (16 x 49: no 32 divides it), became a tile of 16 x 16
// instead of 16 x 8: about 10% less time for that kernel (5.7 against 6.3 ms in interleaved runs
// on the loaded 2-core Xeon).
int64_t tile_rows(const CpuTiles& tiles, int64_t lanes) {
  return lanes == tiles.vector_lanes ? 2 * tiles.max_tile_rows : tiles.max_tile_rows;
}

// Narrower tiles along the other reuse loops, innermost first (Note [register tile size]).
void upcast_reuse_loops(const ReduceAccesses& k, const KernelAxis* wide, int64_t lanes, const CpuTiles& tiles,
                        std::vector<Opt>& opts) {
  int64_t max_tile = wide ? tiles.max_accumulators : MAX_LANES;
  for (auto it = k.outputs.rbegin(); it != k.outputs.rend(); ++it) {
    const KernelAxis* ax = *it;
    if (ax == wide || !k.reused_along(*ax)) continue;
    int64_t a = wide ? pick_amount(ax->size, counts_down(tile_rows(tiles, lanes)), max_tile / lanes)
                     : pick_amount(ax->size, {8, 4, 2}, max_tile / lanes);
    if (!a) continue;
    opts.push_back({OptOp::UPCAST, ax->id, a});
    lanes *= a;
    if (lanes * 2 > max_tile) break;
  }
}

// Note [short output rows]: a convolution's weight gradient stores rows of kw (3 or 5) elements
// and reduces over the batch and the pixels, whose last loop (the output column) is contiguous
// in both inputs. A short row cannot fill vector lanes, so the reduce loop is unrolled into
// partial sums along that contiguous column instead (vector loads of both inputs), with the row
// upcast and one loop of the other operand (the output channel) upcast for register reuse.
// Returns nullopt where the loops' sizes have no such amounts.
std::optional<std::vector<Opt>> short_row_opts(const ReduceAccesses& k, const KernelAxis& wide,
                                               const KernelAxis& red, const CpuTiles& tiles) {
  std::vector<int64_t> unrolls = halvings(tiles.vector_lanes);
  unrolls.erase(std::remove_if(unrolls.begin(), unrolls.end(), [](int64_t a) { return a < 4; }),
                unrolls.end());
  int64_t u = pick_amount(red.size, unrolls, MAX_LANES);
  int64_t a = pick_amount(wide.size, {4, 2}, MAX_LANES);
  if (!u || !a) return std::nullopt;
  std::vector<Opt> opts{{OptOp::UNROLL, red.id, u}, {OptOp::UPCAST, wide.id, a}};
  upcast_other_operand(k, wide, u * a, opts);
  return opts;
}

// Note [whole rows]: a contiguous output row whose length has no larger power-of-two divisor
// than half a vector (4 on AVX2: a 20-wide convolution output) would get lanes of half a
// vector. Rows of 8 to 4 vectors' lanes (32 on AVX2) are upcast whole instead (LLVM covers
// them with full vectors and one shorter tail), with a narrow tile on the other operand's loop
// (the output channel, whose weight loads are shared by the row). Measured on the CNN's second
// convolution (20x20 outputs): about twice as fast as the 4x4x8 tile.
std::vector<Opt> whole_row_opts(const ReduceAccesses& k, const KernelAxis& wide) {
  std::vector<Opt> opts{{OptOp::UPCAST, wide.id, wide.size}};
  upcast_other_operand(k, wide, wide.size, opts);
  return contiguous_lanes_last(opts, wide.id);
}

// A register tile on the contiguous reuse loop `wide`: its row whole when it is short (Note
// [whole rows]), else vector lanes of it and narrower tiles on the other reuse loops, cache
// blocked where the tile is a matmul's (Note [cache blocking]).
std::vector<Opt> register_tile_opts(const UOpPtr& ast, const std::vector<KernelAxis>& axes,
                                    const ReduceAccesses& k, const KernelAxis& wide, const KernelAxis& red,
                                    const CpuTiles& tiles) {
  int64_t a = pick_amount(wide.size, halvings(tiles.wide_lanes), MAX_LANES);
  if (a <= tiles.vector_lanes / 2 && wide.size >= 8 && wide.size <= 4 * tiles.vector_lanes)
    return whole_row_opts(k, wide);
  std::vector<Opt> opts;
  if (a) opts.push_back({OptOp::UPCAST, wide.id, a});
  upcast_reuse_loops(k, &wide, a ? a : 1, tiles, opts);
  if (opts.size() == 2 && opts[0].axis == wide.id && k.reduces.size() == 1)  // Note [cache blocking]
    return cache_blocked_opts(ast, wide, opts[0].amount, *find_axis(axes, opts[1].axis), opts[1].amount,
                              std::min(tile_rows(tiles, opts[0].amount), tiles.max_accumulators / opts[0].amount),
                              red, tiles);
  opts = contiguous_lanes_last(opts, wide.id);
  if (auto prefetch = stream_prefetch(ast, red)) opts.push_back(*prefetch);  // Note [prefetched panels]
  return opts;
}

// Note [short contiguous reduce rows]: partial sums along a contiguous reduce loop that no
// vector's lanes divide (BatchNorm's sums over the CNN's 20 x 20 and 6 x 6 rows) were as many as
// the largest power of two dividing it, 4 or 2 scalar chains, which the compiler does not
// vectorize (a float sum may not be reassociated). Where that is under a vector's lanes and the
// row has at most two tiles' worth of lanes, the whole row is unrolled instead: its partial sums
// are independent adds of consecutive loads, which the SLP vectorizer packs into vectors (20:
// 16 + 4 lanes). On the 2-core AMD EPYC Zen 5 (`DEBUG=2 tg bench --reps=3 cnn_step`, the last
// three steps) BatchNorm's seven [512, 32, 20, 20] sums went from 6.5 to 4.1 ms a step, its
// [512, 64, 6, 6] ones from 2.1 to 1.35 ms, and as AVX2 from 7.15 to 5.33 and 2.31 to 1.51 ms;
// the CNN step, alternated `tg bench --reps=10 cnn_step`, 154.4 / 152.2 / 148.6 ms before and
// 149.5 / 145.5 / 145.6 after.
int64_t partial_sum_amount(const KernelAxis& red, const CpuTiles& tiles) {
  int64_t a = pick_amount(red.size, halvings(tiles.wide_lanes), MAX_LANES);
  if (a && a < tiles.vector_lanes && red.size <= 2 * tiles.wide_lanes) return red.size;
  return a;
}

// Partial sums along the contiguous reduce loop, and one reuse loop (the outermost) by 2.
std::vector<Opt> partial_sum_opts(const ReduceAccesses& k, const KernelAxis& red, const CpuTiles& tiles) {
  std::vector<Opt> opts;
  int64_t lanes = 1;
  if (int64_t a = partial_sum_amount(red, tiles)) {
    opts.push_back({OptOp::UNROLL, red.id, a});
    lanes *= a;
  }
  for (auto* ax : k.outputs)
    if (k.reused_along(*ax)) {
      if (int64_t a = pick_amount(ax->size, {2}, MAX_LANES / lanes)) opts.push_back({OptOp::UPCAST, ax->id, a});
      break;
    }
  return opts;
}

// Note [reduce across rows]: a reduce without reuse whose reduce loop is strided (a column
// sum, or adding up the weight gradient's partial sums) would keep one scalar accumulator per
// output and walk memory with a stride; upcasting the contiguous output loop instead gives
// lanes that load neighbouring elements and accumulate side by side (vector adds). Returns
// nullopt when no output loop is contiguous.
std::optional<std::vector<Opt>> lanes_across_rows(const ReduceAccesses& k, const CpuTiles& tiles) {
  for (auto it = k.outputs.rbegin(); it != k.outputs.rend(); ++it)
    if (k.contiguous(**it, true)) {
      std::vector<Opt> opts;
      if (int64_t a = pick_amount((*it)->size, halvings(tiles.wide_lanes), MAX_LANES))
        opts.push_back({OptOp::UPCAST, (*it)->id, a});
      return opts;
    }
  return std::nullopt;
}

// The opts of a reduce kernel without a contiguous reuse loop: partial sums along a contiguous
// reduce loop, else lanes across the rows, else tiles along the reuse loops.
std::vector<Opt> no_vector_loop_opts(const ReduceAccesses& k, const KernelAxis& red, const CpuTiles& tiles) {
  if (k.contiguous_or_divided(red)) return partial_sum_opts(k, red, tiles);
  if (auto opts = lanes_across_rows(k, tiles)) return *opts;  // Note [reduce across rows]
  std::vector<Opt> opts;
  upcast_reuse_loops(k, nullptr, 1, tiles, opts);
  return opts;
}

}  // namespace

// Note [transposing copies]: an elementwise kernel stores along its innermost output loop, and
// the compiler's loop vectorizer makes that loop vector lanes. Where a load is strided along it
// but contiguous along another output loop (a layout change: the CNN's NHWC <-> NCHW copies
// around its convolutions, a transpose), every lane is a load of its own from another cache
// line. Upcasting that other loop by a vector's lanes makes each step load whole vectors along
// it and store whole vectors along the innermost loop, with the transpose between them in
// registers. On the 2-core Intel Xeon (AVX-512) the CNN's [512, 24, 24, 32] -> [512, 32, 24, 24]
// copy went from 6.3 ms (12 GB/s) to 1.7 ms (44 GB/s) with 16 lanes (8: 2.0 ms). That transpose
// in registers is the vectorizer's to choose: Note [no gathers] in runtime/cpu_llvm.cpp keeps it
// from choosing gathers and scatters instead.
std::vector<Opt> transposing_copy_opts(const UOpPtr& ast, const std::vector<const KernelAxis*>& outputs,
                                       const CpuTiles& tiles) {
  auto stores = stores_of(ast);
  if (outputs.size() < 2) return {};
  const KernelAxis* inner = nullptr;  // the loop every store is contiguous along
  for (const KernelAxis* a : outputs)
    if (std::all_of(stores.begin(), stores.end(), [&](const UOpPtr& st) { return stride(st->src[1], a->range) == 1; }))
      inner = a;
  if (!inner) return {};
  for (auto& n : toposort({ast})) {
    if (n->op != Op::LOAD) continue;
    const int64_t along_inner = stride(n->src[1], inner->range);
    if (along_inner == 0 || along_inner == 1) continue;  // broadcast or contiguous along the stores
    for (const KernelAxis* a : outputs)
      if (a != inner && stride(n->src[1], a->range) == 1)
        for (int64_t amount : halvings(tiles.vector_lanes))  // whole or half vectors, at least 4 lanes
          if (amount >= 4 && a->size % amount == 0) return {{OptOp::UPCAST, a->id, amount}};
  }
  return {};
}

// Note [copies in the source's order]: a copy whose source and destination are both contiguous
// along its innermost loop but are laid out in different orders along its other loops (B copied
// into panels: Note [B panels] in schedule/padded_rows.cpp) loops in the destination's order,
// reading one short run (a panel's 128 bytes) from each row of its source, a page apart at
// 1024 columns: the prefetchers see no stream. Reordering those loops to the source's order
// (BLOCK moves a loop innermost, Note [cache blocking] in opt_block.cpp) reads whole rows and
// writes short runs into each panel instead, and the threads split rows of the source. On the
// 2-core Intel Xeon (AVX-512) the panel copy of a 1024 x 1024 B went from 0.23 to 0.18 ms, of a
// 2048 x 2048 one from 1.0 to 0.65 ms (0.30 / 0.22 and 1.15 / 0.81 ms from a cold cache), and
// in the MLP's step the copy of a [512, 512] B into 16 panels from 0.11-0.12 to 0.10 ms. Where
// the runs are shorter than MIN_RUN_BYTES the destination's order stays: the MLP's [512, 784]
// copied into 49 panels of 16 lanes (64-byte runs) took 0.19-0.23 ms in the source's order
// against 0.17-0.19 in its own.
std::vector<Opt> source_order_copy_opts(const UOpPtr& ast, const std::vector<const KernelAxis*>& outputs) {
  std::vector<UOpPtr> loads;
  for (auto& n : toposort({ast}))
    if (n->op == Op::LOAD) loads.push_back(n);
  auto stores = stores_of(ast);
  if (outputs.size() < 3 || loads.size() != 1 || stores.size() != 1) return {};
  const UOpPtr& load = loads[0]->src[1];
  const KernelAxis* inner = outputs.back();
  if (stride(load, inner->range) != 1 || stride(stores[0]->src[1], inner->range) != 1) return {};
  constexpr int64_t MIN_RUN_BYTES = 128;  // two cache lines a run
  if (inner->size * static_cast<int64_t>(itemsize(loads[0]->dtype)) < MIN_RUN_BYTES) return {};
  std::vector<const KernelAxis*> order(outputs.begin(), outputs.end() - 1);  // the source's order
  for (const KernelAxis* a : order)
    if (stride(load, a->range) <= 0) return {};  // broadcast: not a copy
  std::stable_sort(order.begin(), order.end(), [&](const KernelAxis* x, const KernelAxis* y) {
    return stride(load, x->range) > stride(load, y->range);
  });
  order.push_back(inner);
  size_t in_place = 0;  // the loops already where the source's order puts them
  while (in_place < order.size() && order[in_place] == outputs[in_place]) in_place++;
  if (in_place == order.size()) return {};
  std::vector<Opt> opts;
  for (size_t i = in_place; i < order.size(); i++) opts.push_back({OptOp::BLOCK, order[i]->id, order[i]->size});
  return opts;
}

// Note [hand-coded opts]: a reduce kernel whose inputs are reused along some output loops (a
// matmul's A along the columns, its B along the rows; a convolution's weights along batch and
// pixels, its input along the output channels) gets a register tile: the output loop that is
// contiguous in memory for the stores and the reused loads is upcast widest (vector lanes), one
// more reuse loop narrower, within MAX_LANES accumulators. When the contiguous loop is the
// reduce loop itself (a matmul with a transposed operand, a sum over the last axis), that loop
// is unrolled into partial accumulators, which vectorize. Elementwise kernels are left to the
// compiler's loop vectorizer, except copies that change the layout (Note [transposing copies],
// Note [copies in the source's order]).
std::vector<Opt> hand_coded_opts(const UOpPtr& ast, const CpuLimits& cpu) {
  const CpuTiles tiles = cpu_tiles(cpu);
  auto axes = kernel_axes(ast);
  std::vector<const KernelAxis*> outputs, reduces;
  for (auto& a : axes)
    if (a.size > 1) (a.reduce ? reduces : outputs).push_back(&a);
  if (reduces.empty()) {
    if (auto opts = transposing_copy_opts(ast, outputs, tiles); !opts.empty()) return opts;  // Note [transposing copies]
    return source_order_copy_opts(ast, outputs);  // Note [copies in the source's order]
  }
  if (std::vector<Opt> opts; fused_row_opts(ast, outputs, reduces, tiles, opts))
    return opts;  // Note [fused rows]

  ReduceAccesses k = reduce_accesses(ast, std::move(outputs), std::move(reduces));
  if (k.loads.empty()) return {};
  const KernelAxis* red = k.reduces.back();
  const KernelAxis* wide = contiguous_reuse_loop(k);
  if (!wide) return no_vector_loop_opts(k, *red, tiles);
  if (wide->size < 8 && red->size >= 4 && k.contiguous(*red, false))  // Note [short output rows]
    if (auto opts = short_row_opts(k, *wide, *red, tiles)) return *opts;
  return register_tile_opts(ast, axes, k, *wide, *red, tiles);
}

// Note [tiles from the host]
CpuTiles cpu_tiles(const CpuLimits& cpu) {
  const int64_t lanes = std::max(cpu.vector_bits / 32, 2);
  const int64_t accumulator_vectors =
      std::min(std::max<int64_t>(cpu.vector_registers - 6, 4), MAX_TILE_LANES / lanes);
  const int64_t wide = 2 * lanes, k_block = std::max<int64_t>(cpu.l1d_bytes / 2 / (wide * 4), 64);
  return CpuTiles{.vector_lanes = lanes,
                  .wide_lanes = wide,
                  .max_accumulators = accumulator_vectors * lanes,
                  .max_tile_rows = accumulator_vectors / 2,
                  .k_block = k_block,
                  .row_block = std::max<int64_t>(cpu.l2_bytes / 16 / (k_block * 4), 8),
                  .min_panel_bytes = cpu.l2_bytes / 2,
                  .panel_k_block = cpu.l2_bytes / 16 / (wide * 4),
                  .panel_whole_k = cpu.l2_bytes / 8 / (wide * 4),
                  .a_block_bytes = cpu.l2_bytes / 2};
}

std::string cpu_tiles_str(const CpuLimits& cpu) {
  CpuTiles t = cpu_tiles(cpu);
  return "register tiles of " + std::to_string(t.wide_lanes) + " contiguous lanes x up to " +
         std::to_string(t.max_tile_rows) + " rows (" + std::to_string(t.max_accumulators) +
         " accumulator lanes), partial sums of " + std::to_string(t.wide_lanes) + "; cache blocks for B of " +
         std::to_string(t.min_panel_bytes >> 10) + " KB or more: K blocks of up to " +
         std::to_string(t.k_block) + ", row blocks of up to " + std::to_string(t.row_block) +
         "; from B panels: K blocks of up to " + std::to_string(t.panel_k_block) + " (K of up to " +
         std::to_string(t.panel_whole_k) + " whole), A blocks of " +
         std::to_string(t.a_block_bytes >> 10) + " KB";
}

}  // namespace tg
