// Tensor parallel over the devices of one process (Note [tensor parallel] in nn/module.cpp), on
// four virtual CPU devices: grouped splits (q, k and v by heads), a column- and row-parallel
// Linear pair, and training of an MLP and of a tiny GPT against the one-device run, with the
// collectives of a step counted; the refusals; and on two GPUs (label gpu, skipped with fewer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/tensor.h"
#include "tests/multi_util.h"
#include "tests/test_util.h"

using namespace tg;
using tg::testutil::expect_error;

namespace {

using testutil::expect_near;
using testutil::iota;
using testutil::stats_since;

const std::vector<std::string> kFour = {"CPU:0", "CPU:1", "CPU:2", "CPU:3"};
const std::vector<std::string> kTwo = {"CPU:0", "CPU:1"};

}  // namespace

// Note [grouped splits]: [6, 2] in 3 groups of 2 rows over 2 devices: device 0 holds rows 0, 2, 4.
TEST(GroupedSplit, EachDeviceHoldsItsPartOfEveryGroup) {
  Tensor x = Tensor::from_vector(iota(12), {6, 2});
  Tensor s = x.shard(kTwo, 0, 3);
  EXPECT_EQ(s.shard_axis(), 0);
  EXPECT_EQ(s.shard_groups(), 3);
  std::vector<float> all = iota(12);
  Tensors parts = s.shards();
  ASSERT_EQ(parts.size(), 2u);
  for (size_t k = 0; k < 2; k++) {
    std::vector<float> want;
    for (size_t row = k; row < 6; row += 2) want.insert(want.end(), all.begin() + 2 * row, all.begin() + 2 * row + 2);
    EXPECT_EQ(parts[k].shape(), (Shape{3, 2}));
    expect_near(parts[k].to_vector<float>(), want);
  }
  expect_near(s.to_vector<float>(), all);  // gathered back in order
  // the reshape that separates the groups leaves a plain split on the dim after them
  Tensor r = s.reshape({3, 2, 2});
  EXPECT_EQ(r.shard_axis(), 1);
  EXPECT_EQ(r.shard_groups(), 1);
  EXPECT_EQ(r.reshape({6, 2}).shard_groups(), 3);
  expect_near((r * 2).sum(1).to_vector<float>(), (x.reshape({3, 2, 2}) * 2).sum(1).to_vector<float>());
  // a replicated operand is cut to the same rows; a plain split does not mix with a grouped one
  expect_near((s + x.to(kTwo)).to_vector<float>(), (x * 2).to_vector<float>());
  expect_error([&] { (s + x.shard(kTwo, 0)).realize(); }, {"different groups", "3 and 1"});
  expect_error([&] { x.shard(kFour, 0, 3); }, {"axis 0 of size 6", "4 devices in 3 groups", "6 % 12 = 6"});
}

TEST(GroupedSplit, GradientsReachEachPart) {
  Tensor w = Tensor::from_vector(iota(48, 0.25f), {6, 8}, {.requires_grad = true});
  Tensor ws = Tensor::from_vector(iota(48, 0.25f), {6, 8}, {.requires_grad = true});
  ws.shard_(kFour, 1, 2);
  Tensor x = Tensor::from_vector(iota(24, 0.5f), {3, 8});
  (x.matmul(w.T()).square().sum()).backward();
  (x.to(kFour).matmul(ws.T()).square().sum()).backward();
  ASSERT_TRUE(ws.grad());
  EXPECT_EQ(ws.grad()->devices(), ws.devices());
  expect_near(ws.grad()->to_vector<float>(), w.grad()->to_vector<float>());
  // each part is updated with its own slice of the gradient
  Tensor updated = ws.detach() - *ws.grad() * 0.5;
  EXPECT_EQ(updated.shard_groups(), 2);
  expect_near(updated.to_vector<float>(), (w.detach() - *w.grad() * 0.5).to_vector<float>());
}

