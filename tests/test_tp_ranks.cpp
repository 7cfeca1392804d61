// Tensor parallel x data parallel: `tg train` with model.tensor_parallel=2 and
// distributed.strategy=ddp under mpirun (2 ranks, each splitting the model over two virtual CPU
// devices; Note [split gradients across the ranks] in distributed/data_parallel.cpp). The MLP,
// clipped, and a tiny char GPT end within 1e-5 of one process on one device with the same global
// batch, their split parameters still split, every rank holding the same values and the reported
// gradient norms those of one process, with the step captured and replayed by TinyJit. Each step
// runs one all-reduce across the ranks per device for each bucket of split gradients and one for
// each bucket of replicated ones (not one per parameter), and no all-gather between the devices
// beyond what tensor parallel in one process runs. zero1, fsdp and train.devices together with
// model.tensor_parallel are refused, naming both settings. CudaTensorParallelRanks (label gpu)
// runs the MLP over 2 ranks x 2 GPUs and is skipped with fewer than 4 GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "distributed/process_group.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "test_util.h"
#include "tests/launcher_models.h"
#include "tests/trainer_runs.h"
#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/tokens.h"

using namespace tg;
using namespace tg::launcher;
using namespace tg::testutil;
namespace fs = std::filesystem;

namespace {

const std::string BASE = "/tmp/tg_test_tp_ranks_" + std::to_string(dist::env_world_size());
const std::vector<std::string> TP_DDP = {"distributed.strategy=ddp", "model.tensor_parallel=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Largest relative difference of two runs' reported gradient norms (the same count of them).
double worst_norm(const Trained& a, const Trained& b) {
  EXPECT_EQ(a.grad_norms.size(), b.grad_norms.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.grad_norms.size(), b.grad_norms.size()); i++)
    worst = std::max(worst, std::abs(a.grad_norms[i] - b.grad_norms[i]) / std::abs(b.grad_norms[i]));
  return worst;
}

size_t split_parameters(const Trained& t) {
  return static_cast<size_t>(std::count_if(t.axes.begin(), t.axes.end(), [](auto& a) { return a.has_value(); }));
}

std::string refusal(std::vector<std::string> extra) { return refusal_of(BASE + "_refused", std::move(extra)); }

}  // namespace

// The MLP 784-32-10: fc1's weight and bias split by rows (column-parallel), fc2's weight by
// columns (row-parallel), fc2's bias replicated. Clipping at 0.5 is active (the norms are
// larger), so the global norm must count each device's part of a split gradient once.
TEST(TensorParallelRanks, MlpEqualsOneProcessOnOneDevice) {
  const std::string ref = BASE + "_ref" + std::to_string(dist::env_rank());
  Trained d = train(mlp(BASE + "_mlp", TP_DDP), true);
  Trained r = train(mlp(ref, {}), false);
  EXPECT_EQ(d.summary.steps, 6);
  EXPECT_EQ(d.summary.skipped_steps, 0);
  EXPECT_EQ(d.disabled_reason, "");
  EXPECT_EQ(d.captures, 1);
  EXPECT_EQ(d.replays, 4);
  for (auto& devices : d.devices) EXPECT_EQ(devices, (std::vector<std::string>{"CPU", "CPU:1"}));
  EXPECT_EQ(split_parameters(d), 3u);
  expect_same_everywhere(d);
  const double worst = worst_relative(d.whole, r.whole), norms = worst_norm(d, r);
  if (dist::env_rank() == 0)
    std::printf("tensor parallel 2 x ddp over %d ranks vs one process: max relative difference %.3g (grad norms %.3g)\n",
                dist::env_world_size(), worst, norms);
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(norms, 1e-5);
  ASSERT_FALSE(r.grad_norms.empty());
  EXPECT_GT(r.grad_norms[0], 0.5) << "clipping must take part in the comparison";
  fs::remove_all(ref);
}

