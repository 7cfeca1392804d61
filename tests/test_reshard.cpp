// Checkpoints that move between strategies and world sizes (Note [checkpoints that reshard] in
// launcher/checkpoint.cpp), through `tg train` under mpirun, in three CTest runs that hand their
// run directories on as fixtures:
//  - test_reshard_np2: zero1 and fsdp runs of 2 ranks (6 steps, checkpoints at 3 and 6). The fsdp
//    run's step-3 checkpoint resumed by one process ends within 1e-6 of the run that never
//    stopped; the zero1 one, its layout taken out of the metadata (as zero1 wrote it before it
//    recorded one), resumed by zero1 of 2 ranks ends bit for bit on it; resumed by a model of
//    another size it fails naming the parameters, and by another optimizer naming both, and
//    leaves the run directory as it was but for the error lines in train.log.
//  - test_reshard_np4: the zero1 run's step-3 checkpoint resumed by fsdp of 4 ranks ends within
//    1e-6 of the zero1 run; an fsdp run of 4 ranks.
//  - test_reshard_back_np2: that fsdp run's step-3 checkpoint resumed by zero1 of 2 ranks ends
//    within 1e-6 of it.
// Runs of one process over two virtual CPU devices (tensor parallel, train.devices) reshard too
// (np2: tensor parallel to fsdp of 2 ranks and back, train.devices to zero1 of 2 ranks), and so do
// runs of tensor parallel x ddp (np2: to one process on one device and back). Each
// rank reads only what it keeps (Note [reading what a rank needs]): fsdp of 4 ranks from an fsdp
// checkpoint of 4 reads its own shard file and nothing else, zero1 of 2 about half of fsdp of 4's
// files; a damaged shard is an error on every rank naming the file, whether one rank read the
// damaged tensor whole or two ranks read it in parts; a checkpoint of another model is refused
// before any tensor data is read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "checkpoint_util.h"
#include "distributed/process_group.h"
#include "launcher/observers.h"
#include "launcher/run.h"
#include "launcher/trainer.h"
#include "tinygrad/error.h"

using namespace tg;
using namespace tg::launcher;
using namespace tg::testutil;
namespace fs = std::filesystem;

namespace {

const std::string BASE = std::string(TG_TEST_RUN_DIR) + "/run";
const std::string ZERO1_2 = BASE + "_zero1_2", FSDP2 = BASE + "_fsdp2", FSDP4 = BASE + "_fsdp4";
const std::string TP2 = BASE + "_tp2", DEVICES2 = BASE + "_devices2";

std::string final_checkpoint(const std::string& dir) { return dir + "/checkpoints/step_6.safetensors"; }

void barrier() { dist::world_group()->barrier()->wait(); }

// Rank 0 copies `from` stopped at step 3 to `to`; every rank then resumes it under `strategy`
// (with `extra` settings) and rank 0 returns the largest difference from `from`'s own step 6 (0
// elsewhere). `read`: the bytes of tensor data this rank's run read.
double resume_and_compare(const std::string& from, const std::string& to, const std::string& strategy, uint64_t* read = nullptr,
                          std::vector<std::string> extra = {}) {
  if (dist::env_rank() == 0) copy_until_step(from, to, 3);
  barrier();
  const uint64_t before = nn::safe_bytes_read();
  extra.insert(extra.end(), {"distributed.strategy=" + strategy, "train.resume=true", "train.overwrite=false"});
  TrainSummary s = run_train(short_run_config(to, extra), {.progress = false});
  if (read) *read = nn::safe_bytes_read() - before;
  EXPECT_EQ(s.steps, 6);
  if (dist::env_rank() != 0) return 0;
  return max_rel_diff(model_of(s.last_checkpoint), model_of(final_checkpoint(from)));
}

// One process (the Trainer itself: run_train refuses strategy none in a rank of a job) trains
// `dir` to step 6 with `extra`, resuming it when it has a checkpoint, and returns its parameters.
Params train_one_process(const std::string& dir, std::vector<std::string> extra, bool resume) {
  if (resume) extra.insert(extra.end(), {"train.resume=true", "train.overwrite=false"});
  Trainer tr(short_run_config(dir, extra), dir);
  tr.add_observer(std::make_shared<CheckpointWriter>());
  if (resume) tr.load_checkpoint(dir + "/checkpoints/step_3.safetensors");
  tr.fit();
  return values_of(tr.model().state_dict());
}

// The bytes of tensor data of a safetensors file.
uint64_t data_bytes(const std::string& path) {
  uint64_t n = 0;
  for (auto& [name, info] : nn::safe_header(path)) n += info.end - info.begin;
  return n;
}

// The bytes of tensor data of the step-3 checkpoint of `dir`, its shard files included.
uint64_t checkpoint_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (auto& e : fs::directory_iterator(dir + "/checkpoints"))
    if (e.path().filename().string().rfind("step_3.", 0) == 0) n += data_bytes(e.path().string());
  return n;
}

