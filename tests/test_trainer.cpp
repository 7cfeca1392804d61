// Unit tests of the trainer on tiny synthetic runs: its checkpoints (contents, metadata, keeping
// the newest) and resume, passing over damaged checkpoints, bf16 precision, and data- and
// tensor-parallel training over virtual CPU devices matching the one-device run. The launcher's
// config, command line and registries are test_launcher.cpp's; a run's records test_run_record.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/run.h"
#include "launcher/trainer.h"
#include "tests/launcher_models.h"
#include "tests/run_util.h"
#include "tests/test_util.h"
#include "tinygrad/error.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/state.h"
#include "tinygrad/nn/tokens.h"

namespace fs = std::filesystem;
using namespace tg;
using namespace tg::launcher;
using testutil::error_of;

namespace {

fs::path temp_dir(const std::string& name) { return testutil::fresh_run_dir("trainer", name); }

// a's overrides followed by b's.
std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The (step, loss) of each train record in run_dir's metrics.jsonl.
std::vector<std::pair<int64_t, double>> train_losses(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& r : testutil::metrics_records(run_dir, "train"))
    out.emplace_back(r["step"].get<int64_t>(), r["loss"].get<double>());
  return out;
}

}  // namespace

// The trainer on a tiny synthetic dataset: records, checkpoints (contents and metadata), resume.
TEST(LauncherTrainer, RecordsCheckpointsAndResumes) {
  fs::path dir = temp_dir("trainer"), copy = temp_dir("trainer_resume");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=9",
                                "train.checkpoint_every=3", "train.log_every=1", "optim.lr=0.05",
                                "train.run_dir=" + dir.string()};
  TrainSummary s = run_train(parse_config("", "synth.yaml", o), {.progress = false});
  EXPECT_EQ(s.steps, 9);
  ASSERT_TRUE(s.accuracy.has_value());
  for (const char* f : {"config.yaml", "metrics.jsonl", "train.log", "checkpoints/step_3.safetensors",
                        "checkpoints/step_6.safetensors", "checkpoints/step_9.safetensors"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  auto losses = train_losses(dir);
  ASSERT_EQ(losses.size(), 9u);
  EXPECT_EQ(losses.front().first, 1);
  // 6 batches per epoch: evaluated at the epoch end (step 6) and at the end (step 9).
  std::ifstream in(dir / "metrics.jsonl");
  int evals = 0;
  for (std::string line; std::getline(in, line);) evals += line.find("\"eval_accuracy\"") != std::string::npos;
  EXPECT_EQ(evals, 2);

  std::string ckpt = (dir / "checkpoints" / "step_9.safetensors").string();
  auto meta = nn::safe_metadata(ckpt);
  EXPECT_EQ(meta.at("step"), "9");
  EXPECT_EQ(meta.at("epoch"), "2");  // Note [epoch numbers]: step 9 of 6 a epoch is in epoch 2
  EXPECT_EQ(meta.at("batches_done_in_epoch"), "3");
  auto header = nn::safe_header(ckpt);
  for (const char* k : {"model.fc.weight", "model.fc.bias", "optim.step", "optim.0.exp_avg", "optim.1.exp_avg_sq"})
    EXPECT_TRUE(header.count(k)) << k;

  // Resume from step 3 in a copy without the later checkpoints: the same losses from step 4 on.
  fs::copy(dir, copy, fs::copy_options::recursive);
  fs::remove(copy / "checkpoints" / "step_6.safetensors");
  fs::remove(copy / "checkpoints" / "step_9.safetensors");
  o.back() = "train.run_dir=" + copy.string();
  o.push_back("train.resume=true");
  TrainSummary r = run_train(parse_config("", "synth.yaml", o), {.progress = false});
  EXPECT_EQ(r.steps, 9);
  EXPECT_EQ(train_losses(copy), losses);
  EXPECT_EQ(r.accuracy, s.accuracy);

  // A checkpoint of another batch size cannot be resumed; init_weights takes a checkpoint.
  auto bad = o;
  bad.push_back("data.batch_size=4");
  EXPECT_NE(error_of([&] { run_train(parse_config("", "synth.yaml", bad), {.progress = false}); }).find("batch_size"),
            std::string::npos);
  fs::path init = temp_dir("trainer_init");
  std::vector<std::string> i = {"model.name=test_tiny", "data.name=test_synth", "train.steps=1", "optim.lr=0",
                                "train.run_dir=" + init.string(), "train.init_weights=" + ckpt};
  EXPECT_EQ(run_train(parse_config("", "synth.yaml", i), {.progress = false}).accuracy, s.accuracy);
  for (const auto& p : {dir, copy, init}) fs::remove_all(p);
}

// Checkpoint metadata is parsed strictly: batch_size "12x8" used to be read as 12.
TEST(LauncherTrainer, CheckpointMetadataNumbersAreStrict) {
  fs::path dir = temp_dir("strict_meta");
  fs::create_directories(dir / "checkpoints");
  std::string p = (dir / "checkpoints" / "step_3.safetensors").string();
  nn::safe_save({{"model.fc.weight", Tensor::zeros({3, 4})}}, p,
                {{"format", "tg-checkpoint-1"}, {"step", "3"}, {"batch_size", "8x1"}});
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=9",
                                "train.run_dir=" + dir.string(), "train.resume=true"};
  EXPECT_EQ(error_of([&] { run_train(parse_config("", "synth.yaml", o), {.progress = false}); }),
            "checkpoint '" + p + "': metadata batch_size=\"8x1\" is not a non-negative integer");
  fs::remove_all(dir);
}

