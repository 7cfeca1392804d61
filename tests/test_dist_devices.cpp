// Several devices per rank: `tg train` with train.devices=2 and distributed.strategy=ddp under
// mpirun (2 ranks, each over two virtual CPU devices). The MLP (and a tiny char GPT) ends within
// 1e-5 of one process on one device with the same global batch, every device and rank holding the
// same parameters, with the step captured and replayed by TinyJit; each step runs the in-process
// collectives of a one-rank run over the same devices (and no all-gather) plus one all-reduce
// across the ranks per bucket, as with one device per rank; train.grad_accum splits each
// micro-batch over the devices; zero1, fsdp and batches that do not split are refused, naming
// both settings; the GPUs of a node are divided among its ranks (Note [a rank's devices]), and a
// node with too few is refused naming both numbers. The CudaDevicesPerRank tests (label gpu) need
// four GPUs for 2 ranks and are skipped with fewer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "distributed/data_parallel.h"
#include "distributed/host_exchange.h"
#include "distributed/process_group.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "test_util.h"
#include "tests/launcher_models.h"
#include "tests/trainer_runs.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/tokens.h"

using namespace tg;
using namespace tg::launcher;
using namespace tg::testutil;
namespace fs = std::filesystem;

namespace {

const std::string BASE = "/tmp/tg_test_dist_devices_" + std::to_string(dist::env_world_size());

std::string refusal(std::vector<std::string> extra) { return refusal_of(BASE + "_refused", std::move(extra)); }

}  // namespace

TEST(DevicesPerRank, TwoDevicesPerRankEqualOneProcessOnOneDevice) {
  const std::string ref = BASE + "_ref" + std::to_string(dist::env_rank());
  Trained d = train(mlp(BASE + "_ddp_devices", {"distributed.strategy=ddp", "train.devices=2", "distributed.bucket_mb=0.05"}),
                    true);
  Trained r = train(mlp(ref, {}), false);
  EXPECT_EQ(d.summary.steps, 6);
  EXPECT_EQ(d.summary.skipped_steps, 0);
  EXPECT_EQ(d.disabled_reason, "");
  EXPECT_EQ(d.captures, 1);
  EXPECT_EQ(d.replays, 4);
  EXPECT_EQ(per_step(d, 3, 5).rank_collectives, 2u);  // replayed steps run CollectivesPerStep's collectives
  for (auto& devices : d.devices) EXPECT_EQ(devices, (std::vector<std::string>{"CPU", "CPU:1"}));
  expect_same_everywhere(d);
  const double worst = worst_relative(d.params(), r.params());
  if (dist::env_rank() == 0)
    std::printf("ddp over %d ranks x 2 devices vs one process: max relative difference %.3g\n", dist::env_world_size(), worst);
  EXPECT_LT(worst, 1e-5);
  fs::remove_all(ref);
}

// Note [gradients over a rank's devices]: a step over 2 devices per rank runs the in-process
// collectives of one process over those devices (one all-reduce per gradient and one for the
// loss, no all-gather: the batch is split, never gathered), and across the ranks what one device
// per rank runs: one all-reduce per bucket (bucket_mb=0.05 makes two; the skip check needs none,
// Note [one decision from the reduced gradients]). Each comes back from the first device as one
// copy to the second. The counts are taken without the JIT (a replay rewrites nothing; its rank
// collectives are counted above).
TEST(DevicesPerRank, CollectivesPerStep) {
  testutil::KnobScope no_jit(knobs::JIT, 0);
  const std::string one_dir = BASE + "_count_one" + std::to_string(dist::env_rank());
  Trained one = train(mlp(one_dir, {"train.devices=2"}), false);
  Trained ranks = train(mlp(BASE + "_count_ranks", {"distributed.strategy=ddp", "distributed.bucket_mb=0.05"}), true);
  Trained both = train(mlp(BASE + "_count_both", {"distributed.strategy=ddp", "distributed.bucket_mb=0.05", "train.devices=2"}),
                       true);
  StepCounts o = per_step(one, 1, 5), r = per_step(ranks, 1, 5), b = per_step(both, 1, 5);
  EXPECT_EQ(o.rank_collectives, 0u);
  EXPECT_EQ(r.rank_collectives, 2u);
  EXPECT_EQ(b.rank_collectives, 2u);
  EXPECT_EQ(o.multi.allreduces, 5u);  // 2 weights, 2 biases, the loss
  EXPECT_EQ(b.multi.allreduces, o.multi.allreduces);
  EXPECT_EQ(b.multi.allgathers, 0u);
  EXPECT_EQ(b.multi.copies, o.multi.copies + 2);
  fs::remove_all(one_dir);
}

// Note [gradient accumulation] with devices: each micro-batch is split over the devices (no
// all-gather) and the result still equals one process on one device.
TEST(DevicesPerRank, AccumulatedMicroBatchesSplitOverTheDevices) {
  const std::string ref = BASE + "_accum_ref" + std::to_string(dist::env_rank());
  Trained d = train(mlp(BASE + "_accum", {"distributed.strategy=ddp", "train.devices=2", "train.grad_accum=2"}), true);
  Trained r = train(mlp(ref, {}), false);
  EXPECT_EQ(d.replays, 4);
  EXPECT_EQ(per_step(d, 1, 2).multi.allgathers, 0u);
  expect_same_everywhere(d);
  EXPECT_LT(worst_relative(d.params(), r.params()), 1e-5);
  fs::remove_all(ref);
}

