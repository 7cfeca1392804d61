// Reduce loops bounded by the gates of their terms (codegen/reduce_bounds.h).
//
// Note [reduce loops skip gated zeros]: a transposed convolution reads the output gradient
// padded by kh-1 rows on each side, so a 5x5 one over 20 x 20 rows computes 24 x 24 outputs of
// 25 taps on 44% zeros: the output rows near the border reach padded rows with most of their
// taps. Lowered, such a read is a load gated by a validity condition on the window's row,
//   WHERE(3 < y + i && y + i < 24, LOAD(g, ..., same gate), 0) * w[..., i, ...]
// summed over the tap row i; each conjunct is linear in one reduce loop variable (here i, with
// coefficient 1) and otherwise in outer loops only (y), so it holds exactly on a range of i that
// the outer loops set: i >= 4 - y and i < 24 - y. This pass runs every sum-reduce loop only over
// the range where its terms can be nonzero, [max(0, lower bounds), min(trip, upper bounds)): the
// loop becomes i' over that many iterations and i = i' + start, and the conjuncts it satisfies
// by construction become true, so their gates go away. The loop's end is then an expression of
// the outer loops (the renderers take any end; max_trip gives its largest value, for names and
// thread decisions).
// A term counts as zero where false by any of these conditions: the gate of a gated load (which
// loads 0), the condition of a WHERE whose other branch is 0, through products and casts. A
// product of a skipped zero with an infinity or NaN would have been NaN, and is now left out, as
// PyTorch's own backward kernels (which bound their tap loops the same way) leave it out.
// A loop that several reduces share (every lane of a register tile) is bounded only by the
// conditions all of them have: the lanes of a tile along the padded axis differ, so that axis
// keeps its loop (conv2d_gradient pads the columns in memory instead, Note [transposed
// convolutions skip the padded rows] in tensor_nn.cpp). CPU-style devices only: GPU kernels keep
// their loops, whose trip counts the thread mapping and tensor-core layouts read.
#include "tinygrad/codegen/reduce_bounds.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/rewrite.h"