// train.keep_checkpoints=N keeps the newest N complete checkpoints, zero1 shards going with theirs.
TEST(LauncherTrainer, KeepCheckpointsDeletesTheOlderOnes) {
  fs::path dir = temp_dir("keep"), ck = dir / "checkpoints";
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=4",
                                "train.checkpoint_every=2", "train.run_dir=" + dir.string()};
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  auto names = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(ck)) out.insert(e.path().filename().string());
    return out;
  };
  EXPECT_EQ(names(), (std::set<std::string>{"step_2.safetensors", "step_4.safetensors"}));
  std::ofstream(ck / "step_2.zero1-rank0.safetensors") << "a shard";
  std::ofstream(ck / "step_99.safetensors") << "damaged, newer than the run";
  o[3] = "train.steps=8";
  o.push_back("train.resume=true");
  o.push_back("train.keep_checkpoints=2");
  run_train(parse_config("", "synth.yaml", o), {.progress = false});
  EXPECT_EQ(names(), (std::set<std::string>{"step_6.safetensors", "step_8.safetensors", "step_99.safetensors"}));
  fs::remove_all(dir);
}

TEST(LauncherRunDir, LatestCompleteCheckpoint) {
  fs::path dir = temp_dir("ckpt");
  fs::create_directories(dir / "checkpoints");
  EXPECT_EQ(latest_checkpoint(dir.string()), "");
  for (int s : {5, 10})
    nn::safe_save({{"model.w", Tensor::ones({2})}}, (dir / "checkpoints" / ("step_" + std::to_string(s) + ".safetensors")).string(),
                  {{"format", "tg-checkpoint-1"}, {"step", std::to_string(s)}});
  std::ofstream(dir / "checkpoints" / "step_20.safetensors") << "truncated garbage";
  std::ofstream(dir / "checkpoints" / "step_30.safetensors.tmp") << "partial";
  EXPECT_EQ(latest_checkpoint(dir.string()), (dir / "checkpoints" / "step_10.safetensors").string());
  fs::remove_all(dir);
}

// Resume used to take a checkpoint with flipped bits in its data, and a file named
// step_<20 digits>.safetensors stopped it with a bare "error: stoll".
TEST(LauncherRunDir, ResumePassesOverDamagedCheckpointsAndSaysWhy) {
  fs::path dir = temp_dir("ckpt_damaged"), ck = dir / "checkpoints";
  fs::create_directories(ck);
  auto save = [&](const std::string& name, int64_t step, nn::Metadata extra = {}) {
    extra["format"] = "tg-checkpoint-1";
    extra["step"] = std::to_string(step);
    nn::safe_save({{"model.w", Tensor::ones({4})}}, (ck / name).string(), extra);
    return (ck / name).string();
  };
  auto flip_last_byte = [](const std::string& p) {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x10));
  };
  std::string good = save("step_5.safetensors", 5);
  std::string flipped = save("step_10.safetensors", 10);
  flip_last_byte(flipped);
  // zero1: rank 1's shard missing at step 12; rank 0's shard damaged at step 14
  std::string no_shard = save("step_12.safetensors", 12, {{"zero1_ranks", "2"}});
  save("step_12.zero1-rank0.safetensors", 12);
  std::string bad_shard = save("step_14.safetensors", 14, {{"zero1_ranks", "2"}});
  save("step_14.zero1-rank1.safetensors", 14);
  flip_last_byte(save("step_14.zero1-rank0.safetensors", 14));
  std::string wrong_step = save("step_16.safetensors", 15);
  std::string bad_int = save("step_18.safetensors", 18, {{"zero1_ranks", "2x"}});
  std::string huge = (ck / "step_99999999999999999999.safetensors").string();
  save("step_99999999999999999999.safetensors", 1);

  std::vector<std::string> why;
  EXPECT_EQ(latest_checkpoint(dir.string(), &why), good);
  std::string all;
  for (const auto& w : why) all += w + "\n";
  ASSERT_EQ(why.size(), 6u) << all;
  EXPECT_EQ(why[0], huge + ": '99999999999999999999' is not a valid step number (more than 2^63-1); not a checkpoint of tg train");
  EXPECT_EQ(why[1], bad_int + ": checkpoint '" + bad_int + "': metadata zero1_ranks=\"2x\" is not a non-negative integer");
  EXPECT_EQ(why[2], wrong_step + ": its metadata says step 15");
  EXPECT_NE(why[3].find(bad_shard + ": safetensors file '" + (ck / "step_14.zero1-rank0.safetensors").string() +
                        "': tensor 'model.w' is damaged"), std::string::npos) << why[3];
  EXPECT_EQ(why[4], no_shard + ": the optimizer shard of rank 1 of 2 ('" + (ck / "step_12.zero1-rank1.safetensors").string() +
                        "') is missing");
  EXPECT_NE(why[5].find(flipped + ": safetensors file '" + flipped + "': tensor 'model.w' is damaged"), std::string::npos)
      << why[5];
  // The same file through train.init_weights is refused, naming the tensor.
  fs::path init = temp_dir("ckpt_damaged_init");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "train.steps=1",
                                "train.run_dir=" + init.string(), "train.init_weights=" + flipped};
  std::string m = error_of([&] { run_train(parse_config("", "synth.yaml", o), {.progress = false}); });
  EXPECT_NE(m.find("safetensors file '" + flipped + "': tensor 'model.w' is damaged"), std::string::npos) << m;
  for (const auto& p : {dir, init}) fs::remove_all(p);
}

