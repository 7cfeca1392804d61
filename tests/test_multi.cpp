// Tensors over several devices of one process, on virtual CPU devices: shard and replication,
// the rewrite into per-device graphs (ops, reductions with all-reduce, movement ops, gradients),
// its errors, and data-parallel training of an MLP against the single-device run.
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

}  // namespace

TEST(VirtualCpu, DevicesHaveTheirOwnPools) {
  EXPECT_EQ(canonical_device("CPU:0"), "CPU");
  EXPECT_EQ(&get_device("CPU:0"), &get_device("CPU"));
  EXPECT_NE(&get_device("CPU:1"), &get_device("CPU"));
  size_t before = get_device("CPU:2").pool().stats().bytes_in_use;
  Tensor a = Tensor::from_vector(iota(1000), {1000}, {.device = "CPU:2"});
  EXPECT_EQ(a.device(), "CPU:2");
  EXPECT_GE(get_device("CPU:2").pool().stats().bytes_in_use, before + 4000);
  Tensor b = (a * 2 + 1).to("CPU:3");
  EXPECT_EQ(b.device(), "CPU:3");
  std::vector<float> want = iota(1000);
  for (auto& x : want) x = x * 2 + 1;
  expect_near(b.to_vector<float>(), want);
}

TEST(Multi, ShardSplitsAlongTheAxis) {
  Tensor x = Tensor::from_vector(iota(24), {8, 3});
  Tensor s = x.shard(kFour, 0);
  EXPECT_EQ(s.shape(), (Shape{8, 3}));
  EXPECT_EQ(s.devices(), (std::vector<std::string>{"CPU", "CPU:1", "CPU:2", "CPU:3"}));
  EXPECT_EQ(s.shard_axis(), 0);
  Tensors parts = s.shards();
  ASSERT_EQ(parts.size(), 4u);
  std::vector<float> all = iota(24);
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(parts[i].shape(), (Shape{2, 3}));
    EXPECT_EQ(parts[i].device(), s.devices()[i]);
    expect_near(parts[i].to_vector<float>(), std::vector<float>(all.begin() + 6 * i, all.begin() + 6 * (i + 1)));
  }
  expect_near(s.to_vector<float>(), all);
  Tensor target = Tensor::zeros({8, 3}).shard(kFour, 0);
  target.assign(x.shard(kFour, 0));  // holds the parts' buffers, not the copies that made them
  ASSERT_EQ(target.uop()->op, Op::MULTI);
  for (auto& part : target.uop()->src) EXPECT_EQ(part->op, Op::BUFFER);
  expect_near(target.to_vector<float>(), all);
  Tensor r = x.to(kFour);
  EXPECT_EQ(r.shard_axis(), std::nullopt);
  for (auto& part : r.shards()) expect_near(part.to_vector<float>(), all);
}

TEST(Multi, ElementwiseMixesShardedAndReplicated) {
  Tensor x = Tensor::from_vector(iota(24), {4, 6});
  Tensor y = Tensor::from_vector(iota(6, 0.5f), {6});
  Tensor want = (x * y + 1).exp2();
  Tensor got = (x.shard(kFour, 0) * y.to(kFour) + 1).exp2();
  EXPECT_EQ(got.shard_axis(), 0);
  MultiStats before = multi_stats();
  expect_near(got.to_vector<float>(), want.to_vector<float>());
  EXPECT_EQ(stats_since(before).allreduces, 0u);
}

TEST(Multi, ReductionsOverTheShardedAxisAllReduce) {
  Tensor x = Tensor::from_vector(iota(48), {8, 6});
  Tensor s = x.shard(kFour, 0);
  Tensor rows = s.sum(1);  // per device
  EXPECT_EQ(rows.shard_axis(), 0);
  expect_near(rows.to_vector<float>(), x.sum(1).to_vector<float>());
  MultiStats before = multi_stats();
  Tensor cols = s.max(0);
  EXPECT_EQ(cols.shard_axis(), std::nullopt);
  Tensors parts = cols.shards();  // realizes
  EXPECT_EQ(stats_since(before).allreduces, 1u);
  EXPECT_EQ(stats_since(before).copies, 12u);  // direct exchange: each of 4 devices reads 3 parts
  for (auto& part : parts) expect_near(part.to_vector<float>(), x.max(0).to_vector<float>());
  expect_near(s.mean().to_vector<float>(), x.mean().to_vector<float>());
}