// Note [tensor parallel]: a column-parallel Linear, ReLU and a row-parallel Linear: one
// all-reduce forward, none for the weight gradients, one for the input's gradient.
TEST(TensorParallel, LinearPairAllReducesOnce) {
  Tensor::manual_seed(5);
  nn::Sequential one(std::make_unique<nn::Linear>(12, 16), std::make_unique<nn::ReLU>(), std::make_unique<nn::Linear>(16, 4));
  Tensor::manual_seed(5);
  nn::Sequential tp(std::make_unique<nn::Linear>(12, 16), std::make_unique<nn::ReLU>(), std::make_unique<nn::Linear>(16, 4));
  tp.tensor_parallel(kFour);
  auto& l1 = dynamic_cast<nn::Linear&>(tp[0]);
  auto& l2 = dynamic_cast<nn::Linear&>(tp[2]);
  EXPECT_EQ(l1.weight.shard_axis(), 0);
  EXPECT_EQ(l1.bias->shard_axis(), 0);
  EXPECT_EQ(l2.weight.shard_axis(), 1);
  EXPECT_EQ(l2.bias->devices(), l2.weight.devices());
  EXPECT_EQ(l2.bias->shard_axis(), std::nullopt);
  EXPECT_EQ(l1.weight.shards()[1].shape(), (Shape{4, 12}));

  Tensor x = Tensor::from_vector(iota(5 * 12, 0.1f), {5, 12}, {.requires_grad = true});
  Tensor xt = Tensor::from_vector(iota(5 * 12, 0.1f), {5, 12}).to(kFour).requires_grad_(true);
  MultiStats before = multi_stats();
  Tensor y = tp(xt);
  EXPECT_EQ(y.shard_axis(), std::nullopt);
  expect_near(y.to_vector<float>(), one(x).to_vector<float>());
  EXPECT_EQ(stats_since(before).allreduces, 1u);
  EXPECT_EQ(stats_since(before).allgathers, 0u);

  one(x).square().sum().backward();
  tp(xt).square().sum().backward();
  before = multi_stats();
  Tensors grads{*xt.grad()};
  for (Tensor* p : tp.parameters()) grads.push_back(*p->grad());
  Tensor::realize_all(grads);
  EXPECT_EQ(stats_since(before).allreduces, 2u);  // the forward's again (a new graph), and the input gradient's
  EXPECT_EQ(stats_since(before).allgathers, 0u);
  expect_near(xt.grad()->to_vector<float>(), x.grad()->to_vector<float>());
  auto ps = one.parameters(), pt = tp.parameters();
  for (size_t i = 0; i < ps.size(); i++) {
    EXPECT_EQ(pt[i]->grad()->shard_axis(), pt[i]->shard_axis()) << "parameter " << i;
    expect_near(pt[i]->grad()->to_vector<float>(), ps[i]->grad()->to_vector<float>());
  }
}

TEST(TensorParallel, RefusesWidthsThatDoNotSplit) {
  nn::Sequential mlp(std::make_unique<nn::Linear>(12, 10), std::make_unique<nn::ReLU>(), std::make_unique<nn::Linear>(10, 4));
  expect_error([&] { mlp.tensor_parallel(kFour); }, {"4 devices", "layer 0 (Linear)", "out_features=10", "10 % 4 = 2"});
  nn::GPT gpt(nn::GPTConfig{.vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 6, .n_embd = 12});
  expect_error([&] { gpt.tensor_parallel(kFour); }, {"4 devices", "n_head=6", "6 % 4 = 2"});
  for (Tensor* p : gpt.parameters()) EXPECT_EQ(p->device(), "CPU") << "nothing is split before the refusal";
}

// ---- training against the one-device run ----