// Note [split gradients across the ranks]: the default bucket size makes one bucket of the three
// split gradients and one of the replicated bias; the split one is one all-reduce per device,
// so a step runs 2 + 1 (the skip check needs none: Note [one decision from the reduced
// gradients]). With bucket_mb=0.05, fc1's weight (100 KB) is a bucket alone: 2 x 2 + 1.
// Between the devices, the step runs what tensor parallel in one process runs (nothing of a
// split bucket is gathered or copied) but for the copy back of the replicated sum (Note
// [collectives of a tensor over several devices]). Counted without the JIT (a replay rewrites
// nothing).
TEST(TensorParallelRanks, OneAllReducePerDeviceAndBucket) {
  testutil::KnobScope no_jit(knobs::JIT, 0);
  const std::string one_dir = BASE + "_count_one" + std::to_string(dist::env_rank());
  Trained one = train(mlp(one_dir, {"model.tensor_parallel=2"}), false);
  Trained big = train(mlp(BASE + "_count_big", TP_DDP), true);
  Trained small = train(mlp(BASE + "_count_small", with(TP_DDP, {"distributed.bucket_mb=0.05"})), true);
  StepCounts o = per_step(one, 1, 5), b = per_step(big, 1, 5), s = per_step(small, 1, 5);
  EXPECT_EQ(o.rank_collectives, 0u);
  EXPECT_EQ(b.rank_collectives, 3u);
  EXPECT_EQ(s.rank_collectives, 5u);
  for (const StepCounts& r : {b, s}) {
    EXPECT_EQ(r.multi.allreduces, o.multi.allreduces);
    EXPECT_EQ(r.multi.allgathers, o.multi.allgathers);
    EXPECT_EQ(r.multi.copies, o.multi.copies + 1);  // the replicated bucket's sum, to CPU:1
  }
  fs::remove_all(one_dir);
}

// Attention split by heads (c_attn in 3 groups), the embeddings and LayerNorms replicated.
TEST(TensorParallelRanks, CharGptEqualsOneProcess) {
  if (!fs::exists(nn::DEFAULT_TEXT_FILE)) GTEST_SKIP() << nn::DEFAULT_TEXT_FILE << " not found (install jargon-text)";
  const std::string ref = BASE + "_gpt_ref" + std::to_string(dist::env_rank());
  Trained d = train(tiny_gpt(BASE + "_gpt", TP_DDP), true);
  Trained r = train(tiny_gpt(ref, {}), false);
  EXPECT_EQ(d.summary.steps, 2);
  EXPECT_GT(split_parameters(d), 0u);
  expect_same_everywhere(d);
  const double worst = worst_relative(d.whole, r.whole);
  if (dist::env_rank() == 0)
    std::printf("char GPT, tensor parallel 2 x ddp vs one process: max relative difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(worst_norm(d, r), 1e-5);
  fs::remove_all(ref);
}

TEST(TensorParallelRanks, ShardingStrategiesAndMeshesAreRefused) {
  EXPECT_HAS(refusal({"distributed.strategy=zero1", "model.tensor_parallel=2"}),
             "config: model.tensor_parallel=2 with distributed.strategy=zero1 is not supported: zero1 shards the "
             "optimizer state over the ranks");
  EXPECT_HAS(refusal({"distributed.strategy=fsdp", "model.tensor_parallel=2"}),
             "config: model.tensor_parallel=2 with distributed.strategy=fsdp is not supported: fsdp shards the parameters");
  EXPECT_HAS(refusal({"distributed.strategy=ddp", "model.tensor_parallel=2", "train.devices=2"}),
             "config: model.tensor_parallel=2 with train.devices='2' is not supported");
  // the rank's devices: the group runs on the first of them
  Config c = mlp(BASE + "_unused", TP_DDP);
  EXPECT_EQ(tensor_parallel_devices(c, true), (std::vector<std::string>{"CPU", "CPU:1"}));
  EXPECT_EQ(group_device(c), "CPU");
}

// The same over GPUs (label gpu): 2 ranks x 2 GPUs (local rank l takes CUDA:2l and CUDA:2l+1),
// nccl between the ranks, against one process on one GPU.
TEST(CudaTensorParallelRanks, TwoGpusPerRankEqualOneGpu) {
  const int need = 2 * dist::env_local_ranks().size;
  if (device_count("CUDA") < need)
    GTEST_SKIP() << "tensor parallel over ranks skipped: needs " << need << " CUDA devices (2 per rank), this machine has "
                 << device_count("CUDA");
  const std::string ref = BASE + "_cuda_ref" + std::to_string(dist::env_rank());
  Trained d = train(mlp(BASE + "_cuda", with(TP_DDP, {"train.device=CUDA"})), true);
  Trained r = train(mlp(ref, {"train.device=CUDA"}), false);
  EXPECT_EQ(d.replays, 4);
  EXPECT_EQ(split_parameters(d), 3u);
  expect_same_everywhere(d);
  EXPECT_LT(worst_relative(d.whole, r.whole), 1e-5);
  EXPECT_LT(worst_norm(d, r), 1e-5);
  fs::remove_all(ref);
}