// train.precision=bf16 (Note [compute dtype] in tinygrad/nn/layers.h): an MLP learns as it does
// in float32, and its parameters and optimizer state stay float32.
TEST(LauncherTrainer, Bf16PrecisionTrainsLikeFloat32) {
  std::map<std::string, std::vector<std::pair<int64_t, double>>> losses;
  for (const char* precision : {"fp32", "bf16"}) {
    fs::path dir = temp_dir(std::string("precision_") + precision);
    Config c = parse_config("", "synth.yaml",
                            {"model.name=test_mlp", "data.name=test_synth", "data.batch_size=8", "train.steps=24",
                             "train.log_every=1", "optim.lr=0.02", std::string("train.precision=") + precision,
                             "train.run_dir=" + dir.string()});
    EXPECT_EQ(c.get_string("train.precision"), precision);
    run_train(c, {.progress = false});
    losses[precision] = train_losses(dir);
    auto header = nn::safe_header((dir / "checkpoints" / "step_24.safetensors").string());
    for (const char* k : {"model.1.weight", "model.3.bias", "optim.0.exp_avg", "optim.3.exp_avg_sq"}) {
      ASSERT_TRUE(header.count(k)) << k;
      EXPECT_EQ(header.at(k).dtype, DType::Float32) << k;
    }
    fs::remove_all(dir);
  }
  const auto &f32 = losses["fp32"], &b16 = losses["bf16"];
  ASSERT_EQ(f32.size(), 24u);
  ASSERT_EQ(b16.size(), 24u);
  EXPECT_NEAR(b16.front().second, f32.front().second, 0.02);  // the same initial weights
  EXPECT_NE(b16, f32);  // the layers really ran in bfloat16
  EXPECT_LT(b16.back().second, 0.6 * b16.front().second);
  EXPECT_NEAR(b16.back().second, f32.back().second, 0.1 * f32.back().second + 0.02);
}

// train.devices (Note [data parallel over devices] in launcher/trainer.cpp): the batch sharded over
// four virtual CPU devices gives the one-device run's losses and weights.
TEST(LauncherTrainer, DataParallelOverDevicesMatchesOneDevice) {
  fs::path one = temp_dir("trainer_one_device"), four = temp_dir("trainer_four_devices");
  std::vector<std::string> o = {"model.name=test_tiny", "data.name=test_synth", "data.batch_size=8", "train.steps=4",
                                "train.log_every=1", "optim.lr=0.05"};
  auto with = [&](const std::vector<std::string>& extra) { return concat(o, extra); };
  run_train(parse_config("", "synth.yaml", with({"train.run_dir=" + one.string()})), {.progress = false});
  uint64_t allreduces = multi_stats().allreduces;
  run_train(parse_config("", "synth.yaml", with({"train.run_dir=" + four.string(), "train.devices=4"})),
            {.progress = false});
  // at least the two gradients of each step the rewrite sees: the first and the one TinyJit
  // captures (the replays run the captured collectives without rewriting)
  EXPECT_GE(multi_stats().allreduces - allreduces, 2u * 2u);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(four / "run.json"))["devices"],
            nlohmann::json({"CPU,CPU:1,CPU:2,CPU:3"}));  // run.json names every device of the rank
  auto a = train_losses(one), b = train_losses(four);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(b[i].second, a[i].second, 1e-5 * std::abs(a[i].second));
  auto wa = nn::safe_load((one / "checkpoints" / "step_4.safetensors").string());
  auto wb = nn::safe_load((four / "checkpoints" / "step_4.safetensors").string());
  auto va = wa.at("model.fc.weight").to_vector<float>(), vb = wb.at("model.fc.weight").to_vector<float>();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); i++) EXPECT_NEAR(vb[i], va[i], 1e-5 * std::max(1.0f, std::abs(va[i])));
  EXPECT_NE(error_of([&] { run_train(parse_config("", "synth.yaml", with({"train.devices=3", "train.run_dir=" + temp_dir("trainer_three_devices").string()})), {.progress = false}); })
                .find("does not split over the 3 devices"),
            std::string::npos);
}