namespace tg {

namespace {

using RangeSet = std::unordered_set<const UOp*>;

void conjuncts(const UOpPtr& c, std::vector<UOpPtr>& out) {
  if (c->op == Op::AND && c->dtype == DType::Bool) {
    conjuncts(c->src[0], out);
    conjuncts(c->src[1], out);
  } else {
    out.push_back(c);
  }
}

// Conditions each of which, where false, makes v zero (Note [reduce loops skip gated zeros]).
void zero_unless(const UOpPtr& v, std::vector<UOpPtr>& out) {
  switch (v->op) {
    case Op::WHERE:
      if (is_const(v->src[2], 0)) {
        conjuncts(v->src[0], out);
        zero_unless(v->src[1], out);
      }
      return;
    case Op::MUL:
      zero_unless(v->src[0], out);
      zero_unless(v->src[1], out);
      return;
    case Op::CAST: zero_unless(v->src[0], out); return;
    case Op::LOAD:
      if (v->src.size() == 3) conjuncts(v->src[2], out);
      return;
    default: return;
  }
}

bool uses_any(const UOpPtr& e, const RangeSet& ranges) {
  for (auto& n : toposort({e}))
    if (ranges.count(n.get())) return true;
  return false;
}

// loop >= value (lower) or loop < value (upper)
struct LoopBound {
  bool lower;
  UOpPtr value;
};

// The bound on `loop` that condition c states, where c is a comparison linear in the loop with
// coefficient +-1 and otherwise in loops that are no reduce's.
std::optional<LoopBound> bound_of(const UOpPtr& c, const UOp* loop, const RangeSet& reduce_loops) {
  if (c->op != Op::CMPLT || c->src[0]->dtype != dtypes::index || c->src[1]->dtype != dtypes::index) return std::nullopt;
  LinearForm a = linear_form(c->src[0]), b = linear_form(c->src[1]);
  int64_t coefficient = 0;
  UOpPtr rest = kint(b.constant - a.constant);  // b - a = coefficient * loop + rest
  for (auto [form, sign] : {std::pair<const LinearForm*, int64_t>{&b, 1}, {&a, -1}})
    for (auto& [term, k] : form->terms) {
      if (term.get() == loop) coefficient += sign * k;
      else if (uses_any(term, reduce_loops)) return std::nullopt;
      else rest = kalu(Op::ADD, rest, kalu(Op::MUL, term, kint(sign * k)));
    }
  // a < b  <=>  coefficient * loop + rest >= 1
  if (coefficient == 1) return LoopBound{true, kalu(Op::ADD, kint(1), kalu(Op::MUL, rest, kint(-1)))};
  if (coefficient == -1) return LoopBound{false, rest};
  return std::nullopt;
}

std::vector<UOpPtr> loops_of(const UOpPtr& reduce) {
  std::vector<UOpPtr> l;
  for (size_t i = 1; i < reduce->src.size(); i++)
    if (reduce->src[i]->op == Op::RANGE) l.push_back(reduce->src[i]);
  return l;
}

}  // namespace

int64_t max_trip(const UOp& range) { return range.src[0]->vmax(); }

// Note [reduce loops skip gated zeros]
UOpPtr bound_reduce_loops(const UOpPtr& ast) {
  auto order = toposort({ast});
  RangeSet reduce_loops;
  std::vector<UOpPtr> reduces;
  for (auto& n : order)
    if (n->op == Op::REDUCE) {
      reduces.push_back(n);
      for (auto& l : loops_of(n)) reduce_loops.insert(l.get());
    }
  if (reduces.empty()) return ast;

  // per loop (in order of appearance), the conditions that bound it in every reduce over it
  std::vector<const UOp*> loops;
  std::unordered_map<const UOp*, std::vector<UOpPtr>> agreed;
  for (auto& r : reduces) {
    std::vector<UOpPtr> zero;
    bool plain_sum = std::get<Op>(r->arg) == Op::ADD && r->src.back()->op == Op::RANGE;
    if (plain_sum) zero_unless(r->src[0], zero);
    for (auto& l : loops_of(r)) {
      std::vector<UOpPtr> mine;
      if (l->src[0]->op == Op::CONST)
        for (auto& c : zero)
          if (bound_of(c, l.get(), reduce_loops) && std::find(mine.begin(), mine.end(), c) == mine.end())
            mine.push_back(c);
      auto [it, first] = agreed.emplace(l.get(), mine);
      if (first) {
        loops.push_back(l.get());
        continue;
      }
      std::vector<UOpPtr> both;
      for (auto& c : it->second)
        if (std::find(mine.begin(), mine.end(), c) != mine.end()) both.push_back(c);
      it->second = both;
    }
  }

  RewriteMemo memo;
  auto simplify = [&](const UOpPtr& u) { return graph_rewrite(u, symbolic(), memo); };
  std::unordered_map<const UOp*, UOpPtr> replaced, bounded;  // any use; a bounded reduce loop
  for (const UOp* l : loops) {
    if (agreed.at(l).empty()) continue;
    // the loop's trip n less what the bounds cut at either end: n - max(0, n - upper...) -
    // max(0, lower...), at most n by its bounds (max_trip)
    UOpPtr n = l->src[0], start = kint(0), cut_end = kint(0);
    auto minus = [](const UOpPtr& a, const UOpPtr& b) { return kalu(Op::ADD, a, kalu(Op::MUL, b, kint(-1))); };
    for (auto& c : agreed.at(l)) {
      LoopBound b = *bound_of(c, l, reduce_loops);
      if (b.lower) start = kalu(Op::MAX, start, b.value);
      else cut_end = kalu(Op::MAX, cut_end, minus(n, b.value));
      replaced[c.get()] = kconst(DType::Bool, 1);  // holds on every iteration left
    }
    start = simplify(start);
    UOpPtr loop = make_uop(Op::RANGE, l->dtype, {simplify(minus(minus(n, cut_end), start))}, l->arg);
    bounded[l] = loop;
    replaced[l] = simplify(kalu(Op::ADD, loop, start));
  }
  if (bounded.empty()) return ast;

  std::unordered_map<const UOp*, UOpPtr> done;
  for (auto& n : order) {
    if (auto it = replaced.find(n.get()); it != replaced.end()) {
      done[n.get()] = it->second;
      continue;
    }
    std::vector<UOpPtr> src;
    for (size_t i = 0; i < n->src.size(); i++) {
      auto b = bounded.find(n->src[i].get());
      src.push_back(n->op == Op::REDUCE && i > 0 && b != bounded.end() ? b->second : done.at(n->src[i].get()));
    }
    if (src == n->src) {
      done[n.get()] = n;
      continue;
    }
    UOpPtr m = make_uop(n->op, n->dtype, src, n->arg);
    done[n.get()] = is_alu(n->op) || n->op == Op::LOAD ? simplify(m) : m;
  }
  return done.at(ast.get());
}

}  // namespace tg
