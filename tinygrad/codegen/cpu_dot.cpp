// Kernels of bfloat16 dot tiles for the CPU (codegen/cpu_dot.h).
//
// Note [bf16 dot tiles]: under train.precision: bf16 a matmul or convolution multiplies bfloat16
// operands and sums in float32 (Note [half products in float32] in tensor_nn.cpp): the kernel
// graph is
//   STORE(out, idx, f(REDUCE(ADD, float(a) * float(b), k loops)))
// with a and b bfloat16. On a CPU with AVX512-BF16 (CpuLimits::bf16_dot) such a kernel is laid
// out here instead of through the optimizer's opts, around vdpbf16ps, which adds to each of 16
// float32 lanes the two products of a pair of bfloat16 values of each operand: a pair along K.
//   - B is the operand that some output loop (the column loop) moves by one element and the
//     other does not move: 32 columns of it are one 64-byte load per row of K. A row k and the
//     row k+1 are interleaved in registers (vpunpcklwd / vpunpckhwd, within 128-bit lanes), which
//     gives two vectors of 16 column pairs: columns {0-3, 8-11, 16-19, 24-27} and {4-7, ...}.
//     So B keeps the layout it has (a Linear's W^T is already a contiguous copy: Note [transposed
//     B] in schedule/padded_rows.cpp); no packed [K/2, N, 2] copy is made, whose writes would
//     cost another pass over B every step and whose layout the scheduler would have to choose
//     apart from the kernel that reads it. The two shuffles per row pair are shared by every
//     row of the tile.
//   - A's two values of the pair are one 32-bit word broadcast to the 16 lanes; the tile has up
//     to DOT_TILE_ROWS rows of A (the innermost output loop that moves only A), so a row pair
//     of B feeds 2 x rows instructions, with 2 x rows accumulators (16 of AVX-512's 32 registers
//     at 8 rows).
//   - K: the innermost reduce loop of even length (else the innermost one) is taken in pairs,
//     inside the other reduce loops; an odd length ends with one step whose second values are
//     zero (A's half of the word and B's row), so no element past the loop is read.
//   - after the loops the two accumulators of a row are shuffled back into column order, and
//     the store's expression (the rounding to bfloat16, a bias, ...) is computed per element
//     with the kernel graph's own arithmetic on their lanes, which LLVM packs into vectors again.
// The products of vdpbf16ps are exact (8-bit significands), each sum is rounded to float32 as
// in the float32 kernel, only in another order (pairs first), and denormal bfloat16 inputs and
// results are flushed to zero; the results agree with a float32 reference within the
// float32-accumulation bound, not bit for bit. The scheduler gives such products their bfloat16
// operands in buffers of their own (Note [bfloat16 operands in buffers] in
// schedule/padded_rows.cpp). Kernels whose column loop is not a multiple of 32, or whose B is
// computed rather than loaded, keep the optimizer's float32 kernels; so do hosts without
// AVX512-BF16 and CPU_ISA=avx2, bit for bit as before. On the 2-core EPYC (Zen 4, loaded by other
// builds) a 2048 matmul ran at 88 GFLOP/s against 40 in float32 in the same run, the MLP step in
// 26 ms against 61 (docs/PERFORMANCE.md).
#include "tinygrad/codegen/cpu_dot.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {

// Most rows of A per tile (Note [bf16 dot tiles]).
constexpr int64_t DOT_TILE_ROWS = 8;

int64_t trip(const UOpPtr& range) { return static_cast<int64_t>(range->src[0]->const_value()); }

bool by_id(const UOpPtr& a, const UOpPtr& b) { return a->arg_int() < b->arg_int(); }

// The bfloat16 value below a float32 cast, or null.
UOpPtr bf16_below(const UOpPtr& u) {
  if (u->op != Op::CAST || u->dtype != DType::Float32 || u->src[0]->dtype != DType::BFloat16) return nullptr;
  return u->src[0];
}

// Whether `index` moves along `range` only through additions and multiplications (no division
// or modulo of it): neighbouring values of the loop are then evenly spaced.
bool affine_in(const UOpPtr& index, const UOp* range) {
  for (auto& n : toposort({index}))
    if (n->op != Op::ADD && n->op != Op::MUL && n->op != Op::RANGE && n->op != Op::CONST &&
        ranges_in(n).count(range))
      return false;
  return true;
}