namespace {

std::unique_ptr<nn::Sequential> make_mlp() {
  return std::make_unique<nn::Sequential>(std::make_unique<nn::Linear>(12, 16), std::make_unique<nn::ReLU>(),
                                          std::make_unique<nn::Linear>(16, 8), std::make_unique<nn::ReLU>(),
                                          std::make_unique<nn::Linear>(8, 4));
}

struct Trained {
  std::vector<std::vector<float>> params;
  MultiStats last_step;
  std::vector<float> losses;
};

// `steps` AdamW steps on one batch; with devices, the model is tensor parallel over them and the
// batch replicated. Returns the parameters (whole) and what the last step's rewrite inserted.
Trained train_mlp(const std::vector<std::string>& devices, int steps) {
  Tensor::manual_seed(7);
  auto m = make_mlp();
  m->tensor_parallel(devices);
  Tensor x = Tensor::from_vector(iota(16 * 12, 0.05f), {16, 12});
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); i++) labels[i] = static_cast<int32_t>((i * 3) % 4);
  Tensor y = Tensor::from_vector(labels, {16});
  if (!devices.empty()) x = x.to(devices), y = y.to(devices);
  nn::AdamW opt(m->parameters(), 1e-2);
  Trained out;
  for (int s = 0; s < steps; s++) {
    MultiStats before = multi_stats();
    opt.zero_grad();
    Tensor loss = (*m)(x).sparse_categorical_crossentropy(y);
    loss.backward();
    opt.step({loss});
    out.last_step = stats_since(before);
  }
  for (Tensor* p : m->parameters()) out.params.push_back(p->to_vector<float>());
  return out;
}

}  // namespace

TEST(TensorParallel, MlpOnFourDevicesMatchesOneDevice) {
  auto single = train_mlp({}, 3);
  auto tp = train_mlp(kFour, 3);
  ASSERT_EQ(single.params.size(), tp.params.size());
  for (size_t i = 0; i < single.params.size(); i++) expect_near(tp.params[i], single.params[i]);
  // the first pair is split, the unpaired last Linear replicated: one all-reduce a step (the
  // pair's forward sum; the input, data, needs no gradient), nothing gathered
  EXPECT_EQ(tp.last_step.allreduces, 1u);
  EXPECT_EQ(tp.last_step.allgathers, 0u);
}

namespace {

nn::GPTConfig tiny_gpt() { return {.vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 4, .n_embd = 16}; }

// Note [a bias without a gradient]: attention's scores are invariant to the key bias (it adds
// q . b_k to a whole row of scores, which the softmax ignores), so its gradient is rounding noise,
// about 1e-12, which differs between the split and the whole computation. AdamW divides by the
// noise's own magnitude plus eps, so at eps 1e-8 it moves the bias by a noisy 1e-5 of lr; at eps
// 1e-6 the noise stays below 1e-7 and the comparison holds every parameter to 1e-5.
Trained train_gpt(const std::vector<std::string>& devices, int steps,
                  std::optional<DType> compute = std::nullopt) {
  Tensor::manual_seed(11);
  nn::GPT gpt(tiny_gpt());
  gpt.set_compute_dtype(compute);
  gpt.tensor_parallel(devices);
  std::vector<int32_t> tokens(4 * 9);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>((i * 5 + i / 3) % 16);
  Tensor all = Tensor::from_vector(tokens, {4, 9});
  Tensor x = all.shrink({{0, 4}, {0, 8}}).contiguous(), y = all.shrink({{0, 4}, {1, 9}}).contiguous();
  if (!devices.empty()) x = x.to(devices), y = y.to(devices);
  nn::AdamW opt(gpt.parameters(), 1e-2, 0.9, 0.999, 1e-6);  // Note [a bias without a gradient]
  Trained out;
  for (int s = 0; s < steps; s++) {
    MultiStats before = multi_stats();
    opt.zero_grad();
    Tensor loss = gpt(x).reshape({-1, 16}).sparse_categorical_crossentropy(y.reshape({-1}));
    loss.backward();
    opt.step({loss});
    out.last_step = stats_since(before);
    out.losses.push_back(loss.item<float>());
  }
  for (Tensor* p : gpt.parameters()) out.params.push_back(p->to_vector<float>());
  return out;
}

}  // namespace

