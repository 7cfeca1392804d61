// Unit tests of the symbolic simplifier: index arithmetic folds to plain strides.
#include <gtest/gtest.h>

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

TEST(UOp, HashConsing) {
  auto a = add(range(0, 4), kint(1));
  auto b = add(range(0, 4), kint(1));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(add(range(0, 4), kint(2)).get(), a.get());
}