// model.tensor_parallel (Note [tensor parallel over devices] in launcher/trainer.cpp): the MLP split
// over four virtual CPU devices gives the one-device run's losses and weights; what does not split
// or combine is refused, naming it.
TEST(LauncherTrainer, TensorParallelMatchesOneDevice) {
  fs::path one = temp_dir("trainer_tp_one"), four = temp_dir("trainer_tp_four");
  std::vector<std::string> o = {"model.name=test_mlp", "data.name=test_synth", "data.batch_size=8", "train.steps=3",
                                "train.log_every=1", "optim.lr=0.05"};
  auto with = [&](const std::vector<std::string>& extra) { return concat(o, extra); };
  run_train(parse_config("", "synth.yaml", with({"train.run_dir=" + one.string()})), {.progress = false});
  uint64_t allreduces = multi_stats().allreduces;
  run_train(parse_config("", "synth.yaml", with({"train.run_dir=" + four.string(), "model.tensor_parallel=4"})),
            {.progress = false});
  EXPECT_GE(multi_stats().allreduces - allreduces, 3u);  // at least the pair's forward sum of each step
  auto a = train_losses(one), b = train_losses(four);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(b[i].second, a[i].second, 1e-5 * std::abs(a[i].second));
  auto wa = nn::safe_load((one / "checkpoints" / "step_3.safetensors").string());
  auto wb = nn::safe_load((four / "checkpoints" / "step_3.safetensors").string());
  for (const char* name : {"model.1.weight", "model.3.weight"}) {
    auto va = wa.at(name).to_vector<float>(), vb = wb.at(name).to_vector<float>();
    ASSERT_EQ(va.size(), vb.size());
    for (size_t i = 0; i < va.size(); i++) EXPECT_NEAR(vb[i], va[i], 1e-5 * std::max(1.0f, std::abs(va[i]))) << name;
  }
  auto refusal = [&](std::vector<std::string> extra, const char* dir) {
    extra.push_back("train.run_dir=" + temp_dir(dir).string());
    return error_of([&] { run_train(parse_config("", "synth.yaml", with(extra)), {.progress = false}); });
  };
  EXPECT_NE(refusal({"model.tensor_parallel=4", "model.name=test_wide", "model.test_width=10"}, "trainer_tp_uneven")
                .find("out_features=10"),
            std::string::npos);
  EXPECT_NE(refusal({"model.tensor_parallel=2", "train.devices=2"}, "trainer_tp_mesh").find("model.tensor_parallel=2 with train.devices"),
            std::string::npos);
}

// `tg train configs/gpt_char.yaml model.tensor_parallel=2` (made small) runs end to end, attention
// split by heads over two virtual CPU devices, with the one-device run's losses.
TEST(LauncherTrainer, CharGptTensorParallelRunsEndToEnd) {
  if (!fs::exists(nn::DEFAULT_TEXT_FILE)) GTEST_SKIP() << nn::DEFAULT_TEXT_FILE << " not found (install jargon-text)";
  fs::path one = temp_dir("trainer_gpt_one"), two = temp_dir("trainer_gpt_tp");
  auto run = [](const fs::path& dir, const std::string& tp) {
    return testutil::tg_run({"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/gpt_char.yaml", "model.n_layer=1",
                   "model.n_embd=32", "data.seq_len=16", "data.batch_size=8", "train.steps=2", "train.log_every=1",
                   "train.eval_batches=1", "train.progress=off", "model.tensor_parallel=" + tp,
                   "train.run_dir=" + dir.string()});
  };
  ASSERT_EQ(run(one, "1").rc, 0);
  testutil::CliRun tp = run(two, "2");
  ASSERT_EQ(tp.rc, 0) << tp.err;
  auto a = train_losses(one), b = train_losses(two);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(b[i].second, a[i].second, 1e-5 * std::abs(a[i].second));
}
