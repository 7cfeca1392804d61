// End-to-end tests of `tg train` on the real Fashion-MNIST data: a short MLP run from the
// shipped config reaches a test accuracy bound, and a run resumed from a mid-run checkpoint
// logs exactly the losses of the uninterrupted run. Skipped when the dataset is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "launcher/config.h"
#include "launcher/run.h"
#include "run_util.h"
#include "test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/data.h"

namespace fs = std::filesystem;
using namespace tg::launcher;

using tg::testutil::fresh_run_dir;
using tg::testutil::metrics_records;

namespace {

bool have_data() { return fs::exists(std::string(tg::nn::FASHION_MNIST_ROOT) + "/train-images-idx3-ubyte.gz"); }

#define SKIP_WITHOUT_DATA()                                                                       \
  if (!have_data())                                                                               \
  GTEST_SKIP() << "Fashion-MNIST not found in " << tg::nn::FASHION_MNIST_ROOT                     \
               << " (install the Debian package dataset-fashion-mnist)"


std::string mlp_config() { return std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml"; }

}  // namespace

// Through the command line entry point, with the shipped config and overrides.
TEST(E2E, MlpReachesAccuracyInAFewHundredSteps) {
  SKIP_WITHOUT_DATA();
  fs::path dir = fresh_run_dir("e2e", "mlp");
  std::vector<std::string> args = {"tg", "train", mlp_config(), "train.steps=300", "train.log_every=50",
                                   "train.run_dir=" + dir.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_EQ(tg_main(static_cast<int>(argv.size()), argv.data()), 0);

  auto evals = metrics_records(dir, "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_EQ(evals.back()["step"], 300);
  EXPECT_GT(evals.back()["eval_accuracy"].get<double>(), 0.70);
  auto train = metrics_records(dir, "train");
  ASSERT_EQ(train.size(), 6u);  // steps 50, 100, ..., 300
  for (const char* k : {"step", "epoch", "loss", "lr", "examples_per_s"}) EXPECT_TRUE(train[0].contains(k)) << k;
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  EXPECT_TRUE(fs::exists(dir / "config.yaml"));
  EXPECT_TRUE(fs::exists(dir / "train.log"));
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step_300.safetensors"));
  // The resolved config reproduces the run's settings.
  Config back = load_config((dir / "config.yaml").string());
  EXPECT_EQ(back.get_int("train.steps"), 300);

  // init_weights from the checkpoint: evaluation right away is as good as the trained model.
  fs::path dir2 = fresh_run_dir("e2e", "mlp_init");
  Config c = load_config(mlp_config(), {"train.steps=1", "optim.lr=0", "train.run_dir=" + dir2.string(),
                                        "train.init_weights=" + (dir / "checkpoints" / "step_300.safetensors").string()});
  TrainSummary s = run_train(c, {.progress = false});
  ASSERT_TRUE(s.accuracy.has_value());
  EXPECT_NEAR(*s.accuracy, evals.back()["eval_accuracy"].get<double>(), 1e-9);
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

// Note [resume test]: run A trains K steps with a checkpoint at K/2. Run B is a copy of A's run
// directory as it would be after a crash right after that checkpoint (no later checkpoint, a
// half-written .tmp file); resuming B must skip the consumed batches of the epoch and log the
// very same losses as A after K/2 (bitwise: same kernels, same data, same optimizer state).
TEST(E2E, ResumeReproducesTheUninterruptedRun) {
  SKIP_WITHOUT_DATA();
  constexpr int K = 40;
  fs::path a = fresh_run_dir("e2e", "resume_a"), b = fresh_run_dir("e2e", "resume_b");
  std::vector<std::string> common = {"train.steps=" + std::to_string(K), "train.log_every=1", "train.eval_every=1000",
                                     "data.shuffle=true", "data.seed=3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return load_config(mlp_config(), extra);
  };
  run_train(with({"train.run_dir=" + a.string(), "train.checkpoint_every=" + std::to_string(K / 2)}), {.progress = false});
  ASSERT_TRUE(fs::exists(a / "checkpoints" / "step_20.safetensors"));

  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove(b / "checkpoints" / "step_40.safetensors");
  std::ofstream(b / "checkpoints" / "step_40.safetensors.tmp") << "half written";
  TrainSummary s = run_train(with({"train.run_dir=" + b.string(), "train.resume=true"}), {.progress = false});
  EXPECT_EQ(s.steps, K);

  std::map<int64_t, double> la, lb;
  for (auto& r : metrics_records(a, "train")) la[r["step"]] = r["loss"];
  for (auto& r : metrics_records(b, "train")) lb[r["step"]] = r["loss"];
  ASSERT_EQ(la.size(), static_cast<size_t>(K));
  ASSERT_EQ(lb.size(), static_cast<size_t>(K));  // B's file reads like one run: no duplicates
  for (int step = K / 2 + 1; step <= K; step++) EXPECT_EQ(lb[step], la[step]) << "step " << step;
  EXPECT_EQ(metrics_records(b, "eval").back()["eval_accuracy"], metrics_records(a, "eval").back()["eval_accuracy"]);
  fs::remove_all(a);
  fs::remove_all(b);
}

// train.device picks the device of the whole run: the MLP trains on OpenCL (PoCL in CI). The
// run's kernels are compiled for CL and its buffers taken from CL's pool; the CPU compiles none.
// Note [configured device accuracy]: the 40 steps of this config reach 0.7772 on the test set,
// on CL and on the CPU alike (0.7955 and 0.7845 with other data and model seeds; 10 steps reach
// 0.71, 20 steps 0.75, an untrained model about 0.10). The bound 0.75 leaves the seeds' spread
// (0.02) as room for another machine's rounding and still fails a model that does not learn or
// learns half as far; the finer check is the same run on the CPU, which must agree to within
// 0.01 (measured: equal) and which a wrong CL kernel misses.
TEST(E2E, MlpTrainsOnTheConfiguredDevice) {
  SKIP_WITHOUT_DATA();
  tg::Device* cl = nullptr;
  try {
    cl = &tg::get_device("CL");
  } catch (const tg::Error& e) {
    GTEST_SKIP() << "device CL is not available: " << e.what();
  }
  tg::Device& cpu = tg::get_device("CPU");
  // train.device sets the DEVICE knob for the process (launcher/trainer.cpp); the scope puts back
  // the value this test found.
  tg::testutil::KnobScope device(tg::knobs::DEVICE, tg::knobs::DEVICE.get());
  auto train_on = [](const std::string& dev, const fs::path& dir) {
    Config c = load_config(mlp_config(), {"train.device=" + dev, "train.steps=40", "train.log_every=10",
                                          "train.eval_every=40", "train.run_dir=" + dir.string()});
    return run_train(c, {.progress = false});
  };
  const size_t cl_kernels = cl->compiled_count(), cpu_kernels = cpu.compiled_count();
  const uint64_t cl_allocations = cl->pool().stats().allocations;
  fs::path dir = fresh_run_dir("e2e", "mlp_cl");
  TrainSummary s = train_on("CL", dir);
  EXPECT_GT(cl->compiled_count(), cl_kernels) << "no kernel was compiled for CL";
  EXPECT_GT(cl->pool().stats().allocations, cl_allocations) << "no buffer was allocated on CL";
  EXPECT_EQ(cpu.compiled_count(), cpu_kernels) << "kernels were compiled for the CPU during a CL run";
  ASSERT_TRUE(s.accuracy.has_value());
  EXPECT_GE(*s.accuracy, 0.75);  // Note [configured device accuracy]
  auto train = metrics_records(dir, "train");
  ASSERT_EQ(train.size(), 4u);
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  fs::path cpu_dir = fresh_run_dir("e2e", "mlp_cpu");
  TrainSummary on_cpu = train_on("CPU", cpu_dir);
  ASSERT_TRUE(on_cpu.accuracy.has_value());
  EXPECT_NEAR(*s.accuracy, *on_cpu.accuracy, 0.01) << "CL and CPU runs of the same steps";
  fs::remove_all(dir);
  fs::remove_all(cpu_dir);
}

TEST(E2E, UnknownDeviceIsRefusedByName) {
  Config c = load_config(mlp_config(), {"train.device=NOSUCHDEV", "train.steps=1",
                                        "train.run_dir=" + fresh_run_dir("e2e", "baddev").string()});
  try {
    run_train(c, {.progress = false});
    FAIL() << "expected an error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NOSUCHDEV"), std::string::npos) << e.what();
  }
}
