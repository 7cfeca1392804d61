// Tensor-core contractions (codegen/tensor_core.h).
//
// Note [tensor-core contractions]: a convolution is a sliding-window product that no library
// matmul takes (Note [gpu register tiles] in opt_gpu.cpp), so on CUDA its forward pass and input
// gradient reach the tensor cores as generated code instead. The kernel graph
//   STORE(out, idx, f(REDUCE(ADD, x * y, k loops)))
// of float32 values is a contraction when every reduce loop moves both operands: each output loop
// then moves x only (an m loop), y only (an n loop) or both (a batch loop). Flattened, the m
// loops are the rows of a product, the n loops its columns and the reduce loops its depth K; the
// operand whose side is a multiple of 16 is the mma's A (16 rows), the other its B (8 columns).
// Each warp computes a TM x TN tile of 16 x 8 blocks with mma.sync.m16n8k8 (tf32 inputs, float32
// accumulators): per step of 8 along K a thread loads its 4 A values of each row block and its
// 2 B values of each column block straight from global memory (the caches serve the windows'
// overlaps) and issues TM*TN mmas, so each load feeds 4 to 8 multiply-adds of 16 x 8 x 8 instead
// of one. Lane l holds A rows l/4 and l/4+8 and B column l/4; the K slots are its 2(l%4) and
// 2(l%4)+1 (the instruction's columns l%4 and l%4+4: any order of K within a step is the same sum,
// and this one makes a thread's two loads neighbours); its results are rows l/4 and l/4+8,
// columns 2(l%4) and 2(l%4)+1. Index arithmetic is the kernel graph's own: every output loop's
// index is recovered from the flat row or column by division and modulo once, before the loop.
// Along K the innermost reduce loops whose product is a multiple of 8 become one loop of steps
// over their flat index (the contiguous loop stays innermost, so a warp's loads stay close
// together), and the loops outside it stay loops (unrolled when short).
// The operands are rounded to tf32 (10 mantissa bits, cvt.rna), as PyTorch's cuDNN convolutions
// do by default; TF32=0 keeps such kernels on exact float32 FMAs, and matrix products take them
// only with TF32=2 (Note [float32 precision policy] in knobs.h). A contraction is taken where a tile of at least 4 blocks leaves
// MIN_WARPS warps: with fewer, too few loads are in flight to cover their latency. The 5x5 weight
// gradients qualify once split into 32 parts (Note [split long reductions] in
// schedule/split_reduce.cpp); the 3x3 ones (one stage), small convolutions and one-channel inputs
// (K = 25) keep FMA kernels. On an H200, the CNN at batch 512: the 5x5 32->32 layer's forward pass
// 0.33 -> 0.20 ms, its input gradient 0.45 -> 0.28 ms, its weight gradient 0.59 -> 0.42 ms, the
// step 2.56 -> 1.89-1.93 ms (with Note [32-bit addresses]).
#include "tinygrad/codegen/tensor_core.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/gpu_dims.h"
#include "tinygrad/codegen/opt.h"

