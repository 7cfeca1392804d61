// `tg train` with distributed.strategy=fsdp under mpirun. With 4 ranks (test_fsdp_train_np4): an
// fsdp run ends with the parameters of a ddp run within 1e-5 and writes one file per rank plus the
// metadata file (world size, layout; no parameters in it), and every gather at the top of the step
// (distributed.fsdp_gathers=top) trains the same parameters. With 2 ranks (test_fsdp_resume_np2,
// after np4): the step-3 checkpoint of the 4-rank fsdp run resumes under 2-rank ddp, and on one
// process, and both end at step 6 with the 4-rank run's parameters within 1e-5; the same
// checkpoint loaded without training gives back the parameters the shards hold; with one rank's
// file missing it is passed over as incomplete.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint_util.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "launcher/config.h"
#include "launcher/run.h"
#include "launcher/trainer.h"
#include "tinygrad/nn/state.h"

using namespace tg;
using namespace tg::launcher;
using namespace tg::testutil;
namespace fs = std::filesystem;

namespace {

// Shared by the 4-rank test and the 2-rank one that resumes its checkpoint.
const std::string BASE = std::string(TG_TEST_RUN_DIR) + "/run";

Config config(const std::string& dir, std::vector<std::string> extra) { return short_run_config(dir, std::move(extra)); }

// A copy of run directory `from` that ends at the step-3 checkpoint (a run stopped there).
void copy_until_step3(const std::string& from, const std::string& to) { copy_until_step(from, to, 3); }

const std::string FSDP4 = BASE + "_fsdp4";

}  // namespace

TEST(FsdpTrain, EqualsDdpAndWritesOneFilePerRank) {
  const int world = dist::env_world_size();
  if (world != 4) GTEST_SKIP() << "the 4-rank run (test_fsdp_train_np4)";
  TrainSummary f = run_train(config(FSDP4, {"distributed.strategy=fsdp"}), {.progress = false});
  TrainSummary d = run_train(config(BASE + "_ddp4", {"distributed.strategy=ddp"}), {.progress = false});
  EXPECT_EQ(f.steps, 6);
  EXPECT_EQ(f.skipped_steps, 0);
  for (int r = 0; r < world; r++) EXPECT_TRUE(fs::exists(FSDP4 + "/checkpoints/step_3.fsdp-rank" + std::to_string(r) + ".safetensors"));
  if (dist::env_rank() != 0) return;
  nn::Metadata meta = nn::safe_metadata(f.last_checkpoint);
  EXPECT_EQ(meta.at("fsdp_ranks"), "4");
  EXPECT_EQ(meta.at("fsdp_layout"), "1.weight 8 30,784\n1.bias 8 30\n3.weight 3 10,30\n3.bias 3 10\n");
  EXPECT_TRUE(nn::safe_load(f.last_checkpoint).empty()) << "the metadata file holds no parameter (the mlp has no buffers)";
  double err = max_rel_diff(model_of(f.last_checkpoint), model_of(d.last_checkpoint));
  std::printf("tg train fsdp vs ddp (world 4): max |a-b| / (|b| + 0.01) %.3g\n", err);
  EXPECT_LT(err, 1e-5);
}

// distributed.fsdp_gathers=top (every gather at the top of the step, kept to its end) trains the
// same parameters as the default (resharded: gathered a unit ahead, again for backward).
TEST(FsdpTrain, GathersAtTheTopTrainTheSame) {
  if (dist::env_world_size() != 4) GTEST_SKIP() << "the 4-rank run (test_fsdp_train_np4)";
  const std::string resharded = FSDP4 + "/checkpoints/step_6.safetensors";
  if (!fs::exists(resharded)) GTEST_SKIP() << "needs EqualsDdpAndWritesOneFilePerRank's run";
  TrainSummary f = run_train(config(BASE + "_fsdp4_top", {"distributed.strategy=fsdp", "distributed.fsdp_gathers=top",
                                                          "train.checkpoint_every=0"}),
                             {.progress = false});
  if (dist::env_rank() != 0) return;
  EXPECT_EQ(max_rel_diff(model_of(f.last_checkpoint), model_of(resharded)), 0.0);
}

TEST(FsdpTrain, CheckpointOfFourFsdpRanksResumesUnderTwoDdpRanksAndOneProcess) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "the 2-rank resume (test_fsdp_resume_np2)";
  const std::string ckpt4 = FSDP4 + "/checkpoints/step_6.safetensors";
  ASSERT_TRUE(fs::exists(ckpt4)) << "run test_fsdp_train_np4 first (a CTest fixture)";
  const std::string ddp2 = BASE + "_resumed_ddp2", one = BASE + "_resumed_one";
  if (dist::env_rank() == 0) copy_until_step3(FSDP4, ddp2);
  auto group = dist::world_group();
  group->barrier()->wait();
  TrainSummary s = run_train(config(ddp2, {"distributed.strategy=ddp", "train.resume=true", "train.overwrite=false"}),
                             {.progress = false});
  EXPECT_EQ(s.steps, 6);
  if (dist::env_rank() != 0) {
    group->barrier()->wait();
    return;
  }
  Params want = model_of(ckpt4);
  double err = max_rel_diff(model_of(s.last_checkpoint), want);
  std::printf("fsdp 4 ranks to step 3, then ddp 2 ranks to step 6, vs fsdp 4 ranks throughout: %.3g\n", err);
  EXPECT_LT(err, 1e-5);
  // a checkpoint with a rank's file missing is not complete
  const std::string damaged = BASE + "_damaged";
  copy_until_step3(FSDP4, damaged);
  fs::remove(damaged + "/checkpoints/step_3.fsdp-rank2.safetensors");
  std::vector<std::string> passed_over;
  EXPECT_EQ(latest_checkpoint(damaged, &passed_over), "");
  ASSERT_EQ(passed_over.size(), 1u);
  EXPECT_NE(passed_over[0].find("the fsdp shard of rank 2 of 4"), std::string::npos) << passed_over[0];
  // one process: the Trainer itself (run_train refuses strategy none in a rank of a job)
  copy_until_step3(FSDP4, one);
  {
    Config c = config(one, {"train.resume=true", "train.overwrite=false"});
    Trainer tr(c, one);
    tr.load_checkpoint(one + "/checkpoints/step_3.safetensors");
    EXPECT_EQ(tr.step(), 3);
    EXPECT_EQ(max_rel_diff(values_of(tr.model().state_dict()), model_of(FSDP4 + "/checkpoints/step_3.safetensors")), 0.0);
    tr.fit();
    double err1 = max_rel_diff(values_of(tr.model().state_dict()), want);
    std::printf("fsdp 4 ranks to step 3, then one process to step 6, vs fsdp 4 ranks throughout: %.3g\n", err1);
    EXPECT_LT(err1, 1e-5);
  }
  for (const std::string& dir : {FSDP4, BASE + "_ddp4", ddp2, one, damaged}) fs::remove_all(dir);
  group->barrier()->wait();
}
