// Backend op tests, part 3: movement ops (reshape, permute, transpose, expand, pad with a value,
// shrink, flip, squeeze, unsqueeze, flatten, slicing with positive and negative steps, cat,
// stack, split, chunk, repeat, gather, index_select) and chains of non-contiguous views feeding
// compute. Forward and backward, each against the float64 reference interpreter on the same
// lazy graph, plus hand-checked values; and chains of views read as strides (strided_view.h).
#include <gtest/gtest.h>

#include <numeric>

#include "ops_util.h"
#include "tinygrad/strided_view.h"

using namespace tg;
using namespace tg::testutil;

namespace {

constexpr auto NONE = std::nullopt;

struct MoveCase {
  const char* name;
  Shape in;
  std::function<Tensor(const Tensor&)> f;
};
void PrintTo(const MoveCase& c, std::ostream* os) { *os << c.name; }

Slice S(std::optional<int64_t> b, std::optional<int64_t> e, int64_t step = 1) { return Slice{b, e, step}; }

const std::vector<MoveCase>& move_cases() {
  static const std::vector<MoveCase> cases = {
      {"reshape", {2, 3, 4}, [](const Tensor& x) { return x.reshape({4, 6}); }},
      {"reshape_infer", {2, 3, 4}, [](const Tensor& x) { return x.reshape({-1, 2}); }},
      {"reshape_scalar", {1, 1}, [](const Tensor& x) { return x.reshape({}); }},
      {"view", {6}, [](const Tensor& x) { return x.view({3, 2}); }},
      {"permute", {2, 3, 4}, [](const Tensor& x) { return x.permute({2, 0, 1}); }},
      {"permute_neg", {2, 3, 4}, [](const Tensor& x) { return x.permute({-1, -3, -2}); }},
      {"transpose", {2, 3, 4}, [](const Tensor& x) { return x.transpose(0, 2); }},
      {"T", {3, 5}, [](const Tensor& x) { return x.T(); }},
      {"expand", {3, 1}, [](const Tensor& x) { return x.expand({3, 4}); }},
      {"expand_new_dims", {3, 1}, [](const Tensor& x) { return x.expand({2, -1, 5}); }},
      {"broadcast_to", {1, 4}, [](const Tensor& x) { return x.broadcast_to({3, 2, 4}); }},
      {"pad", {2, 3}, [](const Tensor& x) { return x.pad({{1, 2}, {0, 3}}); }},
      {"pad_first_dim_only", {2, 3}, [](const Tensor& x) { return x.pad({{2, 1}}); }},
      {"pad_value", {2, 3}, [](const Tensor& x) { return x.pad({{1, 1}, {2, 0}}, -7.5); }},
      {"pad_negative_crops", {4, 5}, [](const Tensor& x) { return x.pad({{-1, 2}, {1, -2}}); }},
      {"shrink", {4, 5}, [](const Tensor& x) { return x.shrink({{1, 3}, {0, 4}}); }},
      {"shrink_first_dim", {4, 5}, [](const Tensor& x) { return x.shrink({{2, 4}}); }},
      {"flip", {3, 4}, [](const Tensor& x) { return x.flip({0}); }},
      {"flip_all", {2, 3, 4}, [](const Tensor& x) { return x.flip({0, -1, 1}); }},
      {"squeeze_all", {1, 3, 1, 2}, [](const Tensor& x) { return x.squeeze(); }},
      {"squeeze_axis", {1, 3, 1, 2}, [](const Tensor& x) { return x.squeeze(-2); }},
      {"squeeze_noop", {2, 3}, [](const Tensor& x) { return x.squeeze(0); }},
      {"unsqueeze", {2, 3}, [](const Tensor& x) { return x.unsqueeze(1); }},
      {"unsqueeze_end", {2, 3}, [](const Tensor& x) { return x.unsqueeze(-1); }},
      {"flatten", {2, 3, 4}, [](const Tensor& x) { return x.flatten(); }},
      {"flatten_range", {2, 3, 4, 2}, [](const Tensor& x) { return x.flatten(1, 2); }},
      {"repeat", {2, 3}, [](const Tensor& x) { return x.repeat({2, 3}); }},
      {"repeat_new_dim", {2, 3}, [](const Tensor& x) { return x.repeat({2, 1, 2}); }},
      {"slice_int", {3, 4}, [](const Tensor& x) { return x[1]; }},
      {"slice_neg_int", {3, 4}, [](const Tensor& x) { return x[{Index::all(), -1}]; }},
      {"slice_range", {5, 6}, [](const Tensor& x) { return x[{S(1, 4), S(NONE, -2)}]; }},
      {"slice_step", {7, 6}, [](const Tensor& x) { return x[{S(NONE, NONE, 2), S(1, NONE, 3)}]; }},
      {"slice_neg_step", {7, 6}, [](const Tensor& x) { return x[{S(NONE, NONE, -1), S(4, 0, -2)}]; }},
      {"slice_neg_step3", {8}, [](const Tensor& x) { return x[{S(-2, NONE, -3)}]; }},
      {"slice_empty", {5, 3}, [](const Tensor& x) { return x[{S(3, 1)}]; }},
      {"slice_newaxis", {3, 4}, [](const Tensor& x) { return x[{Index::newaxis(), S(0, 2), Index::newaxis(), 2}]; }},
      {"slice_clamped", {4}, [](const Tensor& x) { return x[{S(-100, 100, 3)}]; }},
      {"split_size", {5, 3}, [](const Tensor& x) { return x.split(2)[2] * 2.0 + x.split(2)[0].sum(0); }},
      {"split_sizes", {2, 7}, [](const Tensor& x) { auto p = x.split(std::vector<int64_t>{3, 4}, 1); return p[1].sum(1) - p[0].max(1); }},
      {"chunk", {7, 2}, [](const Tensor& x) { auto c = x.chunk(3); return Tensor::cat({c[2], c[0].flip({0}), c[1]}, 0); }},
      {"cat_axis1", {2, 3}, [](const Tensor& x) { return Tensor::cat({x, x * 2.0, x.flip({1})}, 1); }},
      {"cat_neg_axis", {2, 3}, [](const Tensor& x) { return Tensor::cat({x.T(), x.T().square()}, -1); }},
      {"stack", {2, 3}, [](const Tensor& x) { return Tensor::stack({x, x.exp()}); }},
      {"stack_mid", {2, 3}, [](const Tensor& x) { return Tensor::stack({x, x * 3.0, -x}, 1); }},
      {"stack_end", {2, 3}, [](const Tensor& x) { return Tensor::stack({x, x.sin()}, -1); }},
      // non-contiguous views feeding compute and each other
      {"permute_add", {2, 3, 4}, [](const Tensor& x) { return x.permute({2, 0, 1}) + x.permute({2, 0, 1}).flip({1}); }},
      {"transpose_mul", {4, 4}, [](const Tensor& x) { return x * x.T(); }},
      {"reshape_of_permute", {2, 3, 4}, [](const Tensor& x) { return x.permute({1, 2, 0}).reshape({6, 4}).exp(); }},
      {"permute_of_reshape", {2, 3, 4}, [](const Tensor& x) { return x.reshape({4, 3, 2}).permute({2, 1, 0}) * 2.0; }},
      {"pad_flip_shrink", {4, 5}, [](const Tensor& x) { return x.pad({{2, 1}, {1, 1}}).flip({0}).shrink({{1, 6}, {0, 6}}).sin(); }},
      {"shrink_of_pad", {4, 5}, [](const Tensor& x) { return x.pad({{3, 3}, {3, 3}}).shrink({{2, 8}, {4, 9}}); }},
      {"expand_permute", {3, 1}, [](const Tensor& x) { return x.expand({3, 4}).T().reshape({2, 6}) * x.reshape({1, 3}).expand({4, 3}).reshape({2, 6}); }},
      {"slice_of_slice", {9, 8}, [](const Tensor& x) { return x[{S(NONE, NONE, -2)}][{S(1, NONE, 2), S(NONE, NONE, -3)}]; }},
      {"flip_reshape_flip", {2, 6}, [](const Tensor& x) { return x.flip({1}).reshape({3, 4}).flip({0}) + 1.0; }},
  };
  return cases;
}

}  // namespace

