// Collectives between the GPUs of one process through NCCL (Note [NCCL between the GPUs of a
// process] in tinygrad/runtime/cuda_nccl.cpp), label gpu. On one GPU: an all-reduce, all-gather
// and reduce-scatter over the one-device tuple {CUDA}, run normally and replayed by TinyJit as a
// CUDA graph with the NCCL call inside. On two GPUs (skipped with "needs 2 CUDA devices, found N"
// elsewhere): sharded all-reduces, all-gathers and reduce-scatters against the host, each one
// grouped NCCL call; data parallel over train.devices [CUDA:0, CUDA:1] through the Trainer within
// 1e-5 of one GPU; and the same steps with MULTI_LIBRARY=0 (copy and add kernels) for comparison.
// Tensor parallel over two GPUs is test_tp_cuda (tests/test_tp.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/trainer.h"
#include "tests/launcher_models.h"
#include "tests/multi_util.h"
#include "tests/test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/tensor.h"

using namespace tg;
using testutil::cuda_devices;
using testutil::expect_near;
using testutil::iota;
using testutil::KnobScope;
using testutil::stats_since;
namespace fs = std::filesystem;

namespace {

// Why a test needing `need` GPUs with NCCL between them cannot run here ("needs 2 CUDA devices,
// found 1"), or "" when it can.
std::string skip_reason(int need) {
  const int found = cuda_devices();
  if (found < need)
    return "needs " + std::to_string(need) + " CUDA device" + (need > 1 ? "s" : "") + ", found " + std::to_string(found);
  std::vector<std::string> tuple;
  for (int i = 0; i < need; i++) tuple.push_back(i == 0 ? "CUDA" : "CUDA:" + std::to_string(i));
  TupleCollectives c = tuple_collectives(tuple);
  if (c.library != "NCCL") return "NCCL is not used between " + join_devices(tuple) + ": " + c.describe();
  return "";
}

class NcclOneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = skip_reason(1); !why.empty()) GTEST_SKIP() << why;
  }
};

class NcclTwoGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << why;
  }
};

const std::vector<std::string> kTwo = {"CUDA", "CUDA:1"};

// Device 0's result of `kind` over the one-device tuple {CUDA}.
Tensor one_device(Op kind, const Tensor& x) {
  const CollectiveArg arg{Op::ADD, tuple_collectives({"CUDA"}).group, 1};
  return Tensor(make_device_collective(kind, {x.uop()}, arg, 0));
}

}  // namespace

// ---- one GPU: the tuple {CUDA} ----

TEST_F(NcclOneGpu, CollectivesOverOneDeviceKeepTheValues) {
  Tensor x = Tensor::from_vector(iota(1000), {1000}).to("CUDA");
  const uint64_t before = GlobalCounters::get().collectives;
  for (Op kind : {Op::ALLREDUCE, Op::ALLGATHER, Op::REDUCE_SCATTER})
    expect_near(one_device(kind, x * 2).to_vector<float>(), (x * 2).to_vector<float>(), 0);
  EXPECT_EQ(GlobalCounters::get().collectives - before, 3u);
}

// A replayed step on one GPU is one CUDA graph with the NCCL call inside (instantiated anew when
// the addresses change, never updated: Note [CUDA graphs for replays]).
TEST_F(NcclOneGpu, ReplaysAsAGraphWithTheCallInside) {
  TinyJit step([](const Tensors& in) { return Tensors{one_device(Op::ALLREDUCE, in[0] * 2) + 1}; });
  for (int s = 0; s < 5; s++) {
    Tensor x = Tensor::from_vector(iota(4096, float(s + 1)), {4096}).to("CUDA");
    x.realize();
    Tensor want = x * 2 + 1;
    expect_near(step({x})[0].to_vector<float>(), want.to_vector<float>(), 0);
  }
  EXPECT_EQ(step.replays(), 3);
  EXPECT_EQ(step.disabled_reason(), "");
}

// ---- two GPUs ----

TEST_F(NcclTwoGpus, AllReduceMatchesTheHost) {
  for (int64_t rows : {8, 4096}) {  // a direct exchange and a ring with the kernels: one call with NCCL
    Tensor whole = Tensor::from_vector(iota(rows * 96, 0.01f), {rows, 96});
    MultiStats before = multi_stats();
    Tensor sharded = whole.shard(kTwo, 0);
    Tensor sum = sharded.sum(0), top = sharded.max(0);
    for (const Tensor& p : sum.shards()) expect_near(p.to_vector<float>(), whole.sum(0).to_vector<float>());
    for (const Tensor& p : top.shards()) expect_near(p.to_vector<float>(), whole.max(0).to_vector<float>(), 0);
    MultiStats s = stats_since(before);
    EXPECT_EQ(s.allreduces, 2u);
    EXPECT_EQ(s.library, 2u);
    EXPECT_EQ(s.copies, 0u);
  }
}