// The char GPT of configs/gpt_char.yaml, made tiny: token embeddings (gathers at a split index)
// and attention over two devices per rank, against one process on one device.
TEST(DevicesPerRank, CharGptEqualsOneProcess) {
  if (!fs::exists(nn::DEFAULT_TEXT_FILE)) GTEST_SKIP() << nn::DEFAULT_TEXT_FILE << " not found (install jargon-text)";
  const std::string ref = BASE + "_gpt_ref" + std::to_string(dist::env_rank());
  Trained d = train(tiny_gpt(BASE + "_gpt", {"distributed.strategy=ddp", "train.devices=2"}), true);
  Trained r = train(tiny_gpt(ref, {}), false);
  EXPECT_EQ(d.summary.steps, 2);
  expect_same_everywhere(d);
  const double worst = worst_relative(d.params(), r.params());
  if (dist::env_rank() == 0) std::printf("char GPT, ddp x 2 devices vs one process: max relative difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
  fs::remove_all(ref);
}

TEST(DevicesPerRank, ShardingStrategiesAndUnevenBatchesAreRefused) {
  EXPECT_HAS(refusal({"distributed.strategy=zero1", "train.devices=2"}),
             "config: distributed.strategy=zero1 with train.devices=2 is not supported: zero1 shards the optimizer state");
  EXPECT_HAS(refusal({"distributed.strategy=fsdp", "train.devices=2"}),
             "config: distributed.strategy=fsdp with train.devices=2 is not supported: fsdp shards the parameters");
  const int world = dist::env_world_size();
  EXPECT_HAS(refusal({"distributed.strategy=ddp", "train.devices=3"}),
             "config: data.batch_size 32 (" + std::to_string(32 / world) + " examples per rank and micro-batch, over " +
                 std::to_string(world) + " rank(s) and train.grad_accum=1) does not split over the 3 devices of train.devices");
  EXPECT_HAS(refusal({"distributed.strategy=ddp", "train.devices=2", "train.grad_accum=" + std::to_string(32 / world)}),
             "(1 examples per rank and micro-batch");
}

// Note [a rank's devices]
TEST(DevicesPerRank, GpusAreDividedAmongTheRanksOfANode) {
  using dist::LocalRanks;
  using dist::rank_devices;
  EXPECT_EQ(rank_devices("CUDA", 2, LocalRanks{0, 2}, 4), (std::vector<std::string>{"CUDA", "CUDA:1"}));
  EXPECT_EQ(rank_devices("CUDA", 2, LocalRanks{1, 2}, 4), (std::vector<std::string>{"CUDA:2", "CUDA:3"}));
  EXPECT_EQ(rank_devices("CUDA", 3, LocalRanks{1, 2}, 8), (std::vector<std::string>{"CUDA:3", "CUDA:4", "CUDA:5"}));
  // the CPU's devices are each process's own
  EXPECT_EQ(rank_devices("CPU", 2, LocalRanks{1, 2}, 1), (std::vector<std::string>{"CPU", "CPU:1"}));
  EXPECT_EQ(testutil::error_of([] { rank_devices("CUDA", 2, LocalRanks{1, 2}, 3); }),
            "2 devices per rank: 2 rank(s) on this node need 4 CUDA devices; this node has 3");
  // the trainer's devices follow the launcher's local rank
  Config c = mlp(BASE + "_unused", {"distributed.strategy=ddp", "train.devices=2"});
  EXPECT_EQ(train_devices(c, true), (std::vector<std::string>{"CPU", "CPU:1"}));
  EXPECT_EQ(group_device(c), "CPU");
  c.set("train.devices", std::string("[CPU:2, CPU:3]"));  // a list is taken as given
  EXPECT_EQ(train_devices(c, true), (std::vector<std::string>{"CPU:2", "CPU:3"}));
  EXPECT_EQ(group_device(c), "CPU:2");
  c.set("train.devices", std::string("1"));
  EXPECT_TRUE(train_devices(c, true).empty());
}

// The same run over GPUs (label gpu): 2 ranks x 2 GPUs, nccl between the ranks, against one
// process on one GPU.
TEST(CudaDevicesPerRank, TwoGpusPerRankEqualOneGpu) {
  const int need = 2 * dist::env_local_ranks().size;
  if (device_count("CUDA") < need)
    GTEST_SKIP() << "devices per rank skipped: needs " << need << " CUDA devices (2 per rank), this machine has " << device_count("CUDA");
  const std::string ref = BASE + "_cuda_ref" + std::to_string(dist::env_rank());
  Trained d = train(mlp(BASE + "_cuda", {"train.device=CUDA", "distributed.strategy=ddp", "train.devices=2"}), true);
  Trained r = train(mlp(ref, {"train.device=CUDA"}), false);
  EXPECT_EQ(d.replays, 4);
  expect_same_everywhere(d);
  EXPECT_LT(worst_relative(d.params(), r.params()), 1e-5);
  fs::remove_all(ref);
}