TEST(Multi, LargeAllReducesGoAroundARing) {
  tg::testutil::KnobScope ring(knobs::RING_ALLREDUCE, 16);
  Tensor x = Tensor::from_vector(iota(8 * 32), {8, 32});
  Tensor s = x.shard(kFour, 0);
  MultiStats before = multi_stats();
  Tensor sums = s.sum(0);  // 32 elements: a ring of four chunks of 8
  Tensors parts = sums.shards();
  EXPECT_EQ(stats_since(before).allreduces, 1u);
  EXPECT_EQ(stats_since(before).copies, 24u);  // 3 steps of 4 chunks in each of the two phases
  for (auto& part : parts) {
    expect_near(part.to_vector<float>(), x.sum(0).to_vector<float>());
    EXPECT_EQ(part.to_vector<float>(), parts[0].to_vector<float>());  // every chunk is summed once
  }
  before = multi_stats();
  Tensor small = s.sum(1).sum(0);  // one element, below the knob: a direct exchange
  expect_near(small.to_vector<float>(), x.sum().to_vector<float>());
  EXPECT_EQ(stats_since(before).copies, 12u);
}

TEST(Multi, MovementOpsFollowTheShardedAxis) {
  Tensor x = Tensor::from_vector(iota(96), {8, 3, 4});
  Tensor s = x.shard(kFour, 0);
  EXPECT_EQ(s.permute({2, 0, 1}).shard_axis(), 1);
  EXPECT_EQ(s.reshape({8, 12}).shard_axis(), 0);
  EXPECT_EQ(s.reshape({1, 8, 12}).shard_axis(), 1);
  EXPECT_EQ(s.unsqueeze(1).expand({8, 5, 3, 4}).shard_axis(), 0);
  expect_near(s.permute({2, 0, 1}).contiguous().to_vector<float>(), x.permute({2, 0, 1}).contiguous().to_vector<float>());
  expect_near(s.pad({{0, 0}, {1, 2}, {0, 0}}).to_vector<float>(), x.pad({{0, 0}, {1, 2}, {0, 0}}).to_vector<float>());
  // ops that need the whole of the sharded axis gather it first
  MultiStats before = multi_stats();
  Tensor shifted = s.shrink({{1, 7}, {0, 3}, {0, 4}});
  expect_near(shifted.to_vector<float>(), x.shrink({{1, 7}, {0, 3}, {0, 4}}).to_vector<float>());
  EXPECT_GE(stats_since(before).allgathers, 1u);
  expect_near(s.flip({0}).to_vector<float>(), x.flip({0}).to_vector<float>());
}

TEST(Multi, MatmulWithAShardedBatchAndItsGradients) {
  Tensor x = Tensor::from_vector(iota(40, 0.1f), {8, 5});
  Tensor w = Tensor::from_vector(iota(15, 0.2f), {5, 3}, {.requires_grad = true});
  Tensor wm = Tensor::from_vector(iota(15, 0.2f), {5, 3}, {.requires_grad = true});
  wm.shard_(kFour);
  EXPECT_TRUE(wm.requires_grad());
  Tensor xs = x.shard(kFour, 0);
  Tensor y = xs.matmul(wm);
  EXPECT_EQ(y.shard_axis(), 0);
  expect_near(y.to_vector<float>(), x.matmul(w).to_vector<float>());
  (x.matmul(w).relu().square().mean()).backward();
  (xs.matmul(wm).relu().square().mean()).backward();
  ASSERT_TRUE(wm.grad());
  EXPECT_EQ(wm.grad()->device(), wm.device());
  EXPECT_EQ(wm.grad()->shard_axis(), std::nullopt);
  for (auto& part : wm.grad()->shards()) expect_near(part.to_vector<float>(), w.grad()->to_vector<float>());
}

