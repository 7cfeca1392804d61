// Unit tests of the symbolic simplifier: index arithmetic folds to plain strides.
#include <gtest/gtest.h>

#include <unordered_map>

#include "tinygrad/ops.h"
#include "tinygrad/rewrite.h"

using namespace tg;

namespace {
UOpPtr range(int64_t id, int64_t n) { return make_uop(Op::RANGE, dtypes::index, {kint(n)}, Arg{id}); }
UOpPtr add(UOpPtr a, UOpPtr b) { return kalu(Op::ADD, a, b); }
UOpPtr mul(UOpPtr a, int64_t c) { return kalu(Op::MUL, a, kint(c)); }
UOpPtr div(UOpPtr a, int64_t c) { return kalu(Op::IDIV, a, kint(c)); }
UOpPtr mod(UOpPtr a, int64_t c) { return kalu(Op::MOD, a, kint(c)); }
UOpPtr simp(UOpPtr x) { return graph_rewrite(x, symbolic()); }
// an index expression's value with the given ranges set
int64_t eval_int(const UOpPtr& u, const std::unordered_map<const UOp*, int64_t>& env) {
  auto s = [&](size_t i) { return eval_int(u->src[i], env); };
  switch (u->op) {
    case Op::CONST: return static_cast<int64_t>(u->const_value());
    case Op::RANGE: return env.at(u.get());
    case Op::ADD: return s(0) + s(1);
    case Op::MUL: return s(0) * s(1);
    case Op::IDIV: return s(0) / s(1);
    case Op::MOD: return s(0) % s(1);
    default: ADD_FAILURE() << "eval_int: " << op_name(u->op); return 0;
  }
}
}  // namespace

TEST(Symbolic, ConstantFolding) {
  EXPECT_TRUE(is_const(simp(add(kint(2), mul(kint(3), 4))), 14));
  EXPECT_TRUE(is_const(simp(kalu(Op::MUL, kconst(DType::Float32, 1.5), kconst(DType::Float32, 2))), 3));
}

TEST(Symbolic, SplitAndMergeOfAReshapeVanish) {
  auto i = range(0, 6), j = range(1, 4);
  auto flat = add(mul(i, 4), j);  // [6,4] -> linear
  EXPECT_EQ(simp(div(flat, 4)), i);
  EXPECT_EQ(simp(mod(flat, 4)), j);
  // (x // 4) * 4 + x % 4 == x
  auto x = add(mul(i, 7), j);
  EXPECT_EQ(simp(add(mul(div(x, 4), 4), mod(x, 4))), simp(x));
}

TEST(Symbolic, DivisionByBounds) {
  auto j = range(0, 3);
  EXPECT_TRUE(is_const(simp(div(j, 3)), 0));
  EXPECT_EQ(simp(mod(j, 3)), j);
  EXPECT_EQ(simp(div(div(range(1, 100), 2), 5)), simp(div(range(1, 100), 10)));
  // a term whose coefficient the divisor divides leaves the modulo
  auto i = range(2, 5);
  EXPECT_EQ(simp(mod(add(mul(i, 10), j), 5)), j);
}

TEST(Symbolic, CommonFactorOfTheCoefficients) {
  // Note [common factor]: (20*y + x) // 40 with x < 20 is y // 2, whatever y's range
  auto y = range(0, 20), x = range(1, 20);
  auto flat = add(mul(y, 20), x);
  EXPECT_EQ(simp(div(flat, 40)), simp(div(y, 2)));
  EXPECT_EQ(simp(mod(flat, 40)), simp(add(mul(mod(y, 2), 20), x)));
  // ... so a pooling window's row split and merge vanish
  EXPECT_EQ(simp(add(mul(div(flat, 40), 40), mul(mod(y, 2), 20))), simp(add(mul(y, 20), kint(0))));
  // every value agrees with plain integer arithmetic, also when the rule must not apply (x < 30)
  for (int64_t xn : {20, 30}) {
    auto x2 = range(2, xn);
    auto e = add(add(mul(y, 20), x2), kint(3));
    for (int64_t c : {40, 60, 8}) {
      auto d = simp(div(e, c)), m = simp(mod(e, c));
      for (int64_t yv = 0; yv < 20; yv++)
        for (int64_t xv = 0; xv < xn; xv++) {
          int64_t v = 20 * yv + xv + 3;
          std::unordered_map<const UOp*, int64_t> env{{y.get(), yv}, {x2.get(), xv}};
          EXPECT_EQ(eval_int(d, env), v / c) << "c=" << c;
          EXPECT_EQ(eval_int(m, env), v % c) << "c=" << c;
        }
    }
  }
}