// Note [tensor parallel in GPT]
TEST(TensorParallel, GptSplitsAttentionByHeads) {
  Tensor::manual_seed(11);
  nn::GPT gpt(tiny_gpt());
  gpt.tensor_parallel(kFour);
  auto& block = dynamic_cast<nn::GPTBlock&>(gpt.transformer.h[0]);
  EXPECT_EQ(block.attn.c_attn.weight.shard_axis(), 0);
  EXPECT_EQ(block.attn.c_attn.weight.shard_groups(), 3);
  EXPECT_EQ(block.attn.c_attn.bias->shard_groups(), 3);
  EXPECT_EQ(block.attn.c_proj.weight.shard_axis(), 1);
  EXPECT_EQ(block.mlp.c_fc.weight.shard_axis(), 0);
  EXPECT_EQ(block.mlp.c_proj.weight.shard_axis(), 1);
  for (Tensor* t : {&gpt.transformer.wte.weight, &gpt.transformer.wpe.weight, &*block.ln_1.weight})
    EXPECT_EQ(t->shard_axis(), std::nullopt);
  // device 1 holds head 1 of q, k and v: rows 4..7, 20..23 and 36..39 of c_attn's 48
  Tensor::manual_seed(11);
  nn::GPT one(tiny_gpt());
  auto whole = dynamic_cast<nn::GPTBlock&>(one.transformer.h[0]).attn.c_attn.weight.to_vector<float>();
  std::vector<float> want;
  for (int64_t first : {4, 20, 36}) want.insert(want.end(), whole.begin() + first * 16, whole.begin() + (first + 4) * 16);
  expect_near(block.attn.c_attn.weight.shards()[1].to_vector<float>(), want, 0);
}

TEST(TensorParallel, GptOnFourDevicesMatchesOneDevice) {
  auto single = train_gpt({}, 2);
  auto tp = train_gpt(kFour, 2);
  ASSERT_EQ(single.params.size(), tp.params.size());
  for (size_t i = 0; i < single.params.size(); i++) expect_near(tp.params[i], single.params[i]);
  // per block two forward (attention's and the MLP's row-parallel sums) and two backward (the
  // gradients of the LayerNorms' outputs through c_attn and c_fc); nothing gathered
  EXPECT_EQ(tp.last_step.allreduces, 4u);
  EXPECT_EQ(tp.last_step.allgathers, 0u);
}

// Under a bfloat16 compute dtype c_attn's bias is rounded and added in its product (Note [bias in
// the compute dtype] in nn/layers.cpp), its parts on the devices of their heads: the losses follow
// the one-device run's, within the rounding of the row-parallel sums' bfloat16 parts.
TEST(TensorParallel, GptInBFloat16OnFourDevicesMatchesOneDevice) {
  auto single = train_gpt({}, 3, DType::BFloat16);
  auto tp = train_gpt(kFour, 3, DType::BFloat16);
  ASSERT_EQ(tp.losses.size(), 3u);
  for (size_t s = 0; s < tp.losses.size(); s++)
    EXPECT_NEAR(tp.losses[s], single.losses[s], 2e-2) << "step " << s;
  EXPECT_LT(single.losses[2], single.losses[0]);  // it trains
  EXPECT_EQ(tp.last_step.allreduces, 4u);
}

// A state dict (a checkpoint, one device's values) loads into a tensor parallel model in place:
// each parameter keeps its layout.
TEST(TensorParallel, LoadingAStateDictKeepsTheLayout) {
  Tensor::manual_seed(3);
  nn::GPT one(tiny_gpt());
  Tensor::manual_seed(4);
  nn::GPT gpt(tiny_gpt());
  gpt.tensor_parallel(kFour);
  gpt.load_state_dict(one.state_dict());
  auto& attn = dynamic_cast<nn::GPTBlock&>(gpt.transformer.h[0]).attn;
  EXPECT_EQ(attn.c_attn.weight.shard_groups(), 3);
  EXPECT_EQ(attn.c_proj.weight.shard_axis(), 1);
  auto sd = one.state_dict();
  for (auto& [name, t] : gpt.named_parameters()) expect_near(t->to_vector<float>(), sd.at(name).to_vector<float>(), 0);
}