// A GATHER of a tensor split as its index is (cross-entropy's logits split by rows, read at each
// row's target) reads each device's part: no all-gather, and the loss and its gradient are those
// of one device.
TEST(Multi, CrossEntropyOfRowSplitLogitsGathersNothing) {
  Tensor logits = Tensor::from_vector(iota(8 * 5, 0.37f), {8, 5}, {.requires_grad = true});
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 4, 2, 1, 3, 3, 0, 2}, {8});
  Tensor split = Tensor::from_vector(iota(8 * 5, 0.37f), {8, 5}, {.requires_grad = true});
  split.shard_(kFour, 0);
  MultiStats before = multi_stats();
  Tensor loss = split.sparse_categorical_crossentropy(labels.shard(kFour, 0));
  loss.backward();
  Tensor::realize_all({loss, *split.grad()});
  EXPECT_EQ(stats_since(before).allgathers, 0u);
  Tensor want = logits.sparse_categorical_crossentropy(labels);
  want.backward();
  expect_near(loss.to_vector<float>(), want.to_vector<float>());
  expect_near(split.grad()->to_vector<float>(), logits.grad()->to_vector<float>());
}

TEST(Multi, GradientsFlowBackThroughShard) {
  Tensor x = Tensor::from_vector(iota(24, 0.3f), {8, 3}, {.requires_grad = true});
  (x.shard(kFour, 0).square().sum()).backward();
  ASSERT_TRUE(x.grad());
  EXPECT_EQ(x.grad()->device(), "CPU");
  std::vector<float> want = iota(24, 0.3f);
  for (auto& v : want) v *= 2;
  expect_near(x.grad()->to_vector<float>(), want);
}

TEST(Multi, DevicesOfDifferentBackends) {
  auto built = registered_devices();
  if (std::find(built.begin(), built.end(), "CL") == built.end()) GTEST_SKIP() << "this build has no OpenCL device";
  try {
    get_device("CL");
  } catch (const Error& e) {
    GTEST_SKIP() << "no OpenCL device here: " << e.what();
  }
  Tensor x = Tensor::from_vector(iota(24), {4, 6});
  Tensor s = x.shard({"CL", "CPU:1"}, 0);
  EXPECT_EQ(s.shards()[0].device(), "CL");
  expect_near((s * 2).sum(0).to_vector<float>(), (x * 2).sum(0).to_vector<float>());
}

TEST(Multi, Errors) {
  Tensor x = Tensor::from_vector(iota(30), {10, 3});
  expect_error([&] { x.shard(kFour, 0); }, {"axis 0 of size 10", "4 devices", "10 % 4 = 2"});
  expect_error([&] { x.shard({"CPU:1", "CPU:1"}, 1); }, {"CPU:1", "twice"});
  Tensor a = Tensor::from_vector(iota(16), {4, 4});
  expect_error([&] { (a.shard(kFour, 0) + a.shard(kFour, 1)).realize(); }, {"sharded along different axes", "0", "1"});
  expect_error([&] { (a.shard(kFour, 0) + a).realize(); }, {"different devices"});
}

// ---- data parallel over devices ----

namespace {

struct Mlp {
  nn::Linear l1{12, 16}, l2{16, 4};
  Tensor forward(const Tensor& x) { return l2.forward(l1.forward(x).relu()); }
  std::vector<Tensor*> params() { return {&l1.weight, &*l1.bias, &l2.weight, &*l2.bias}; }
};

Tensor batch_inputs(int64_t n) { return Tensor::from_vector(iota(n * 12, 0.05f), {n, 12}); }
Tensor batch_labels(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[static_cast<size_t>(i)] = static_cast<int32_t>((i * 3) % 4);
  return Tensor::from_vector(v, {n});
}

// Trains `steps` SGD steps on one batch; with devices, the batch is sharded and the parameters
// replicated over them. Returns the parameters (device 0's copy) and the collectives per step.
std::vector<std::vector<float>> train(const std::vector<std::string>& devices, int steps, uint64_t* allreduces) {
  Tensor::manual_seed(7);
  Mlp m;
  auto params = m.params();
  Tensor x = batch_inputs(16), y = batch_labels(16);
  if (!devices.empty()) {
    for (Tensor* p : params) p->shard_(devices);
    x = x.shard(devices, 0);
    y = y.shard(devices, 0);
  }
  nn::SGD opt(params, 0.1, 0.9);
  for (int s = 0; s < steps; s++) {
    MultiStats before = multi_stats();
    opt.zero_grad();
    Tensor loss = m.forward(x).sparse_categorical_crossentropy(y);
    loss.backward();
    opt.step();
    if (allreduces) *allreduces = stats_since(before).allreduces;
  }
  std::vector<std::vector<float>> out;
  for (Tensor* p : params) out.push_back(p->shards()[0].to_vector<float>());
  if (!devices.empty())
    for (Tensor* p : params) {  // every device holds the same parameters, bit for bit
      Tensors parts = p->shards();
      for (auto& part : parts) EXPECT_EQ(part.to_vector<float>(), parts[0].to_vector<float>());
    }
  return out;
}

}  // namespace