// Flips one bit in the data of tensor `entry` of safetensors file `path`, at byte `at` of it.
void flip_bit(const std::string& path, const std::string& entry, uint64_t at) {
  nn::SafeTensorInfo info = nn::safe_header(path).at(entry);
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t header = 0;
  for (int i = 7; i >= 0; i--) header = (header << 8) | len[i];
  const auto pos = static_cast<std::streamoff>(8 + header + info.begin + at);
  f.seekg(pos);
  char c = 0;
  f.get(c);
  f.seekp(pos);
  f.put(static_cast<char>(c ^ 0x04));
}

// The error every rank's run_train of `cfg` throws ("" if none).
std::string error_of_run(const Config& cfg) {
  try {
    run_train(cfg, {.progress = false});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = file_text(e.path());
  return out;
}

}  // namespace

TEST(Reshard, SourcesOfTwoRanks) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  for (auto& [dir, strategy] : {std::pair{ZERO1_2, "zero1"}, std::pair{FSDP2, "fsdp"}}) {
    TrainSummary s = run_train(short_run_config(dir, {std::string("distributed.strategy=") + strategy}), {.progress = false});
    EXPECT_EQ(s.steps, 6);
  }
  if (dist::env_rank() != 0) return;
  nn::Metadata meta = nn::safe_metadata(final_checkpoint(ZERO1_2));
  EXPECT_EQ(meta.at("zero1_ranks"), "2");
  EXPECT_EQ(meta.at("zero1_layout"), "1.weight 0 30,784\n1.bias 23520 30\n3.weight 23550 10,30\n3.bias 23850 10\n");
}

TEST(Reshard, FsdpOfTwoRanksResumesOnOneProcess) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  ASSERT_TRUE(fs::exists(final_checkpoint(FSDP2)));
  if (dist::env_rank() == 0) {  // one process: the Trainer itself (run_train refuses strategy none in a rank of a job)
    const std::string one = BASE + "_fsdp2_to_one";
    copy_until_step(FSDP2, one, 3);
    Trainer tr(short_run_config(one, {"train.resume=true", "train.overwrite=false"}), one);
    tr.load_checkpoint(one + "/checkpoints/step_3.safetensors");
    EXPECT_EQ(max_rel_diff(values_of(tr.model().state_dict()), model_of(FSDP2 + "/checkpoints/step_3.safetensors")), 0.0);
    tr.fit();
    double err = max_rel_diff(values_of(tr.model().state_dict()), model_of(final_checkpoint(FSDP2)));
    std::printf("fsdp 2 ranks to step 3, then one process to step 6, vs fsdp 2 ranks throughout: %.3g\n", err);
    EXPECT_LT(err, 1e-6);
    fs::remove_all(one);
  }
  barrier();
}

// Note [zero1 checkpoints]: a zero1 checkpoint without zero1_layout reads its blocks with the
// loading model's parameters as the layout.
TEST(Reshard, Zero1CheckpointWithoutLayoutResumes) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  const std::string old = BASE + "_zero1_2_old";
  if (dist::env_rank() == 0) {
    copy_until_step(ZERO1_2, old, 3);
    const std::string main = old + "/checkpoints/step_3.safetensors";
    nn::Metadata meta = nn::safe_metadata(main);
    ASSERT_EQ(meta.erase("zero1_layout"), 1u);
    nn::safe_save(nn::safe_load(main), main, meta);
  }
  barrier();
  TrainSummary s = run_train(short_run_config(old, {"distributed.strategy=zero1", "train.resume=true", "train.overwrite=false"}),
                             {.progress = false});
  EXPECT_EQ(s.steps, 6);
  if (dist::env_rank() == 0) {
    EXPECT_EQ(max_rel_diff(model_of(s.last_checkpoint), model_of(final_checkpoint(ZERO1_2))), 0.0);
    fs::remove_all(old);
  }
  barrier();
}