// ---- the kernels of one device's share ----

namespace {

std::set<const UOp*> kernels_of(const Tensor& out, const std::string& device) {
  std::set<const UOp*> asts;
  ExecRecorder rec = [&](const ExecItem& e) {
    if (e.item.kind == ScheduleItem::Kind::Kernel && e.item.device == device) asts.insert(e.item.ast.get());
  };
  ExecRecorder* prev = set_exec_recorder(&rec);
  Tensor(out).realize();
  set_exec_recorder(prev);
  return asts;
}

}  // namespace

// A column-parallel Linear and its activation on one device are the one-device kernels of a
// Linear of a quarter of the outputs, also where its input is computed (Note [cutting an expand]
// in multi.cpp: the input is computed once, not for every column).
TEST(TensorParallel, OneDevicesKernelsAreTheSingleDeviceKernelsOnItsShare) {
  Tensor x = Tensor::from_vector(iota(8 * 12, 0.1f), {8, 12});
  nn::Linear quarter(12, 16);
  nn::Linear split(12, 64);
  split.shard_columns(kFour, "split");
  for (bool computed : {false, true}) {
    auto input = [&](const Tensor& t) { return computed ? (t * 2 + 1).relu() : t; };
    auto single = kernels_of(quarter(input(x)).relu(), "CPU");
    auto multi = kernels_of(split(input(x.to(kFour))).relu(), "CPU:1");
    EXPECT_EQ(single.size(), computed ? 2u : 1u);
    EXPECT_EQ(multi, single) << (computed ? "computed input" : "input in a buffer");
  }
}

// ---- on two GPUs ----

namespace {

// Tensor parallel on CUDA:0 and CUDA:1: skipped, with the reason, where there are fewer than 2.
class TensorParallelCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    auto built = registered_devices();
    if (std::find(built.begin(), built.end(), "CUDA") == built.end()) GTEST_SKIP() << "this build has no CUDA device";
    int gpus = device_count("CUDA");
    if (gpus < 2) GTEST_SKIP() << "tensor parallel on CUDA:0,CUDA:1 needs 2 CUDA devices, found " << gpus;
  }
};

}  // namespace

TEST_F(TensorParallelCuda, GptOnTwoGpusMatchesTheCpu) {
  auto single = train_gpt({}, 2);
  auto tp = train_gpt({"CUDA:0", "CUDA:1"}, 2);
  ASSERT_EQ(single.params.size(), tp.params.size());
  for (size_t i = 0; i < single.params.size(); i++) expect_near(tp.params[i], single.params[i], 1e-4);
  EXPECT_EQ(tp.last_step.allreduces, 4u);
  // through NCCL where it loads (Note [collectives through a device library] in multi.cpp)
  EXPECT_EQ(tp.last_step.library, tuple_collectives({"CUDA", "CUDA:1"}).library == "NCCL" ? 4u : 0u);
}

TEST_F(TensorParallelCuda, MlpOnTwoGpusMatchesTheCpu) {
  auto single = train_mlp({}, 3);
  auto tp = train_mlp({"CUDA:0", "CUDA:1"}, 3);
  for (size_t i = 0; i < single.params.size(); i++) expect_near(tp.params[i], single.params[i], 1e-4);
  EXPECT_EQ(tp.last_step.allreduces, 1u);
  EXPECT_EQ(tp.last_step.library, tuple_collectives({"CUDA", "CUDA:1"}).library == "NCCL" ? 1u : 0u);
}