struct DotProduct {
  UOpPtr store, reduce;
  UOpPtr a;               // A's bfloat16 value
  UOpPtr b;               // B's bfloat16 LOAD
  UOpPtr col;             // the output loop along B's contiguous columns
  UOpPtr row;             // the output loop of A's tile rows (null: one row)
  int64_t rows = 1;       // rows of A per tile
  UOpPtr pair;            // the reduce loop taken in pairs
  std::vector<UOpPtr> outputs, reduces;  // all of them, by id
};

// The column loop of B: the innermost output loop that moves B by one element, evenly, and not
// A, a multiple of the tile's columns long.
UOpPtr column_loop(const UOpPtr& b, const UOpPtr& a, const std::vector<UOpPtr>& outputs) {
  if (b->op != Op::LOAD || b->src.size() != 2 || b->src[0]->op != Op::DEFINE_GLOBAL) return nullptr;
  auto in_a = ranges_in(a);
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {
    const UOpPtr& r = *it;
    if (in_a.count(r.get()) || index_stride(b->src[1], r) != 1) continue;
    if (trip(r) % DOT_TILE_COLUMNS == 0 && affine_in(b->src[1], r.get())) return r;
  }
  return nullptr;
}

// The tile's rows: the innermost output loop that moves A and not B, and the most rows up to
// DOT_TILE_ROWS that divide it (5 of a convolution's rows of 10 or 20 pixels).
void choose_rows(DotProduct& d) {
  auto in_a = ranges_in(d.a), in_b = ranges_in(d.b);
  for (auto it = d.outputs.rbegin(); it != d.outputs.rend(); ++it) {
    if (!in_a.count(it->get()) || in_b.count(it->get())) continue;
    for (int64_t r = DOT_TILE_ROWS; r >= 2; r--)
      if (trip(*it) % r == 0) {
        d.row = *it, d.rows = r;
        return;
      }
    return;
  }
}

std::optional<DotProduct> match(const UOpPtr& ast) {
  if (ast->op != Op::STORE || ast->src.size() != 3) return std::nullopt;
  DotProduct d;
  d.store = ast;
  for (auto& u : toposort({ast})) {
    if (u->op != Op::REDUCE) continue;
    if (d.reduce) return std::nullopt;
    d.reduce = u;
  }
  if (!d.reduce || std::get<Op>(d.reduce->arg) != Op::ADD || d.reduce->dtype != DType::Float32) return std::nullopt;
  const UOpPtr& mul = d.reduce->src[0];
  if (mul->op != Op::MUL || mul->dtype != DType::Float32) return std::nullopt;
  UOpPtr x = bf16_below(mul->src[0]), y = bf16_below(mul->src[1]);
  if (!x || !y) return std::nullopt;
  d.reduces.assign(d.reduce->src.begin() + 1, d.reduce->src.end());
  std::sort(d.reduces.begin(), d.reduces.end(), by_id);
  auto in_x = ranges_in(x), in_y = ranges_in(y);
  std::unordered_set<const UOp*> reduce_loops;
  for (auto& r : d.reduces) {
    if (!in_x.count(r.get()) || !in_y.count(r.get())) return std::nullopt;
    reduce_loops.insert(r.get());
  }
  for (auto& u : toposort({ast}))
    if (u->op == Op::RANGE && !reduce_loops.count(u.get())) d.outputs.push_back(u);
  std::sort(d.outputs.begin(), d.outputs.end(), by_id);
  if (d.reduces.empty() || d.outputs.empty()) return std::nullopt;
  if (UOpPtr c = column_loop(y, x, d.outputs)) d.a = x, d.b = y, d.col = c;
  else if (UOpPtr c2 = column_loop(x, y, d.outputs)) d.a = y, d.b = x, d.col = c2;
  else return std::nullopt;
  choose_rows(d);
  d.pair = d.reduces.back();
  for (auto it = d.reduces.rbegin(); it != d.reduces.rend(); ++it)
    if (trip(*it) % 2 == 0) {
      d.pair = *it;
      break;
    }
  if (trip(d.pair) < 2) return std::nullopt;
  return d;
}

using Sub = std::unordered_map<const UOp*, UOpPtr>;

// Appends uops, each node once within the loops it was emitted in: a node emitted inside a loop
// is emitted again when it is needed after the loop closes (its value is not defined there).
class ScopedEmitter {
 public:
  explicit ScopedEmitter(LinearKernel& k) : k_(k) {}
  void push(const UOpPtr& u) {
    k_.uops.push_back(u);
    emitted_.insert(u.get());
    scopes_.back().push_back(u.get());
  }
  // root's nodes not emitted yet, sources first (constants and loops are not instructions)
  void emit(const UOpPtr& root) {
    for (auto& u : toposort({root})) {
      if (emitted_.count(u.get()) || u->op == Op::CONST || u->op == Op::RANGE) continue;
      push(u);
    }
  }
  void open(const UOpPtr& range) {
    push(range);
    scopes_.emplace_back();
  }
  void close(const UOpPtr& range) {
    for (auto* u : scopes_.back()) emitted_.erase(u);
    scopes_.pop_back();
    k_.uops.push_back(make_uop(Op::ENDRANGE, dtypes::index, {range}));
  }