TEST(Reshard, AnotherModelIsNamedAndNothingIsWritten) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  const std::string dir = BASE + "_zero1_2_other_model";
  if (dist::env_rank() == 0) copy_until_step(ZERO1_2, dir, 3);
  barrier();
  std::map<std::string, std::string> before = files_of(dir);
  const uint64_t read_before = nn::safe_bytes_read();
  std::string what;
  try {
    run_train(short_run_config(dir, {"distributed.strategy=fsdp", "model.hidden=[40]", "train.resume=true", "train.overwrite=false"}),
              {.progress = false});
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("step_3.safetensors' does not fit this model"), std::string::npos) << what;
  EXPECT_NE(what.find("parameter '1.weight' is [30,784] in the checkpoint, [40,784] in this model"), std::string::npos) << what;
  EXPECT_NE(what.find("parameter '3.weight' is [10,30] in the checkpoint, [10,40] in this model"), std::string::npos) << what;
  EXPECT_EQ(nn::safe_bytes_read(), read_before) << "refused before any tensor data is read";
  what.clear();
  try {
    run_train(short_run_config(dir, {"distributed.strategy=zero1", "optim.name=sgd", "train.resume=true", "train.overwrite=false"}),
              {.progress = false});
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("holds the state of optimizer Adam, this run's is SGD"), std::string::npos) << what;
  barrier();
  if (dist::env_rank() == 0) {
    std::map<std::string, std::string> after = files_of(dir);
    ASSERT_EQ(after.size(), before.size()) << "no file was added or removed";
    for (auto& [name, text] : before)
      if (name == "train.log") EXPECT_EQ(after[name].rfind(text, 0), 0u) << "train.log only gains the errors";
      else EXPECT_EQ(after[name], text) << name << " changed";
    fs::remove_all(dir);
  }
  barrier();
}

// Note [checkpoints that reshard]: tensor parallel over 2 devices on each of 2 ranks (ddp) to one
// process on one device, and one process to tensor parallel x ddp.
TEST(Reshard, TensorParallelOverRanksReshards) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  const std::vector<std::string> tp_ddp{"model.tensor_parallel=2"};
  const std::string TP2_DDP = BASE + "_tp2_ddp2", ONE = BASE + "_one";
  TrainSummary s = run_train(short_run_config(TP2_DDP, {"distributed.strategy=ddp", "model.tensor_parallel=2"}), {.progress = false});
  EXPECT_EQ(s.steps, 6);
  if (dist::env_rank() == 0) train_one_process(ONE, {"train.overwrite=true"}, false);
  barrier();
  double err = resume_and_compare(ONE, BASE + "_one_to_tp2_ddp2", "ddp", nullptr, tp_ddp);
  if (dist::env_rank() == 0) {
    std::printf("one process to step 3, then tensor parallel 2 x ddp 2 ranks, vs one process throughout: %.3g\n", err);
    EXPECT_LT(err, 1e-6);
    const std::string back = BASE + "_tp2_ddp2_to_one";
    copy_until_step(TP2_DDP, back, 3);
    double err_back = max_rel_diff(train_one_process(back, {}, true), model_of(final_checkpoint(TP2_DDP)));
    std::printf("tensor parallel 2 x ddp 2 ranks to step 3, then one process, vs tensor parallel x ddp throughout: %.3g\n",
                err_back);
    EXPECT_LT(err_back, 1e-6);
  }
  barrier();
}

// Note [checkpoints that reshard]: tensor parallel over 2 devices to fsdp of 2 ranks, fsdp of 2
// ranks to tensor parallel, train.devices=2 to zero1 of 2 ranks.
TEST(Reshard, TensorParallelAndDevicesReshardAcrossRanks) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_np2";
  if (dist::env_rank() == 0) {
    train_one_process(TP2, {"model.tensor_parallel=2", "train.overwrite=true"}, false);
    train_one_process(DEVICES2, {"train.devices=2", "train.overwrite=true"}, false);
  }
  barrier();
  double err = resume_and_compare(TP2, BASE + "_tp2_to_fsdp2", "fsdp");
  double err_devices = resume_and_compare(DEVICES2, BASE + "_devices2_to_zero1_2", "zero1");
  if (dist::env_rank() == 0) {
    std::printf("tensor parallel 2 to step 3, then fsdp 2 ranks, vs tensor parallel throughout: %.3g\n", err);
    std::printf("train.devices=2 to step 3, then zero1 2 ranks, vs train.devices=2 throughout: %.3g\n", err_devices);
    EXPECT_LT(err, 1e-6);
    EXPECT_LT(err_devices, 1e-6);
    const std::string back = BASE + "_fsdp2_to_tp2";
    copy_until_step(FSDP2, back, 3);
    double err_back = max_rel_diff(train_one_process(back, {"model.tensor_parallel=2"}, true), model_of(final_checkpoint(FSDP2)));
    std::printf("fsdp 2 ranks to step 3, then tensor parallel 2, vs fsdp 2 ranks throughout: %.3g\n", err_back);
    EXPECT_LT(err_back, 1e-6);
  }
  barrier();
}