namespace tg {

namespace {

constexpr int64_t MMA_M = 16, MMA_N = 8, MMA_K = 8, WARP = 32;
// Tiles of 4 or more blocks per warp, and at least this many warps (8 per SM of an H200): with
// fewer the loads in flight cannot cover the memory latency.
constexpr int64_t MIN_WARPS = 1024;

int64_t trip(const UOpPtr& range) { return static_cast<int64_t>(range->src[0]->const_value()); }

int64_t product(const std::vector<UOpPtr>& loops) {
  int64_t p = 1;
  for (auto& l : loops) p *= trip(l);
  return p;
}

bool by_id(const UOpPtr& a, const UOpPtr& b) { return a->arg_int() < b->arg_int(); }

struct Contraction {
  UOpPtr store, reduce;
  UOpPtr a, b;                         // the operand along the mma's 16 rows, the one along its 8 columns
  std::vector<UOpPtr> m, n, batch, k;  // loops, outermost first
};

std::optional<Contraction> match(const UOpPtr& ast) {
  if (ast->op != Op::STORE || ast->src.size() != 3 || ast->src[0]->dtype != DType::Float32)
    return std::nullopt;
  Contraction c;
  c.store = ast;
  for (auto& u : toposort({ast->src[2]})) {
    if (u->op != Op::REDUCE) continue;
    if (c.reduce) return std::nullopt;
    c.reduce = u;
  }
  if (!c.reduce || std::get<Op>(c.reduce->arg) != Op::ADD || c.reduce->dtype != DType::Float32)
    return std::nullopt;
  const UOpPtr& prod = c.reduce->src[0];
  if (prod->op != Op::MUL || prod->src[0]->dtype != DType::Float32) return std::nullopt;
  UOpPtr x = prod->src[0], y = prod->src[1];
  auto in_x = ranges_in(x), in_y = ranges_in(y);
  c.k.assign(c.reduce->src.begin() + 1, c.reduce->src.end());
  std::sort(c.k.begin(), c.k.end(), by_id);
  std::unordered_set<const UOp*> reduce_loops;
  for (auto& r : c.k) {
    if (!in_x.count(r.get()) || !in_y.count(r.get())) return std::nullopt;
    reduce_loops.insert(r.get());
  }
  std::vector<UOpPtr> xs, ys;
  for (auto& u : toposort({ast})) {
    if (u->op != Op::RANGE || reduce_loops.count(u.get())) continue;
    bool moves_x = in_x.count(u.get()) > 0, moves_y = in_y.count(u.get()) > 0;
    (moves_x && !moves_y ? xs : moves_y && !moves_x ? ys : c.batch).push_back(u);
  }
  for (auto* v : {&xs, &ys, &c.batch}) std::sort(v->begin(), v->end(), by_id);
  int64_t nx = product(xs), ny = product(ys);
  bool x_rows = nx % MMA_M == 0 && ny % MMA_N == 0, y_rows = ny % MMA_M == 0 && nx % MMA_N == 0;
  if (x_rows && (!y_rows || nx >= ny)) {
    c.a = x, c.b = y, c.m = xs, c.n = ys;
  } else if (y_rows) {
    c.a = y, c.b = x, c.m = ys, c.n = xs;
  } else {
    return std::nullopt;
  }
  return c;
}

struct Tiles {
  int64_t tm = 0, tn = 0;  // 16-row and 8-column blocks per warp
  int64_t warps = 0, block_warps = 1;
};

// The largest tile that leaves MIN_WARPS warps (none: the kernel stays a generated FMA kernel).
Tiles choose_tiles(int64_t row_blocks, int64_t col_blocks, int64_t batch) {
  static constexpr std::pair<int64_t, int64_t> shapes[] = {{4, 4}, {2, 4}, {4, 2}, {2, 2}, {1, 4}, {4, 1}};
  for (auto [tm, tn] : shapes) {
    if (row_blocks % tm != 0 || col_blocks % tn != 0) continue;
    int64_t warps = batch * (row_blocks / tm) * (col_blocks / tn);
    if (warps < MIN_WARPS) continue;
    Tiles t{tm, tn, warps, 1};
    for (int64_t w : {4, 2})
      if (warps % w == 0) {
        t.block_warps = w;
        break;
      }
    return t;
  }
  return {};
}

// Each loop's index from the flat one (the emitter places the arithmetic itself).
std::unordered_map<const UOp*, UOpPtr> split(const UOpPtr& flat, const std::vector<UOpPtr>& loops,
                                             int64_t length) {
  std::unordered_map<const UOp*, UOpPtr> sub;
  std::vector<UOpPtr> code;
  split_flat_index(flat, loops, length, code, sub);
  return sub;
}

// Note [32-bit addresses]: the kernel graph's index arithmetic is 64-bit, two or more instructions
// per operation on a GPU, and a tensor-core kernel computes a dozen addresses per step of the K
// loop, a few 64-bit adds each. An index whose every subexpression stays within int32 (vmin and
// vmax) is rebuilt in 32 bits: its loops and thread indices are cast once, the 32-bit indices of
// split_flat_index are used as they are, and the buffer access takes the int offset. On an H200
// this took the CNN's 5x5 32->32 forward pass on the tensor cores from 0.259 to 0.203 ms, its input
// gradient from 0.286 to 0.274 ms, its weight gradient from 0.450 to 0.416 ms, the step from 2.03 to 1.93 ms.
UOpPtr narrowed(const UOpPtr& u, std::unordered_map<const UOp*, UOpPtr>& memo) {
  if (u->dtype == DType::Int32) return u;
  if (u->dtype != dtypes::index || u->vmin() < std::numeric_limits<int32_t>::min() ||
      u->vmax() > std::numeric_limits<int32_t>::max())
    return nullptr;
  if (auto it = memo.find(u.get()); it != memo.end()) return it->second;
  UOpPtr out;
  switch (u->op) {
    case Op::CONST:
      out = kconst(DType::Int32, u->const_value());
      break;
    case Op::RANGE:
    case Op::SPECIAL:
      out = kcast(u, DType::Int32);
      break;
    case Op::CAST:
      out = u->src[0]->dtype == DType::Int32 ? u->src[0] : nullptr;
      break;
    case Op::ADD:
    case Op::MUL:
    case Op::IDIV:
    case Op::MOD: {
      auto a = narrowed(u->src[0], memo), b = narrowed(u->src[1], memo);
      if (a && b) out = make_uop(u->op, DType::Int32, {a, b});
      break;
    }
    default:
      break;
  }
  return memo[u.get()] = out;
}

// root with the index of every load and store in 32 bits where it fits (Note [32-bit addresses])
UOpPtr with_narrow_indices(const UOpPtr& root) {
  std::unordered_map<const UOp*, UOpPtr> memo, access;  // keyed by nodes that root keeps alive
  for (auto& u : toposort({root})) {
    if (u->op != Op::LOAD && u->op != Op::STORE) continue;
    if (auto idx = narrowed(u->src[1], memo); idx && idx != u->src[1]) {
      auto src = u->src;
      src[1] = idx;
      access[u.get()] = make_uop(u->op, u->dtype, src, u->arg);
    }
  }
  return access.empty() ? root : substitute(root, access);
}

using Sub = std::unordered_map<const UOp*, UOpPtr>;
Sub merged(std::initializer_list<const Sub*> parts) {
  Sub out;
  for (auto* p : parts) out.insert(p->begin(), p->end());
  return out;
}

// x with its loops replaced by a thread's indices, its addresses in 32 bits where they fit.
UOpPtr placed(const UOpPtr& x, const Sub& sub) { return with_narrow_indices(substitute(x, sub)); }

// The reduce loops split at the loop of steps along K: `flat` are the innermost ones whose
// product (flat_len) is a multiple of 8, `outer` the loops outside them.
struct KSteps {
  std::vector<UOpPtr> outer, flat;
  int64_t flat_len = 1;
};

std::optional<KSteps> k_steps(const std::vector<UOpPtr>& k) {
  size_t first_flat = k.size();
  int64_t flat_len = 1;
  while (first_flat > 0) {
    flat_len *= trip(k[--first_flat]);
    if (flat_len % MMA_K == 0) break;
  }
  if (flat_len % MMA_K != 0) return std::nullopt;
  auto split_at = k.begin() + static_cast<std::ptrdiff_t>(first_flat);
  return KSteps{{k.begin(), split_at}, {split_at, k.end()}, flat_len};
}

// The kernel's parameters and launch: blocks of block_warps warps, one warp per tile.
LinearKernel launch_shape(const std::vector<DType>& param_dtypes, const Tiles& tl) {
  LinearKernel k;
  for (size_t i = 0; i < param_dtypes.size(); i++) k.params.push_back({param_dtypes[i], i == 0});
  int64_t threads = WARP * tl.block_warps, blocks = tl.warps / tl.block_warps;
  k.global_size = {blocks * threads};
  k.local_size = {threads};
  return k;
}

// The warp's tile and the thread's place in it: every loop's index for each row, column and K
// slot that the thread's fragments and results touch.
struct ThreadPlace {
  Sub batch;                             // the warp's batch loops
  std::vector<std::vector<Sub>> rows;    // [block][half]: rows l/4, l/4 + 8
  std::vector<Sub> b_cols;               // [block]: column l/4
  std::vector<std::vector<Sub>> c_cols;  // [block][j]: column 2(l%4) + j
  UOpPtr step;                           // the loop of steps along K
  std::vector<Sub> k;                    // [e]: K slot 2(l%4) + e of the step
};

ThreadPlace thread_place(const UOpPtr& ast, const Contraction& c, const Tiles& tl, const KSteps& ks) {
  int64_t rows = product(c.m), cols = product(c.n), threads = WARP * tl.block_warps,
          blocks = tl.warps / tl.block_warps;
  auto lid = thread_index(SpecialKind::LocalId, 0, threads),
       gid = thread_index(SpecialKind::GroupId, 0, blocks);
  auto lane = kalu(Op::MOD, lid, kint(WARP));
  auto warp = kalu(Op::ADD, kalu(Op::MUL, gid, kint(tl.block_warps)), kalu(Op::IDIV, lid, kint(WARP)));
  auto group = kalu(Op::IDIV, lane, kint(4)), pair = kalu(Op::MUL, kalu(Op::MOD, lane, kint(4)), kint(2));
  int64_t row_tiles = rows / (MMA_M * tl.tm), col_tiles = cols / (MMA_N * tl.tn);
  auto row0 = kalu(Op::MUL, kalu(Op::MOD, warp, kint(row_tiles)), kint(MMA_M * tl.tm));
  auto col0 = kalu(Op::MUL, kalu(Op::MOD, kalu(Op::IDIV, warp, kint(row_tiles)), kint(col_tiles)),
                   kint(MMA_N * tl.tn));
  ThreadPlace p;
  p.batch = split(kalu(Op::IDIV, warp, kint(row_tiles * col_tiles)), c.batch, product(c.batch));
  auto at = [](const UOpPtr& base, int64_t off, const UOpPtr& lane_part) {
    return kalu(Op::ADD, kalu(Op::ADD, base, kint(off)), lane_part);
  };
  p.rows.resize(static_cast<size_t>(tl.tm));
  for (int64_t i = 0; i < tl.tm; i++)
    for (int64_t h = 0; h < 2; h++) p.rows[i].push_back(split(at(row0, i * MMA_M + h * 8, group), c.m, rows));
  p.c_cols.resize(static_cast<size_t>(tl.tn));
  for (int64_t j = 0; j < tl.tn; j++) {
    p.b_cols.push_back(split(at(col0, j * MMA_N, group), c.n, cols));
    for (int64_t e = 0; e < 2; e++) p.c_cols[j].push_back(split(at(col0, j * MMA_N + e, pair), c.n, cols));
  }
  int64_t next_id = 0;
  for (auto& u : toposort({ast}))
    if (u->op == Op::RANGE) next_id = std::max(next_id, u->arg_int() + 1);
  p.step = make_uop(Op::RANGE, dtypes::index, {kint(ks.flat_len / MMA_K)}, Arg{next_id});
  for (int64_t e = 0; e < 2; e++)
    p.k.push_back(split(at(kalu(Op::MUL, p.step, kint(MMA_K)), e, pair), ks.flat, ks.flat_len));
  return p;
}

// The thread's operand values: A[i][r] at row half r%2, K slot r/2; B[j][r] at K slot r.
struct Fragments {
  std::vector<std::vector<UOpPtr>> a, b;
  std::vector<UOpPtr> all;  // in that order
};

Fragments fragments(const Contraction& c, const Tiles& tl, const ThreadPlace& p) {
  Fragments f;
  f.a.resize(static_cast<size_t>(tl.tm));
  f.b.resize(static_cast<size_t>(tl.tn));
  for (int64_t i = 0; i < tl.tm; i++)
    for (size_t r = 0; r < 4; r++)
      f.all.push_back(f.a[i].emplace_back(placed(c.a, merged({&p.batch, &p.rows[i][r % 2], &p.k[r / 2]}))));
  for (int64_t j = 0; j < tl.tn; j++)
    for (size_t r = 0; r < 2; r++)
      f.all.push_back(f.b[j].emplace_back(placed(c.b, merged({&p.batch, &p.b_cols[j], &p.k[r]}))));
  return f;
}

// Appends a kernel's instructions: each node once, after its sources (constants and loops are
// not instructions of their own); emit(root, true) leaves out what depends on the K loops.
class Emitter {
 public:
  Emitter(LinearKernel& k, std::unordered_set<const UOp*> k_loops) : k_(k), k_loops_(std::move(k_loops)) {}