 private:
  LinearKernel& k_;
  std::unordered_set<const UOp*> emitted_;
  std::vector<std::vector<const UOp*>> scopes_{{}};
};

UOpPtr wmma(DType dtype, std::vector<UOpPtr> src, DotPart part, int64_t value = 0) {
  return make_uop(Op::WMMA, dtype, std::move(src), Arg{dot_arg(part, value)});
}

class TileEmitter {
 public:
  TileEmitter(const DotProduct& d, LinearKernel& k, int64_t l2_bytes) : d_(d), out_(k), l2_bytes_(l2_bytes) {
    for (auto& u : toposort({d_.store}))
      if (u->op == Op::RANGE) next_id_ = std::max(next_id_, u->arg_int() + 1);
  }

  void run() {
    std::vector<UOpPtr> outputs;
    for (auto& o : d_.outputs) outputs.push_back(o == d_.col ? col_strip() : o == d_.row ? row_outer() : o);
    if (col_group()) outputs.insert(outputs.begin(), col_group());  // Note [column groups]
    for (auto& o : outputs) out_.open(o);
    declare_accumulators();
    for (auto& r : d_.reduces)
      if (r != d_.pair) out_.open(r);
    UOpPtr step = make_uop(Op::RANGE, dtypes::index, {kint(trip(d_.pair) / 2)}, Arg{next_id_++});
    out_.open(step);
    emit_step(kalu(Op::MUL, step, kint(2)), true);
    out_.close(step);
    if (trip(d_.pair) % 2) emit_step(kint(trip(d_.pair) - 1), false);
    for (auto it = d_.reduces.rbegin(); it != d_.reduces.rend(); ++it)
      if (*it != d_.pair) out_.close(*it);
    emit_stores();
    for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) out_.close(*it);
  }

 private:
  // The column loop as groups (null: one group) of strips of DOT_TILE_COLUMNS columns.
  UOpPtr col_group() {
    if (!col_strip_) col_strip();
    return col_group_;
  }
  UOpPtr col_strip() {
    if (col_strip_) return col_strip_;
    int64_t strips = trip(d_.col) / DOT_TILE_COLUMNS, per_group = strips_per_group(strips);
    if (per_group < strips)
      col_group_ = make_uop(Op::RANGE, dtypes::index, {kint(strips / per_group)}, Arg{next_id_++});
    col_strip_ = make_uop(Op::RANGE, dtypes::index, {kint(per_group)}, Arg{d_.col->arg_int()});
    return col_strip_;
  }
  // Note [column groups]: the strips of a B that does not fit in half the L2 are grouped, the
  // most strips whose panels (all of K x 32 columns) fit there, and the groups are the
  // outermost loop: a group's panels then stay in the L2 while every row tile of A passes over
  // them, and a row tile stays in the L1 while it passes over the group's strips. Without groups
  // each row tile read all of B again from the L3 (8 MB per row tile in a 2048 product).
  int64_t strips_per_group(int64_t strips) const {
    int64_t k = 1;
    for (auto& r : d_.reduces) k *= trip(r);
    const int64_t panel = k * DOT_TILE_COLUMNS * 2, budget = l2_bytes_ / 2;
    if (panel * strips <= budget) return strips;
    int64_t best = 1;
    for (int64_t g = 1; g <= strips; g++)
      if (strips % g == 0 && g * panel <= budget) best = g;
    return best;
  }
  UOpPtr row_outer() {
    if (!row_outer_) row_outer_ = make_uop(Op::RANGE, dtypes::index, {kint(trip(d_.row) / d_.rows)}, Arg{d_.row->arg_int()});
    return row_outer_;
  }
  // The loops' values at column c and row r of the tile.
  Sub at(int64_t row, int64_t col) {
    UOpPtr strip = col_group() ? kalu(Op::ADD, kalu(Op::MUL, col_group(), kint(trip(col_strip()))), col_strip())
                               : col_strip();
    Sub s{{d_.col.get(), kalu(Op::ADD, kalu(Op::MUL, strip, kint(DOT_TILE_COLUMNS)), kint(col))}};
    if (d_.row) s[d_.row.get()] = kalu(Op::ADD, kalu(Op::MUL, row_outer(), kint(d_.rows)), kint(row));
    return s;
  }
  UOpPtr placed(const UOpPtr& x, Sub s) { return graph_rewrite(substitute(x, s), symbolic(), memo_); }

  void declare_accumulators() {
    UOpPtr zero = wmma(DType::Float32, {}, DotPart::Zero);
    out_.push(zero);
    int64_t id = 0;
    acc_.resize(static_cast<size_t>(d_.rows));
    for (auto& row : acc_)
      for (int h = 0; h < 2; h++) {
        row.push_back(make_uop(Op::DEFINE_ACC, DType::Float32, {zero}, Arg{id++}));
        out_.push(row.back());
      }
  }

  // One pair along K at `k` (the pair's first index); `both`: false for an odd loop's last step.
  void emit_step(const UOpPtr& k, bool both) {
    std::vector<UOpPtr> rows;
    for (int64_t e = 0; e < (both ? 2 : 1); e++) {
      Sub s = at(0, 0);
      s[d_.pair.get()] = kalu(Op::ADD, k, kint(e));
      UOpPtr index = placed(d_.b->src[1], s);
      out_.emit(index);
      rows.push_back(wmma(DType::BFloat16, {d_.b->src[0], index}, DotPart::Rows));
      out_.push(rows.back());
    }
    UOpPtr halves[2];
    for (int h = 0; h < 2; h++) {
      halves[h] = wmma(DType::BFloat16, rows, DotPart::Interleave, h);
      out_.push(halves[h]);
    }
    for (int64_t r = 0; r < d_.rows; r++) {
      std::vector<UOpPtr> values;
      for (int64_t e = 0; e < (both ? 2 : 1); e++) {
        Sub s = at(r, 0);
        s[d_.pair.get()] = kalu(Op::ADD, k, kint(e));
        values.push_back(placed(d_.a, s));
        out_.emit(values.back());
      }
      UOpPtr pair = wmma(DType::Int32, values, DotPart::Pair);
      out_.push(pair);
      for (int h = 0; h < 2; h++) {
        const UOpPtr& acc = acc_[static_cast<size_t>(r)][static_cast<size_t>(h)];
        UOpPtr dot = wmma(DType::Float32, {acc, pair, halves[h]}, DotPart::Dot);
        out_.push(dot);
        out_.push(make_uop(Op::ASSIGN, DType::Float32, {acc, dot}));
      }
    }
  }

  // The row's columns in order (one shuffle of its two accumulators per 16), then each element's
  // store: neighbouring lanes of one vector, which LLVM's SLP vectorizer packs back into vectors.
  void emit_stores() {
    for (int64_t r = 0; r < d_.rows; r++) {
      const auto& acc = acc_[static_cast<size_t>(r)];
      UOpPtr columns[2];
      for (int h = 0; h < 2; h++) {
        columns[h] = wmma(DType::Float32, {acc[0], acc[1]}, DotPart::Columns, h);
        out_.push(columns[h]);
      }
      for (int64_t c = 0; c < DOT_TILE_COLUMNS; c++) {
        Sub s = at(r, c);
        s[d_.reduce.get()] = wmma(DType::Float32, {columns[c / 16]}, DotPart::Lane, c % 16);
        out_.emit(placed(d_.store, s));
      }
    }
  }

  const DotProduct& d_;
  ScopedEmitter out_;
  RewriteMemo memo_;
  int64_t l2_bytes_, next_id_ = 0;
  UOpPtr col_group_, col_strip_, row_outer_;
  std::vector<std::vector<UOpPtr>> acc_;  // [row][half]
};

std::string sizes(const std::vector<UOpPtr>& loops) {
  std::string s;
  for (auto& l : loops) s += (s.empty() ? "" : "_") + std::to_string(trip(l));
  return s;
}

}  // namespace

// Note [bf16 dot tiles]
std::optional<LinearKernel> bf16_dot_kernel(const UOpPtr& ast, const std::vector<DType>& param_dtypes,
                                            int64_t l2_bytes) {
  auto d = match(ast);
  if (!d) return std::nullopt;
  LinearKernel k;
  for (size_t i = 0; i < param_dtypes.size(); i++) k.params.push_back({param_dtypes[i], i == 0});
  TileEmitter(*d, k, l2_bytes).run();
  k.name = "r_bf16dot_" + sizes(d->outputs) + "__" + sizes(d->reduces);
  k.global_size = {trip(k.uops.front())};
  return k;
}

}  // namespace tg