TEST(Symbolic, ComparisonsDecidedByBounds) {
  auto j = range(0, 3);
  EXPECT_TRUE(is_const(simp(kalu(Op::CMPLT, j, kint(3))), 1));
  EXPECT_TRUE(is_const(simp(kalu(Op::CMPLT, j, kint(0))), 0));
  auto undecided = simp(kalu(Op::CMPLT, j, kint(2)));
  EXPECT_EQ(undecided->op, Op::CMPLT);
}

TEST(Symbolic, NegativeOperandsAreLeftAlone) {
  auto j = range(0, 3);
  auto e = div(add(j, kint(-1)), 2);  // may be negative: C division truncates, no rewrite applies
  EXPECT_EQ(simp(e)->op, Op::IDIV);
}

// Note [indices under a gate] in rewrite.cpp: the third of three [4, 16] pieces concatenated flat
// and read back through a [3, 4, 16] reshape, as a PAD leaves it: (flat - 128) % 16 and
// (flat - 128) / 16 % 4 stay as they are for all y, and vanish where the gate (1 < y) holds.
int count_ops(const UOpPtr& u, Op op) {
  int n = 0;
  for (auto& x : toposort({u})) n += x->op == op;
  return n;
}

TEST(Symbolic, AGatedIndexIsSimplifiedWhereItsGateHolds) {
  auto y = range(0, 3), r = range(1, 4), c = range(2, 16);
  auto inner = add(add(mul(y, 64), mul(r, 16)), c);
  auto piece = add(inner, kint(-128));
  auto index = simp(add(mul(mod(div(piece, 16), 4), 16), mod(piece, 16)));
  EXPECT_GT(count_ops(index, Op::IDIV) + count_ops(index, Op::MOD), 0) << "no bound makes it simpler for every y";
  auto gate = simp(kalu(Op::CMPLT, kint(1), y));
  auto under = simplify_under_gate(index, gate);
  EXPECT_EQ(count_ops(under, Op::IDIV) + count_ops(under, Op::MOD), 0);
  for (int64_t rv = 0; rv < 4; rv++)
    for (int64_t cv = 0; cv < 16; cv++) {
      std::unordered_map<const UOp*, int64_t> env{{y.get(), 2}, {r.get(), rv}, {c.get(), cv}};
      EXPECT_EQ(eval_int(under, env), eval_int(index, env));
    }
  // a gate that leaves a variable several values: it is shifted into a variable from 0 and back
  auto wide = range(3, 8), k = range(4, 4);
  auto shifted = add(add(mul(wide, 4), k), kint(-12));  // rows 3.. of a padded [8, 4] view
  auto tail = simp(add(mod(shifted, 4), mul(mod(div(shifted, 4), 2), 100)));
  auto gate_wide = simp(kalu(Op::AND, kalu(Op::CMPLT, kint(2), wide), kalu(Op::CMPLT, wide, kint(7))));
  auto tail_under = simplify_under_gate(tail, gate_wide);
  EXPECT_LT(count_ops(tail_under, Op::IDIV) + count_ops(tail_under, Op::MOD),
            count_ops(tail, Op::IDIV) + count_ops(tail, Op::MOD));
  for (int64_t wv = 3; wv < 7; wv++)
    for (int64_t kv = 0; kv < 4; kv++) {
      std::unordered_map<const UOp*, int64_t> env{{wide.get(), wv}, {k.get(), kv}};
      EXPECT_EQ(eval_int(tail_under, env), eval_int(tail, env));
    }
  // a gate on something other than a loop variable leaves the index alone
  EXPECT_EQ(simplify_under_gate(index, simp(kalu(Op::CMPLT, kint(1), add(y, r)))), index);
}

TEST(UOp, HashConsing) {
  auto a = add(range(0, 4), kint(1));
  auto b = add(range(0, 4), kint(1));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(add(range(0, 4), kint(2)).get(), a.get());
}
