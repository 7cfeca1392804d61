// Row fusion (Note [row fusion] in tinygrad/schedule/schedule.cpp): a row's reductions and the
// elementwise work that reads them back over the row are one kernel (tests/test_schedule.cpp counts
// the kernels). Results on the default device against the float64 reference and against the
// unfused schedule, forward and backward: softmax, log_softmax, layernorm, logsumexp and
// cross-entropy over rows of odd lengths, rows longer than the rule takes, and several axes.
#include <gtest/gtest.h>

#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/knobs.h"

using namespace tg;
using testutil::check_fwd_bwd;
using testutil::rnd;
using testutil::Tol;

namespace {


// f(x) with the rule on and off: the same values up to float rounding.
::testing::AssertionResult fused_matches_unfused(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                                                 double tol) {
  std::vector<float> fused, unfused;
  {
    testutil::KnobScope on(knobs::ROWFUSE, 1);
    fused = f(x).contiguous().to_vector<float>();
  }
  {
    testutil::KnobScope off(knobs::ROWFUSE, 0);
    unfused = f(x).contiguous().to_vector<float>();
  }
  if (fused.size() != unfused.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < fused.size(); i++)
    if (std::abs(fused[i] - unfused[i]) > tol * (1 + std::abs(unfused[i])))
      return ::testing::AssertionFailure() << "at " << i << ": fused " << fused[i] << ", unfused " << unfused[i];
  return ::testing::AssertionSuccess();
}

const Tol TOL{1e-4, 1e-4};

}  // namespace

TEST(RowFusion, SoftmaxFamilyMatchesReference) {
  // an odd row (a GPU group with a gated tail), one whose largest power-of-two divisor is 16, a
  // power of two, one too short to group, and a row of a 3-d tensor
  for (Shape s : {Shape{5, 1001}, Shape{4, 1040}, Shape{2, 1024}, Shape{7, 33}, Shape{2, 3, 40}}) {
    Tensor x = rnd(s, 10);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].softmax(-1); }, {x}, TOL)) << shape_str(s);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].log_softmax(-1); }, {x}, TOL)) << shape_str(s);
    EXPECT_TRUE(fused_matches_unfused([](const Tensor& t) { return t.softmax(-1); }, x, 1e-5)) << shape_str(s);
  }
  Tensor x = rnd({4, 300}, 11, -20, 20);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].logsumexp(-1); }, {x}, TOL));
}

TEST(RowFusion, LayernormMatchesReference) {
  for (Shape s : {Shape{4, 1000}, Shape{3, 1040}, Shape{6, 9}}) {
    Tensor x = rnd(s, 20), w = rnd({s.back()}, 21), b = rnd({s.back()}, 22);
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm() * in[1] + in[2]; }, {x, w, b}, TOL))
        << shape_str(s);
    EXPECT_TRUE(fused_matches_unfused([](const Tensor& t) { return t.layernorm(); }, x, 1e-5)) << shape_str(s);
  }
  Tensor x = rnd({3, 4, 50}, 23);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm({-2, -1}); }, {x}, TOL));
}

TEST(RowFusion, LongRowsFallBackAndMatch) {
  Tensor x = rnd({2, 20000}, 30);
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].softmax(-1); }, {x}, TOL, false));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].layernorm(); }, {x}, TOL, false));
}

TEST(RowFusion, CrossEntropyForwardBackwardMatches) {
  for (Shape s : {Shape{64, 10}, Shape{16, 1000}}) {
    Tensor logits = rnd(s, 40, -4, 4);
    Tensor labels = testutil::rnd_int({s[0]}, 41, 0, static_cast<int>(s[1]));
    EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].sparse_categorical_crossentropy(in[1]); },
                              {logits, labels}, TOL))
        << shape_str(s);
  }
}