  void emit(const UOpPtr& root, bool hoisted_only) {
    for (auto& u : toposort({root}, [&](const UOp& n) { return !emitted_.count(&n); })) {
      if (emitted_.count(u.get()) || u->op == Op::CONST || u->op == Op::RANGE) continue;
      if (hoisted_only && in_loop(u)) continue;
      push(u);
    }
  }
  void push(const UOpPtr& u) {
    k_.uops.push_back(u);
    emitted_.insert(u.get());
  }

 private:
  bool in_loop(const UOpPtr& u) {
    if (auto it = in_loop_memo_.find(u.get()); it != in_loop_memo_.end()) return it->second;
    bool dep = k_loops_.count(u.get()) > 0;
    for (auto& s : u->src) dep = dep || in_loop(s);
    return in_loop_memo_[u.get()] = dep;
  }

  LinearKernel& k_;
  std::unordered_set<const UOp*> k_loops_, emitted_;
  std::unordered_map<const UOp*, bool> in_loop_memo_;
};

using Accumulators = std::vector<std::vector<std::vector<UOpPtr>>>;  // [i][j][result]

// The 4 float32 accumulators of every block pair of the tile, zero before the loops along K.
Accumulators emit_accumulators(Emitter& out, const Tiles& tl, const KSteps& ks, const UOpPtr& step) {
  std::vector<UOpPtr> acc_src{kconst(DType::Float32, 0)};
  acc_src.insert(acc_src.end(), ks.outer.begin(), ks.outer.end());
  acc_src.push_back(step);
  Accumulators acc(static_cast<size_t>(tl.tm));
  int64_t acc_id = 0;
  for (int64_t i = 0; i < tl.tm; i++)
    for (int64_t j = 0; j < tl.tn; j++) {
      auto& v = acc[i].emplace_back();
      for (int r = 0; r < 4; r++)
        out.push(v.emplace_back(make_uop(Op::DEFINE_ACC, DType::Float32, acc_src, Arg{acc_id++})));
    }
  return acc;
}

// The loops along K and in them the mmas of every block pair of the tile into its accumulators.
void emit_mma_loops(Emitter& out, const Tiles& tl, const KSteps& ks, const UOpPtr& step, const Fragments& f,
                    const Accumulators& acc) {
  for (auto& l : ks.outer) out.push(l);
  out.push(step);
  for (auto& x : f.all) out.emit(x, false);
  for (int64_t i = 0; i < tl.tm; i++)
    for (int64_t j = 0; j < tl.tn; j++) {
      std::vector<UOpPtr> src(f.a[i].begin(), f.a[i].end());
      src.insert(src.end(), f.b[j].begin(), f.b[j].end());
      src.insert(src.end(), acc[i][j].begin(), acc[i][j].end());
      std::vector<UOpPtr> results;
      for (int64_t r = 0; r < 4; r++)
        out.push(results.emplace_back(make_uop(Op::WMMA, DType::Float32, src, Arg{r})));
      for (size_t r = 0; r < 4; r++) out.push(make_uop(Op::ASSIGN, DType::Float32, {acc[i][j][r], results[r]}));
    }
  out.push(make_uop(Op::ENDRANGE, dtypes::index, {step}));
  for (size_t l = ks.outer.size(); l-- > 0;) out.push(make_uop(Op::ENDRANGE, dtypes::index, {ks.outer[l]}));
}

// The store of each result r: row half r/2, column 2(l%4) + r%2.
void emit_stores(Emitter& out, const Contraction& c, const Tiles& tl, const ThreadPlace& p, const Accumulators& acc) {
  for (int64_t i = 0; i < tl.tm; i++)
    for (int64_t j = 0; j < tl.tn; j++)
      for (size_t r = 0; r < 4; r++) {
        Sub acc_sub{{c.reduce.get(), acc[i][j][r]}};
        out.emit(placed(c.store, merged({&p.batch, &p.rows[i][r / 2], &p.c_cols[j][r % 2], &acc_sub})), false);
      }
}

}  // namespace

// Note [tensor-core contractions]
std::optional<LinearKernel> tensor_core_kernel(const UOpPtr& ast, const std::vector<DType>& param_dtypes) {
  auto c = match(ast);
  if (!c) return std::nullopt;
  auto ks = k_steps(c->k);  // the innermost reduce loops whose product is a multiple of 8: one loop of steps
  if (!ks) return std::nullopt;
  int64_t rows = product(c->m), cols = product(c->n), batch = product(c->batch);
  Tiles tl = choose_tiles(rows / MMA_M, cols / MMA_N, batch);
  if (tl.tm == 0) return std::nullopt;

  LinearKernel k = launch_shape(param_dtypes, tl);
  ThreadPlace place = thread_place(ast, *c, tl, *ks);
  Fragments f = fragments(*c, tl, place);
  std::unordered_set<const UOp*> k_loops{place.step.get()};
  for (auto& l : ks->outer) k_loops.insert(l.get());
  Emitter out(k, std::move(k_loops));
  for (auto& x : f.all) out.emit(x, true);  // what does not move along K, before the loops
  Accumulators acc = emit_accumulators(out, tl, *ks, place.step);
  emit_mma_loops(out, tl, *ks, place.step, f, acc);
  emit_stores(out, *c, tl, place, acc);
  k.name = "r_tc_" + std::to_string(batch) + "_" + std::to_string(rows) + "_" + std::to_string(cols) + "__" +
           std::to_string(product(c->k));
  return k;
}

}  // namespace tg