class Movement : public ::testing::TestWithParam<MoveCase> {};

TEST_P(Movement, Float32) {
  auto& c = GetParam();
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return c.f(in[0]); }, {rnd(c.in, 71)}));
}

INSTANTIATE_TEST_SUITE_P(Ops, Movement, ::testing::ValuesIn(move_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Note [strided views]: where a case's views are strides over their input, reading the input
// (its elements numbered 0, 1, ...) at offset + sum i_k * strides[k] gives each element of the
// view. Pads and flips stop the walk (their base is the pad or flip), and a reshape that merges
// permuted dims is no stride.
TEST_P(Movement, StridedViewsReadTheirBase) {
  auto& c = GetParam();
  std::vector<float> numbers(static_cast<size_t>(prod(c.in)));
  std::iota(numbers.begin(), numbers.end(), 0.0f);
  Tensor base = Tensor::from_vector(numbers, c.in);
  Tensor view = c.f(base);
  std::optional<StridedView> v = strided_view(view.uop());
  if (!v || v->base != base.uop()) return;
  ASSERT_EQ(v->strides.size(), view.shape().size());
  std::vector<float> want = view.contiguous().to_vector<float>();
  std::vector<int64_t> index(view.shape().size(), 0);
  for (size_t flat = 0; flat < want.size(); flat++) {
    int64_t at = v->offset;
    for (size_t d = 0; d < index.size(); d++) at += index[d] * v->strides[d];
    ASSERT_EQ(static_cast<float>(at), want[flat]) << "element " << flat;
    for (size_t d = index.size(); d-- > 0;)
      if (++index[d] < view.shape()[d])
        break;
      else
        index[d] = 0;
  }
}

TEST(Ops, StridedViewsOfAttentionOperands) {
  Tensor qkv = Tensor::zeros({2, 5, 3 * 4 * 8}).realize();  // [B, T, 3 * H * hd]
  Tensors parts = qkv.reshape({2, 5, 3, 4, 8}).permute({2, 0, 3, 1, 4}).chunk(3, 0);
  std::optional<StridedView> k = strided_view(parts[1].reshape({2, 4, 5, 8}).uop());
  ASSERT_TRUE(k);
  EXPECT_EQ(k->base, qkv.uop());
  EXPECT_EQ(k->offset, 32);
  EXPECT_EQ(k->strides, (std::vector<int64_t>{5 * 96, 8, 96, 1}));
  EXPECT_FALSE(strided_view(parts[1].reshape({8, 5, 8}).uop()));  // B and H are not one dim in qkv
  std::optional<StridedView> wide = strided_view(qkv.reshape({2, 5, 1, 96}).expand({2, 5, 3, 96}).uop());
  ASSERT_TRUE(wide);
  EXPECT_EQ(wide->strides, (std::vector<int64_t>{480, 96, 0, 1}));
}

TEST(Ops, MovementOtherDtypes) {
  Tensor i = rnd_int({3, 4}, 72, -100, 100);
  Tensor u = rnd_int({3, 4}, 73, 0, 256, DType::UInt8);
  Tensor b = rnd_int({3, 4}, 74, 0, 2).cast(DType::Bool);
  Tensor h = rnd({3, 4}, 75, -2, 2, DType::Float16), bf = rnd({3, 4}, 76, -2, 2, DType::BFloat16);
  for (const Tensor& x : {i, u, b, h, bf}) {
    Tensors outs{x.T(), x.flip({0, 1}), x.pad({{1, 0}, {0, 2}}), x.pad({{1, 1}}, 1), x[{S(NONE, NONE, -2), S(1, 3)}],
                 Tensor::cat({x, x}, 1), Tensor::stack({x, x}, 2), x.repeat({1, 2}), x.reshape({2, 6}).permute({1, 0})};
    EXPECT_TRUE(match_all(outs)) << x.describe();
    for (auto& o : outs) EXPECT_EQ(o.dtype(), x.dtype());
  }
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return in[0].flip({1}).pad({{0, 1}}, 2.0).T(); }, {h}));
  EXPECT_TRUE(check_fwd_bwd([](const Tensors& in) { return Tensor::cat({in[0], in[0].T().reshape({3, 4})}); }, {bf}));
  EXPECT_EQ(Tensor::cat({i, h}).dtype(), DType::Float16);  // cat promotes
  EXPECT_TRUE(match(Tensor::cat({i, h, u.cast(DType::Float32)})));
}