TEST(Reshard, Zero1OfTwoRanksResumesUnderFsdpOfFour) {
  if (dist::env_world_size() != 4) GTEST_SKIP() << "test_reshard_np4";
  ASSERT_TRUE(fs::exists(final_checkpoint(ZERO1_2))) << "run test_reshard_np2 first (a CTest fixture)";
  double err = resume_and_compare(ZERO1_2, BASE + "_zero1_2_to_fsdp4", "fsdp");
  if (dist::env_rank() == 0) {
    std::printf("zero1 2 ranks to step 3, then fsdp 4 ranks to step 6, vs zero1 2 ranks throughout: %.3g\n", err);
    EXPECT_LT(err, 1e-6);
  }
  TrainSummary s = run_train(short_run_config(FSDP4, {"distributed.strategy=fsdp"}), {.progress = false});
  EXPECT_EQ(s.steps, 6);
}

// Note [reading what a rank needs]: fsdp of 4 ranks resuming an fsdp checkpoint of 4 ranks reads
// its own shard file and nothing else (the main file holds no tensor of this model); a bit
// flipped in rank 2's file is an error on every rank naming it.
TEST(Reshard, FsdpOfFourReadsItsOwnShardOnly) {
  if (dist::env_world_size() != 4) GTEST_SKIP() << "test_reshard_np4";
  const std::string dir = BASE + "_fsdp4_again", damaged = BASE + "_fsdp4_damaged";
  const std::string shard2 = damaged + "/checkpoints/step_3.fsdp-rank2.safetensors";
  if (dist::env_rank() == 0) {
    copy_until_step(FSDP4, dir, 3);
    copy_until_step(FSDP4, damaged, 3);
    flip_bit(shard2, "optim.0.exp_avg", 100);
  }
  barrier();
  const std::string mine = shard_path(dir + "/checkpoints/step_3.safetensors", dist::env_rank(), "fsdp");
  const uint64_t before = nn::safe_bytes_read(), total = checkpoint_bytes(dir);
  run_train(short_run_config(dir, {"distributed.strategy=fsdp", "train.resume=true", "train.overwrite=false"}), {.progress = false});
  const uint64_t read = nn::safe_bytes_read() - before;
  std::printf("rank %d read %llu of the checkpoint's %llu bytes (%.3f)\n", dist::env_rank(),
              static_cast<unsigned long long>(read), static_cast<unsigned long long>(total), double(read) / double(total));
  EXPECT_EQ(read, data_bytes(mine)) << "as much as its own shard file holds (the step count comes from rank 0's)";
  EXPECT_LT(read, total / 3);
  std::string what = error_of_run(short_run_config(damaged, {"distributed.strategy=fsdp", "train.resume=true", "train.overwrite=false"}));
  EXPECT_NE(what.find("safetensors file '" + shard2 + "': tensor 'optim.0.exp_avg' is damaged"), std::string::npos) << what;
  barrier();
  if (dist::env_rank() == 0)
    for (const auto& d : {dir, damaged}) fs::remove_all(d);
  barrier();
}

TEST(Reshard, FsdpOfFourRanksResumesUnderZero1OfTwo) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "test_reshard_back_np2";
  ASSERT_TRUE(fs::exists(final_checkpoint(FSDP4))) << "run test_reshard_np4 first (a CTest fixture)";
  // a bit flipped in a tensor that both ranks read in parts: the parts' checksums do not join
  const std::string damaged = BASE + "_fsdp4_damaged_to_zero1_2";
  const std::string shard1 = damaged + "/checkpoints/step_3.fsdp-rank1.safetensors";
  if (dist::env_rank() == 0) {
    copy_until_step(FSDP4, damaged, 3);
    flip_bit(shard1, "optim.0.exp_avg_sq", 4);
  }
  barrier();
  std::string what = error_of_run(short_run_config(damaged, {"distributed.strategy=zero1", "train.resume=true", "train.overwrite=false"}));
  EXPECT_NE(what.find("safetensors file '" + shard1 + "': tensor 'optim.0.exp_avg_sq' is damaged"), std::string::npos) << what;
  uint64_t read = 0;
  double err = resume_and_compare(FSDP4, BASE + "_fsdp4_to_zero1_2", "zero1", &read);
  const uint64_t total = checkpoint_bytes(FSDP4);
  std::printf("rank %d read %llu of the checkpoint's %llu bytes (%.3f)\n", dist::env_rank(),
              static_cast<unsigned long long>(read), static_cast<unsigned long long>(total), double(read) / double(total));
  EXPECT_LT(read, total * 7 / 10) << "about two thirds: the parameters whole, half of their optimizer state";
  if (dist::env_rank() == 0) {
    std::printf("fsdp 4 ranks to step 3, then zero1 2 ranks to step 6, vs fsdp 4 ranks throughout: %.3g\n", err);
    EXPECT_LT(err, 1e-6);
    fs::remove_all(TG_TEST_RUN_DIR);
  }
  barrier();
}