TEST(DataParallel, MlpOnFourDevicesMatchesOneDevice) {
  uint64_t allreduces = 0;
  auto single = train({}, 3, nullptr);
  auto multi = train(kFour, 3, &allreduces);
  ASSERT_EQ(single.size(), multi.size());
  for (size_t i = 0; i < single.size(); i++) expect_near(multi[i], single[i]);
  // one per parameter gradient: the step realizes the parameters, not the loss (whose mean over
  // the batch would be a fifth)
  EXPECT_EQ(allreduces, 4u);
}

TEST(DataParallel, OneDevicesKernelsAreTheSingleDeviceKernelsOnItsShare) {
  Tensor::manual_seed(3);
  Mlp m;
  Tensor x = batch_inputs(16);
  auto kernels_of = [](const Tensor& out, const std::string& device) {
    std::set<const UOp*> asts;
    ExecRecorder rec = [&](const ExecItem& e) {
      if (e.item.kind == ScheduleItem::Kind::Kernel && e.item.device == device) asts.insert(e.item.ast.get());
    };
    ExecRecorder* prev = set_exec_recorder(&rec);
    Tensor(out).realize();
    set_exec_recorder(prev);
    return asts;
  };
  Tensor quarter = x.shrink({{4, 8}, {0, 12}}).contiguous().realize();
  auto single = kernels_of(m.forward(quarter), "CPU");
  for (Tensor* p : m.params()) p->shard_(kFour);
  auto multi = kernels_of(m.forward(x.shard(kFour, 0)), "CPU:1");
  EXPECT_FALSE(single.empty());
  EXPECT_EQ(multi, single);
}

namespace {

// A few AdamW steps of a tiny GPT on one batch of tokens; with devices, the batch is sharded and
// the parameters replicated. Returns every parameter (device 0's copy).
std::vector<std::vector<float>> train_gpt(const std::vector<std::string>& devices, uint64_t* allreduces) {
  Tensor::manual_seed(11);
  nn::GPT gpt(nn::GPTConfig{.vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8});
  auto params = gpt.parameters();
  std::vector<int32_t> tokens(4 * 9);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>((i * 5 + i / 3) % 16);
  Tensor all = Tensor::from_vector(tokens, {4, 9});
  Tensor x = all.shrink({{0, 4}, {0, 8}}).contiguous(), y = all.shrink({{0, 4}, {1, 9}}).contiguous();
  if (!devices.empty()) {
    for (Tensor* p : params) p->shard_(devices);
    x = x.shard(devices, 0);
    y = y.shard(devices, 0);
  }
  nn::AdamW opt(params, 1e-2);
  for (int s = 0; s < 2; s++) {
    MultiStats before = multi_stats();
    opt.zero_grad();
    Tensor logits = gpt.forward(x);
    logits.reshape({-1, 16}).sparse_categorical_crossentropy(y.reshape({-1})).backward();
    opt.step();
    if (allreduces) *allreduces = stats_since(before).allreduces;
  }
  std::vector<std::vector<float>> out;
  for (Tensor* p : params) out.push_back(p->shards()[0].to_vector<float>());
  return out;
}

}  // namespace

TEST(DataParallel, GptOnFourDevicesMatchesOneDevice) {
  uint64_t allreduces = 0;
  auto single = train_gpt({}, nullptr);
  auto multi = train_gpt(kFour, &allreduces);
  ASSERT_EQ(single.size(), multi.size());
  for (size_t i = 0; i < single.size(); i++) expect_near(multi[i], single[i]);
  // one per gradient of the 16 parameters, and a second for the token embedding, which the output
  // projection shares: its gradient is the sum of the projection's (a product reduced over the
  // batch) and the embedding's (a scatter-add along the positions of the sharded batch), each
  // all-reduced on its own
  EXPECT_EQ(single.size(), 16u);
  EXPECT_EQ(allreduces, 17u);
}