TEST(Ops, SlicingHandChecked) {
  Tensor x = Tensor::arange(10);
  auto v = [](const Tensor& t) { return t.to_vector<int32_t>(); };
  using V = std::vector<int32_t>;
  EXPECT_EQ(v(x[{S(1, 8, 3)}]), (V{1, 4, 7}));
  EXPECT_EQ(v(x[{S(NONE, NONE, -1)}]), (V{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(v(x[{S(8, 1, -3)}]), (V{8, 5, 2}));
  EXPECT_EQ(v(x[{S(NONE, NONE, -4)}]), (V{9, 5, 1}));
  EXPECT_EQ(v(x[{S(-3, NONE)}]), (V{7, 8, 9}));
  EXPECT_EQ(v(x[{S(2, -100, -1)}]), (V{2, 1, 0}));
  EXPECT_EQ(v(x[{S(5, 5)}]).size(), 0u);
  EXPECT_EQ(x[-1].shape(), Shape{});
  EXPECT_EQ(x[-1].item<int32_t>(), 9);
  Tensor m = Tensor::arange(12).reshape({3, 4});
  EXPECT_EQ(v(m[{Index::all(), S(NONE, NONE, -2)}]), (V{3, 1, 7, 5, 11, 9}));
  EXPECT_EQ((m[{Index::newaxis(), 1}].shape()), (Shape{1, 4}));
  EXPECT_EQ(v(m.pad({{0, 0}, {1, 0}}, -1)), (V{-1, 0, 1, 2, 3, -1, 4, 5, 6, 7, -1, 8, 9, 10, 11}));
  EXPECT_EQ(v(m.repeat({1, 2})[0]), (V{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(v(Tensor::stack({x[{S(0, 2)}], x[{S(2, 4)}]}, 1)), (V{0, 2, 1, 3}));
  auto parts = x.chunk(3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(v(parts[2]), (V{8, 9}));
  EXPECT_EQ(x.split(std::vector<int64_t>{7, 3})[1].shape(), Shape{3});
  EXPECT_EQ(m.flatten().shape(), Shape{12});
  EXPECT_EQ(Tensor::scalar(3).flatten().shape(), Shape{1});
}

// Python's slice semantics, from its definition: the indices begin, begin+step, ... before end.
std::vector<int64_t> python_slice(std::optional<int64_t> b, std::optional<int64_t> e, int64_t step, int64_t n) {
  auto norm = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    return std::max(lo, std::min(hi, x));
  };
  int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
  int64_t start = norm(b, step > 0 ? 0 : n - 1, lo, hi), stop = norm(e, step > 0 ? n : -1, lo, hi);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

TEST(Ops, SlicingMatchesPython) {
  Tensor x = Tensor::arange(10);
  std::vector<std::optional<int64_t>> ends = {std::nullopt, -12, -7, -3, -1, 0, 2, 5, 9, 12};
  int n_device = 0;
  for (auto b : ends)
    for (auto e : ends)
      for (int64_t step : {1, 2, 3, -1, -2, -4}) {
        auto want = python_slice(b, e, step, 10);
        Tensor y = x[{Slice{b, e, step}}];
        ASSERT_EQ(y.shape(), Shape{static_cast<int64_t>(want.size())});
        // every slice through the reference (cheap); every 29th also on the device
        auto got = reference_eval(y.uop()).data;
        if (n_device++ % 29 == 0) {
          auto dev = y.to_vector<double>();
          EXPECT_EQ(dev, got);
        }
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); i++)
          EXPECT_EQ(got[i], static_cast<double>(want[i]))
              << "[" << (b ? std::to_string(*b) : "") << ":" << (e ? std::to_string(*e) : "") << ":" << step << "]";
      }
}

// ---- integer indexing ----

TEST(Ops, Gather) {
  Tensor x = rnd({3, 5}, 77);
  Tensor idx0 = Tensor::from_vector(std::vector<int32_t>{2, 0, 1, 1, 0, 2, 2, 2}, {2, 4});  // axis 0: rows
  Tensor idx1 = Tensor::from_vector(std::vector<int32_t>{4, 0, 4, 1, 3, 3}, {3, 2});        // axis 1: columns
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].gather(0, idx0); }, {x}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].gather(1, idx1); }, {x}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].gather(-1, idx1.cast(DType::Int64)); }, {x}));
  auto g = x.gather(1, idx1).to_vector<float>();
  auto xv = x.to_vector<float>();
  EXPECT_EQ(g[0], xv[0 * 5 + 4]);
  EXPECT_EQ(g[3], xv[1 * 5 + 1]);
  EXPECT_EQ(g[5], xv[2 * 5 + 3]);
  Tensor xi = rnd_int({3, 5}, 78, -9, 9);
  EXPECT_TRUE(match_all({xi.gather(0, idx0), xi.cast(DType::Float16).gather(1, idx1)}));
}