TEST_F(NcclTwoGpus, AllGatherMatchesTheHost) {
  Tensor whole = Tensor::from_vector(iota(4 * 8 * 6), {4, 8, 6});
  for (int64_t axis : {0, 1, 2}) {
    MultiStats before = multi_stats();
    Tensor flipped = whole.shard(kTwo, axis).flip({axis});
    for (const Tensor& p : flipped.shards()) expect_near(p.to_vector<float>(), whole.flip({axis}).to_vector<float>(), 0);
    EXPECT_EQ(stats_since(before).library, 1u) << "axis " << axis;
  }
  Tensor grouped = whole.shard(kTwo, 1, 2);  // Note [grouped splits]
  for (const Tensor& p : grouped.flip({1}).shards()) expect_near(p.to_vector<float>(), whole.flip({1}).to_vector<float>(), 0);
}

// A reduction's result sharded again over the two GPUs is one reduce-scatter; so is a node built
// from the devices' operands directly.
TEST_F(NcclTwoGpus, ReduceScatterMatchesTheHost) {
  Tensor whole = Tensor::from_vector(iota(64 * 1024, 0.01f), {64, 1024});
  MultiStats before = multi_stats();
  Tensors sharded = whole.shard(kTwo, 0).sum(0).shard(kTwo, 0).shards();
  EXPECT_EQ(stats_since(before).reduce_scatters, 1u);
  for (size_t k = 0; k < 2; k++)
    expect_near(sharded[k].to_vector<float>(), whole.sum(0).shrink({{512 * int64_t(k), 512 * int64_t(k + 1)}}).to_vector<float>());

  std::vector<UOpPtr> parts;
  Tensor want = Tensor::zeros({4096});
  for (size_t k = 0; k < 2; k++) {
    Tensor part = Tensor::from_vector(iota(4096, float(k + 1)), {4096});
    want = want + part;
    parts.push_back(part.to(kTwo[k]).uop());
  }
  const CollectiveArg arg{Op::ADD, tuple_collectives(kTwo).group, 2};
  std::vector<UOpPtr> blocks;
  for (size_t k = 0; k < 2; k++) blocks.push_back(make_device_collective(Op::REDUCE_SCATTER, parts, arg, k));
  Tensor scattered(make_multi(blocks, 0));
  expect_near(scattered.to_vector<float>(), want.to_vector<float>());
}

namespace {

const std::string BASE = "/tmp/tg_test_multi_cuda";

// The MLP on the synthetic images through a Trainer (TinyJit steps), over `devices` (train.devices)
// or on one GPU; each parameter's value on the first device and on every device.
struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> on_device;
  int64_t replays = 0;
  uint64_t library = 0;
};

Trained train(const std::string& name, const std::string& devices) {
  const std::string dir = BASE + "_" + name;
  fs::create_directories(dir);
  std::vector<std::string> o = {"model.name=test_mlp", "data.name=test_synth", "data.batch_size=16", "train.steps=6",
                                "train.log_every=2", "train.eval_every=1000", "optim.name=sgd", "optim.momentum=0.9",
                                "optim.lr=0.05", "train.device=CUDA", "train.overwrite=true", "train.run_dir=" + dir};
  if (!devices.empty()) o.push_back("train.devices=" + devices);
  launcher::Config cfg = launcher::parse_config("", "synth.yaml", o);
  MultiStats before = multi_stats();
  launcher::Trainer tr(cfg, dir, nullptr);
  tr.fit();
  Trained t;
  t.replays = tr.jit().replays();
  t.library = stats_since(before).library;
  for (Tensor* p : tr.model().parameters()) {
    std::vector<std::vector<float>> parts;
    for (const Tensor& s : p->shards()) parts.push_back(s.to_vector<float>());
    t.params.push_back(parts[0]);
    t.on_device.push_back(std::move(parts));
  }
  fs::remove_all(dir);
  return t;
}

}  // namespace

// train.devices over CUDA:0 and CUDA:1 (its gradients all-reduced by NCCL) ends within 1e-5 of
// one GPU, every device holding the same parameters; so does the kernels' path.
TEST_F(NcclTwoGpus, DataParallelOverTrainDevicesMatchesOneGpu) {
  Trained one = train("one", "");
  Trained two = train("two", "[CUDA, CUDA:1]");
  EXPECT_GT(two.library, 0u);
  EXPECT_EQ(two.replays, 4);
  ASSERT_EQ(one.params.size(), two.params.size());
  for (size_t i = 0; i < one.params.size(); i++) {
    expect_near(two.params[i], one.params[i], 1e-5);
    for (auto& part : two.on_device[i]) EXPECT_EQ(part, two.on_device[i][0]) << "parameter " << i;
  }
  KnobScope off(knobs::MULTI_LIBRARY, 0);
  Trained kernels = train("kernels", "[CUDA, CUDA:1]");
  EXPECT_EQ(kernels.library, 0u);
  for (size_t i = 0; i < one.params.size(); i++) expect_near(kernels.params[i], one.params[i], 1e-5);
}