// Indices outside the tensor read 0 (gather) and add nothing (scatter_add); repeated indices add up.
TEST(Ops, ScatterAdd) {
  Tensor x = rnd({3, 5}, 81), src = rnd({2, 4}, 82);
  Tensor idx0 = Tensor::from_vector(std::vector<int32_t>{2, 0, 2, 2, 0, 0, 1, 7}, {2, 4});
  Tensor idx1 = Tensor::from_vector(std::vector<int64_t>{4, 4, 0, -3, 1, 1, 1, 2}, {2, 4});
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].scatter_add(0, idx0, in[1]); }, {x, src}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].scatter_add(1, idx1, in[1]); }, {x, src}));
  auto got = x.zeros_like().scatter_add(1, idx1, src).to_vector<float>();
  auto sv = src.to_vector<float>();
  EXPECT_EQ(got[0 * 5 + 4], sv[0] + sv[1]);
  EXPECT_EQ(got[0 * 5 + 0], sv[2]);
  EXPECT_EQ(got[1 * 5 + 1], sv[4] + sv[5] + sv[6]);
  EXPECT_EQ(got[2 * 5 + 0], 0.0f);
  Tensor xi = rnd_int({3, 5}, 83, -9, 9), si = rnd_int({2, 4}, 84, -9, 9);
  EXPECT_TRUE(match_all({xi.scatter_add(0, idx0, si), xi.cast(DType::Int64).scatter_add(1, idx1, si),
                         x.cast(DType::Float16).scatter_add(0, idx0, src)}));
  Tensor out_of_range = Tensor::from_vector(std::vector<int32_t>{5, -1, 0}, {1, 3});
  auto g = x.gather(1, out_of_range).to_vector<float>();
  EXPECT_EQ(g[0], 0.0f);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_EQ(g[2], x.to_vector<float>()[0]);
}

TEST(Ops, IndexSelect) {
  Tensor x = rnd({4, 3, 2}, 79);
  Tensor idx = Tensor::from_vector(std::vector<int32_t>{3, 0, 3, 1}, {4});
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].index_select(0, idx); }, {x}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].index_select(1, idx.mod(idx.full_like(3))); }, {x}));
  EXPECT_TRUE(check_fwd_bwd([&](const Tensors& in) { return in[0].T().index_select(-1, idx); }, {x}));
  auto s = x.index_select(0, idx).to_vector<float>();
  auto xv = x.to_vector<float>();
  for (int j = 0; j < 6; j++) {
    EXPECT_EQ(s[0 * 6 + j], xv[3 * 6 + j]);
    EXPECT_EQ(s[3 * 6 + j], xv[1 * 6 + j]);
  }
  EXPECT_EQ(x.index_select(0, idx).shape(), (Shape{4, 3, 2}));
  EXPECT_TRUE(match(rnd_int({5}, 80, 0, 100).index_select(0, idx)));
}
