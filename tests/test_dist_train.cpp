// `tg train` with distributed.strategy=ddp under mpirun (2 ranks): rank 0 alone writes the run
// directory; the parameters after a few steps equal those of one process on the whole batch
// (with gradient clipping); resume continues a ddp run; a non-finite gradient on rank 1 alone
// makes every rank skip that step, and the skip is logged; the default ddp step (skip check and
// clipping on) is replayed by the JIT, bit-identical to JIT=0, and a skip in a replayed step
// leaves parameters and optimizer state (its step count included) unchanged; a model that differs
// by rank is refused on every rank before the parameter broadcast; run.json names every rank's device.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "distributed/process_group.h"
#include "host_reads.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "run_util.h"
#include "test_util.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/state.h"

using namespace tg;
using namespace tg::launcher;
namespace fs = std::filesystem;

namespace {

// The mlp, except that on rank 1 its 3rd training forward pass returns inf. The forward passes
// are counted on the device (a 0-d tensor the forward assigns), so the injection also happens in
// a step that TinyJit replays (the 3rd step is the first replay), where forward() is not called.
class NanOnRank1 : public nn::Module {
 public:
  explicit NanOnRank1(std::unique_ptr<nn::Module> inner) : inner_(std::move(inner)) {
    register_module("inner", *inner_);
    float zero = 0;
    calls_ = Tensor::from_data(&zero, DType::Float32, {});
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = (*inner_)(x);
    if (is_training() && dist::env_rank() == 1) {
      calls_.assign(calls_ + 1.0);
      y = y * calls_.eq(calls_.scalar_like(3)).where(std::numeric_limits<double>::infinity(), 1.0);
    }
    return y;
  }

 private:
  std::unique_ptr<nn::Module> inner_;
  Tensor calls_;
};
TG_REGISTER_MODEL("nan_on_rank1", [](const Config& c) { return std::make_unique<NanOnRank1>(make_mlp(c.get_ints("model.hidden"))); });

const std::string BASE = "/tmp/tg_test_dist_train_" + std::to_string(dist::env_world_size());

// What a Trainer run left: the JIT's record, the counters after every step, the parameters and
// optimizer state after every step, and the final parameters.
struct Traced {
  TrainSummary summary;
  int64_t captures = 0, replays = 0, optimizer_steps = 0;
  std::string disabled_reason;
  std::vector<uint64_t> scheduled, run, collectives;  // GlobalCounters after step i + 1
  std::vector<std::vector<std::vector<float>>> params, state;  // after step i + 1
};

class Tracer : public TrainObserver {
 public:
  explicit Tracer(Traced& t) : t_(t) {}
  void on_step(Trainer& tr, int64_t) override {
    GlobalCounters c = GlobalCounters::get();
    t_.scheduled.push_back(c.kernels_scheduled);
    t_.run.push_back(c.kernels_run);
    t_.collectives.push_back(c.collectives);
    std::vector<std::vector<float>> ps, st;
    for (Tensor* p : tr.model().parameters()) ps.push_back(p->to_vector<float>());
    for (auto& [k, v] : tr.optimizer().state_dict()) st.push_back(v.to_vector<float>());
    t_.params.push_back(std::move(ps));
    t_.state.push_back(std::move(st));
  }

 private:
  Traced& t_;
};

// Trains through a Trainer (no run_train, so the JIT can be inspected) with JIT=jit; without a
// distributed.strategy each rank trains alone.
Traced trace(const Config& cfg, int jit) {
  testutil::KnobScope jit_knob(knobs::JIT, jit);
  fs::create_directories(cfg.get_string("train.run_dir"));
  auto group = dist::world_group();
  Traced t;
  GlobalCounters::reset();
  {
    const bool alone = cfg.get_string("distributed.strategy") == "none";  // one process's step
    Trainer tr(cfg, cfg.get_string("train.run_dir"), alone ? nullptr : group.get());
    tr.add_observer(std::make_shared<Tracer>(t));
    t.summary = tr.fit();
    t.captures = tr.jit().captures();
    t.replays = tr.jit().replays();
    t.disabled_reason = tr.jit().disabled_reason();
    t.optimizer_steps = tr.optimizer().step_count();
  }
  return t;
}

Config config(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> o{"model.hidden=[32]", "data.batch_size=32", "train.steps=6", "train.log_every=2",
                             "train.eval_every=1000", "data.eval_batch_size=5000", "optim.clip_grad_norm=0.5",
                             "train.overwrite=true", "train.run_dir=" + dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config(std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", o);
}

std::map<std::string, std::vector<float>> model_of(const std::string& ckpt) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [k, v] : nn::safe_load(ckpt))
    if (k.rfind("model.", 0) == 0) out[k] = v.to_vector<float>();
  return out;
}

// The grad_norm of every train record of a run, in order (-1 where a record has none).
std::vector<double> grad_norms(const std::string& dir) {
  std::vector<double> out;
  for (const auto& r : testutil::metrics_records(dir, "train")) out.push_back(r.value("grad_norm", -1.0));
  return out;
}

void expect_same_norms(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_GT(b[i], 0) << what << ", record " << i;
    EXPECT_NEAR(a[i], b[i], 1e-4 * b[i]) << what << ", record " << i;
  }
}

std::string read(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(DdpTrain, EqualsOneProcessAndRankZeroWrites) {
  const int rank = dist::env_rank();
  TrainSummary d = run_train(config(BASE + "_ddp", {"distributed.strategy=ddp"}), {.progress = false});
  EXPECT_EQ(d.steps, 6);
  EXPECT_EQ(d.skipped_steps, 0);
  // every rank computes the single-process reference in its own directory
  std::string ref_dir = BASE + "_ref" + std::to_string(rank);
  TrainSummary r = run_train(config(ref_dir, {}), {.progress = false});
  if (rank == 0) {
    ASSERT_FALSE(d.last_checkpoint.empty());
    EXPECT_TRUE(fs::exists(BASE + "_ddp/metrics.jsonl"));
    // the train records carry the global gradient norm the checked step computes
    const std::string metrics = read(BASE + "_ddp/metrics.jsonl");
    size_t train_records = 0, with_norm = 0;
    for (size_t at = metrics.find("\"type\":\"train\""); at != std::string::npos; at = metrics.find("\"type\":\"train\"", at + 1)) {
      train_records++;
      size_t line_start = metrics.rfind('\n', at) + 1;
      with_norm += metrics.substr(line_start, metrics.find('\n', at) - line_start).find("\"grad_norm\":") != std::string::npos;
    }
    EXPECT_EQ(train_records, 3u);
    EXPECT_EQ(with_norm, train_records) << metrics;
    // run.json names the world and every rank's device (each rank's, gathered to rank 0)
    const std::string record = read(BASE + "_ddp/run.json");
    EXPECT_NE(record.find("\"world_size\": " + std::to_string(dist::env_world_size())), std::string::npos) << record;
    std::string devices = "\"devices\": [";
    for (int r = 0; r < dist::env_world_size(); r++) devices += std::string(r ? "," : "") + "\n    \"CPU\"";
    EXPECT_NE(record.find(devices + "\n  ]"), std::string::npos) << record;
    auto a = model_of(d.last_checkpoint), b = model_of(r.last_checkpoint);
    ASSERT_EQ(a.size(), b.size());
    double worst = 0;
    for (auto& [k, v] : b)
      for (size_t i = 0; i < v.size(); i++)
        worst = std::max(worst, std::abs(double(a[k][i]) - v[i]) / std::max(1e-3, std::abs(double(v[i]))));
    std::printf("tg train ddp (world %d) vs one process: max relative difference %.3g\n", dist::env_world_size(), worst);
    EXPECT_LT(worst, 1e-5);
    expect_same_norms(grad_norms(BASE + "_ddp"), grad_norms(ref_dir), "ddp's clipped step against one process's");
  } else {
    EXPECT_TRUE(d.last_checkpoint.empty());  // only rank 0 writes checkpoints
  }
  fs::remove_all(ref_dir);
}

TEST(DdpTrain, ResumeContinues) {
  const std::string dir = BASE + "_resume";
  run_train(config(dir, {"distributed.strategy=ddp", "train.steps=4"}), {.progress = false});
  TrainSummary s = run_train(config(dir, {"distributed.strategy=ddp", "train.resume=true", "train.overwrite=false"}),
                             {.progress = false});
  EXPECT_EQ(s.steps, 6);
  if (dist::env_rank() == 0) {
    EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_4.safetensors"));
    EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_6.safetensors"));
  }
}

TEST(DdpTrain, NonFiniteGradientOnOneRankSkipsEverywhere) {
  const std::string dir = BASE + "_nan";
  TrainSummary s = run_train(config(dir, {"distributed.strategy=ddp", "model.name=nan_on_rank1"}), {.progress = false});
  EXPECT_EQ(s.skipped_steps, dist::env_world_size() > 1 ? 1 : 0);
  if (dist::env_rank() == 0 && dist::env_world_size() > 1) {
    // the skip is read at the next log step (Note [skipped steps are read at log steps])
    EXPECT_HAS(read(dir + "/train.log"), "steps 3..4: 1 update skipped on every rank (non-finite gradient)");
    auto skips = testutil::metrics_records(dir, "skip");
    ASSERT_EQ(skips.size(), 1u);
    EXPECT_EQ(skips[0].value("step", -1), 4);
    EXPECT_EQ(skips[0].value("first_step", -1), 3);
    EXPECT_EQ(skips[0].value("skipped", -1), 1);
    for (auto& [k, v] : model_of(s.last_checkpoint))
      for (float f : v) ASSERT_TRUE(std::isfinite(f)) << k;
  }
  // skipped at a log step: its non-finite loss is allowed, and the skip is read right there
  const std::string at_log = BASE + "_nan_at_log";
  TrainSummary l = run_train(config(at_log, {"distributed.strategy=ddp", "model.name=nan_on_rank1", "train.log_every=3"}),
                             {.progress = false});
  EXPECT_EQ(l.skipped_steps, dist::env_world_size() > 1 ? 1 : 0);
  if (dist::env_rank() == 0 && dist::env_world_size() > 1) {
    EXPECT_HAS(read(at_log + "/train.log"), "steps 1..3: 1 update skipped on every rank (non-finite gradient)");
  }
}

// Without host decisions (no clipping, no skip check) the ddp step is captured and replayed by
// the trainer's TinyJit: the replays still all-reduce through the collective runner, schedule
// fewer kernels than JIT=0, and end on bit-identical parameters.
TEST(DdpTrain, JitReplaysStepsWithTheirAllReduces) {
  auto run = [&](int jit, const std::string& dir) {
    testutil::KnobScope jit_knob(knobs::JIT, jit);
    GlobalCounters::reset();
    TrainSummary s = run_train(
        config(dir, {"distributed.strategy=ddp", "distributed.skip_nonfinite=false", "optim.clip_grad_norm=0"}),
        {.progress = false});
    GlobalCounters c = GlobalCounters::get();
    return std::make_pair(s, c);
  };
  auto [off, c_off] = run(0, BASE + "_jit0");
  auto [on, c_on] = run(1, BASE + "_jit1");
  EXPECT_EQ(on.steps, 6);
  EXPECT_GT(c_off.collectives, 0u);
  EXPECT_EQ(c_on.collectives, c_off.collectives);
  EXPECT_EQ(c_on.kernels_run, c_off.kernels_run);
  EXPECT_LT(c_on.kernels_scheduled, c_off.kernels_scheduled);
  if (dist::env_rank() == 0) {
    auto a = model_of(off.last_checkpoint), b = model_of(on.last_checkpoint);
    ASSERT_EQ(a.size(), b.size());
    for (auto& [k, v] : a) EXPECT_EQ(v, b[k]) << k;
  }
}

// Note [concatenations stored in place] in tinygrad/schedule/concat_in_place.cpp: backward
// computes the gradients into their bucket, which is all-reduced in place, so a replayed ddp step
// runs the kernels of the same step in one process (on a rank's share of the batch) and nothing
// more than its buckets' all-reduces (no concatenation kernel, no copy of the reduced
// gradients), and its parameters stay equal to those of JIT=0.
TEST(DdpTrain, ReplayedDdpStepRunsThePlainStepsKernelsAndItsAllReduces) {
  const std::vector<std::string> same = {"distributed.skip_nonfinite=false", "optim.clip_grad_norm=0"};
  auto with = [&](const std::string& dir, std::vector<std::string> extra) {
    extra.insert(extra.end(), same.begin(), same.end());
    return config(dir, extra);
  };
  const std::string rank = std::to_string(dist::env_rank());
  // the plain step on a rank's share of the batch, so that its kernels are shaped as ddp's
  const std::string share = "data.batch_size=" + std::to_string(32 / dist::env_world_size());
  Traced plain = trace(with(BASE + "_count_plain" + rank, {share}), 1);
  Traced ddp = trace(with(BASE + "_count_ddp", {"distributed.strategy=ddp"}), 1);
  Traced ddp_off = trace(with(BASE + "_count_ddp_jit0", {"distributed.strategy=ddp"}), 0);
  ASSERT_EQ(plain.replays, 4);
  ASSERT_EQ(ddp.replays, 4);
  // step 4 is a replay of every run
  const uint64_t plain_kernels = plain.run[3] - plain.run[2], ddp_kernels = ddp.run[3] - ddp.run[2];
  const uint64_t ddp_collectives = ddp.collectives[3] - ddp.collectives[2];
  std::printf("replayed step: plain %llu kernels; ddp %llu kernels and %llu collectives\n",
              static_cast<unsigned long long>(plain_kernels), static_cast<unsigned long long>(ddp_kernels),
              static_cast<unsigned long long>(ddp_collectives));
  EXPECT_GT(plain_kernels, 0u);
  EXPECT_EQ(plain.collectives[3] - plain.collectives[2], 0u);
  EXPECT_EQ(ddp_collectives, 1u) << "one bucket, one all-reduce";
  EXPECT_LE(ddp_kernels, plain_kernels);
  for (size_t i = 0; i < 6; i++) EXPECT_EQ(ddp.params[i], ddp_off.params[i]) << "parameters after step " << i + 1;
  fs::remove_all(BASE + "_count_plain" + rank);
}

// Note [the gradient norm of every run] in launcher/trainer.cpp: steps that neither clip nor
// check report the global gradient norm too, and ddp, zero1 and one process agree on it.
TEST(DdpTrain, EveryStrategyReportsTheGradNorm) {
  const std::vector<std::string> plain = {"distributed.skip_nonfinite=false", "optim.clip_grad_norm=0", "optim.name=sgd",
                                          "optim.momentum=0.9", "optim.lr=0.05"};
  auto with = [&](std::string extra) {
    std::vector<std::string> o = plain;
    if (!extra.empty()) o.push_back(std::move(extra));
    return o;
  };
  const std::string one = BASE + "_norm_one" + std::to_string(dist::env_rank()), ddp = BASE + "_norm_ddp",
                    zero1 = BASE + "_norm_zero1";
  run_train(config(one, with("")), {.progress = false});
  run_train(config(ddp, with("distributed.strategy=ddp")), {.progress = false});
  run_train(config(zero1, with("distributed.strategy=zero1")), {.progress = false});
  if (dist::env_rank() == 0) {
    EXPECT_EQ(grad_norms(one).size(), 3u);
    expect_same_norms(grad_norms(ddp), grad_norms(one), "ddp without checks against one process");
    expect_same_norms(grad_norms(zero1), grad_norms(one), "zero1 without checks against one process");
  }
  fs::remove_all(one);
}

TEST(DdpTrain, Zero1EqualsDdpAndResumesFromShards) {
  // SGD with momentum: Adam's division by sqrt(v) magnifies float rounding of tiny gradients
  const std::string z = BASE + "_zero1", z2 = BASE + "_zero1_resumed", d = BASE + "_ddp2";
  const std::string sgd = "optim.name=sgd", mom = "optim.momentum=0.9", lr = "optim.lr=0.05";
  TrainSummary sd = run_train(config(d, {"distributed.strategy=ddp", sgd, mom, lr}), {.progress = false});
  TrainSummary sz = run_train(config(z, {"distributed.strategy=zero1", "train.checkpoint_every=3", sgd, mom, lr}),
                              {.progress = false});
  run_train(config(z2, {"distributed.strategy=zero1", "train.steps=3", sgd, mom, lr}), {.progress = false});
  TrainSummary sr = run_train(
      config(z2, {"distributed.strategy=zero1", "train.resume=true", "train.overwrite=false", sgd, mom, lr}), {.progress = false});
  EXPECT_EQ(sr.steps, 6);
  for (int r = 0; r < dist::env_world_size(); r++)
    EXPECT_TRUE(fs::exists(z + "/checkpoints/step_3.zero1-rank" + std::to_string(r) + ".safetensors"));
  if (dist::env_rank() == 0) {
    auto a = model_of(sz.last_checkpoint), b = model_of(sd.last_checkpoint), c = model_of(sr.last_checkpoint);
    double vs_ddp = 0, vs_resumed = 0;
    for (auto& [k, v] : b)
      for (size_t i = 0; i < v.size(); i++) {
        // relative 1e-5 with an absolute floor of 1e-7 (float32 rounding of parameters of size ~0.05)
        vs_ddp = std::max(vs_ddp, std::abs(double(a[k][i]) - v[i]) / (std::abs(double(v[i])) + 1e-2));
        vs_resumed = std::max(vs_resumed, std::abs(double(a[k][i]) - c[k][i]));
      }
    std::printf("tg train zero1 vs ddp: max |a-b| / (|b| + 0.01) %.3g; resumed vs uninterrupted: %.3g\n", vs_ddp, vs_resumed);
    EXPECT_LT(vs_ddp, 1e-5);
    EXPECT_EQ(vs_resumed, 0.0);
  }
}

// The default ddp step (distributed.skip_nonfinite on, clipping at 0.5) decides on the device, so
// the JIT captures it on the 2nd step and replays every later one: no kernel is scheduled after
// the capture, the kernels still run, and the parameters are bit-identical to JIT=0.
TEST(DdpTrain, DefaultStepWithSkipCheckAndClippingReplays) {
  Config cfg = config(BASE + "_jit_default", {"distributed.strategy=ddp"});
  ASSERT_TRUE(cfg.get_bool("distributed.skip_nonfinite"));
  Traced off = trace(cfg, 0), on = trace(cfg, 1);
  EXPECT_EQ(on.disabled_reason, "");
  EXPECT_EQ(on.captures, 1);
  EXPECT_EQ(on.replays, 4);
  EXPECT_EQ(off.replays, 0);
  ASSERT_EQ(on.scheduled.size(), 6u);
  ASSERT_EQ(off.scheduled.size(), 6u);
  // steps 3 to 5 (the last step is followed by the evaluation on rank 0) schedule nothing...
  EXPECT_EQ(on.scheduled[4], on.scheduled[1]);
  EXPECT_GT(off.scheduled[4], off.scheduled[1]);
  // ...and run as many kernels as without the JIT
  EXPECT_GT(on.run[4], on.run[1]);
  EXPECT_EQ(on.run[4] - on.run[1], off.run[4] - off.run[1]);
  EXPECT_EQ(on.summary.skipped_steps, 0);
  EXPECT_EQ(on.optimizer_steps, 6);
  for (size_t i = 0; i < 6; i++) {
    EXPECT_EQ(on.params[i], off.params[i]) << "parameters after step " << i + 1;
    EXPECT_EQ(on.state[i], off.state[i]) << "optimizer state after step " << i + 1;
  }
}

// A skip check that never skips changes nothing: with distributed.skip_nonfinite (the update
// through step_if, its bias corrections through the select of Note [bias corrections after a
// skip], the skip count in ok's kernel) the parameters and optimizer state after every step are
// bit for bit those of the step without the check (Optimizer::step, as before the count existed).
TEST(DdpTrain, SkipCheckThatNeverSkipsIsBitIdenticalToNoCheck) {
  Traced on = trace(config(BASE + "_check_on", {"distributed.strategy=ddp", "optim.clip_grad_norm=0"}), 1);
  Traced off = trace(config(BASE + "_check_off", {"distributed.strategy=ddp", "optim.clip_grad_norm=0",
                                                  "distributed.skip_nonfinite=false"}), 1);
  EXPECT_EQ(on.summary.skipped_steps, 0);
  EXPECT_EQ(on.replays, 4);
  ASSERT_EQ(on.params.size(), 6u);
  ASSERT_EQ(off.params.size(), 6u);
  for (size_t i = 0; i < 6; i++) {
    EXPECT_EQ(on.params[i], off.params[i]) << "parameters after step " << i + 1;
    EXPECT_EQ(on.state[i], off.state[i]) << "optimizer state after step " << i + 1;
  }
}

// A non-finite gradient on rank 1 in step 3 (the first replayed step): every rank skips it under
// replay, the parameters and the optimizer state (step count included) are those of step 2, and
// the run is bit-identical to JIT=0.
TEST(DdpTrain, ReplayedStepWithNonFiniteGradientIsSkippedEverywhere) {
  if (dist::env_world_size() < 2) GTEST_SKIP() << "needs a rank 1";
  Config cfg = config(BASE + "_jit_nan", {"distributed.strategy=ddp", "model.name=nan_on_rank1"});
  Traced off = trace(cfg, 0), on = trace(cfg, 1);
  EXPECT_EQ(on.disabled_reason, "");
  EXPECT_EQ(on.captures, 1);
  EXPECT_EQ(on.replays, 4);
  for (const Traced* t : {&off, &on}) {
    EXPECT_EQ(t->summary.skipped_steps, 1);
    EXPECT_EQ(t->optimizer_steps, 5);  // the skipped step is not counted
    ASSERT_EQ(t->params.size(), 6u);
    EXPECT_EQ(t->params[2], t->params[1]) << "the skipped step changed a parameter";
    EXPECT_EQ(t->state[2], t->state[1]) << "the skipped step changed the optimizer state";
    EXPECT_NE(t->params[3], t->params[2]) << "the step after the skip did not update";
    for (auto& p : t->params[5])
      for (float f : p) ASSERT_TRUE(std::isfinite(f));
  }
  for (size_t i = 0; i < 6; i++) {
    EXPECT_EQ(on.params[i], off.params[i]) << "parameters after step " << i + 1;
    EXPECT_EQ(on.state[i], off.state[i]) << "optimizer state after step " << i + 1;
  }
}

// zero1's step is built on the graph (reduce-scatter, decision, update, all-gather), so with the
// default skip check and clipping the JIT captures it on the 2nd step and replays the rest,
// bit-identical to JIT=0, and the result still equals ddp's.
TEST(DdpTrain, Zero1StepsReplayBitIdenticalToJitOff) {
  const std::vector<std::string> sgd{"optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05"};
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), sgd.begin(), sgd.end());
    return o;
  };
  Config cfg = config(BASE + "_jit_zero1", with({"distributed.strategy=zero1"}));
  Traced off = trace(cfg, 0), on = trace(cfg, 1);
  Traced ddp = trace(config(BASE + "_jit_zero1_ddp", with({"distributed.strategy=ddp"})), 1);
  EXPECT_EQ(on.disabled_reason, "");
  EXPECT_EQ(on.captures, 1);
  EXPECT_EQ(on.replays, 4);
  ASSERT_EQ(on.scheduled.size(), 6u);
  EXPECT_EQ(on.scheduled[4], on.scheduled[1]) << "a replayed zero1 step scheduled kernels";
  EXPECT_EQ(on.run[4] - on.run[1], off.run[4] - off.run[1]);
  EXPECT_EQ(on.optimizer_steps, 6);
  for (size_t i = 0; i < 6; i++) {
    EXPECT_EQ(on.params[i], off.params[i]) << "parameters after step " << i + 1;
    EXPECT_EQ(on.state[i], off.state[i]) << "optimizer state after step " << i + 1;
  }
  double worst = 0;
  for (size_t p = 0; p < ddp.params[5].size(); p++)
    for (size_t j = 0; j < ddp.params[5][p].size(); j++)
      worst = std::max(worst, std::abs(double(on.params[5][p][j]) - ddp.params[5][p][j]) /
                                  (std::abs(double(ddp.params[5][p][j])) + 1e-2));
  EXPECT_LT(worst, 1e-5) << "zero1 (replayed) vs ddp";
}

// A non-finite gradient on rank 1 in the first replayed zero1 step: every rank skips it.
TEST(DdpTrain, ReplayedZero1StepWithNonFiniteGradientIsSkippedEverywhere) {
  if (dist::env_world_size() < 2) GTEST_SKIP() << "needs a rank 1";
  Config cfg = config(BASE + "_jit_zero1_nan", {"distributed.strategy=zero1", "model.name=nan_on_rank1"});
  Traced on = trace(cfg, 1);
  EXPECT_EQ(on.disabled_reason, "");
  EXPECT_EQ(on.replays, 4);
  EXPECT_EQ(on.summary.skipped_steps, 1);
  EXPECT_EQ(on.optimizer_steps, 5);
  ASSERT_EQ(on.params.size(), 6u);
  EXPECT_EQ(on.params[2], on.params[1]) << "the skipped step changed a parameter";
  EXPECT_EQ(on.state[2], on.state[1]) << "the skipped step changed the optimizer state";
  EXPECT_NE(on.params[3], on.params[2]);
}

// Note [skipped steps are read at log steps] (launcher/trainer.cpp): with the skip check and
// clipping on (the defaults), a step that is not a log step reads nothing from the device, so
// on a GPU the host queues the next step while this one runs; ddp, zero1 and fsdp alike. The
// log steps read the loss, the ok flag, the norm and the skip count.
class ReadsPerStep : public TrainObserver {
 public:
  void on_train_begin(Trainer&) override { seen_ = reads_.count(); }  // not the construction's reads
  void on_step(Trainer&, int64_t) override {
    per_step.push_back(reads_.count() - seen_);
    seen_ = reads_.count();
  }
  std::vector<int64_t> per_step;

 private:
  testutil::HostReads reads_;
  int64_t seen_ = 0;
};

TEST(DdpTrain, StepsBetweenLogStepsReadNothingFromTheDevice) {
  for (const char* strategy : {"ddp", "zero1", "fsdp"}) {
    SCOPED_TRACE(strategy);
    Config cfg = config(BASE + "_reads_" + strategy, {std::string("distributed.strategy=") + strategy, "train.log_every=3"});
    ASSERT_TRUE(cfg.get_bool("distributed.skip_nonfinite"));
    fs::create_directories(cfg.get_string("train.run_dir"));
    auto group = dist::world_group();
    auto reads = std::make_shared<ReadsPerStep>();
    {
      const bool alone = cfg.get_string("distributed.strategy") == "none";  // one process's step
    Trainer tr(cfg, cfg.get_string("train.run_dir"), alone ? nullptr : group.get());
      tr.add_observer(reads);
      tr.fit();
      EXPECT_EQ(tr.jit().replays(), 4);
    }
    ASSERT_EQ(reads->per_step.size(), 6u);
    for (size_t i : {0, 1, 3, 4}) EXPECT_EQ(reads->per_step[i], 0) << "host reads in step " << i + 1 << " of " << strategy;
    EXPECT_GT(reads->per_step[2], 0) << "the log step read nothing";
  }
}

// A checkpoint holds the settled step count: written at the skipped step 3 (before the log step
// 4 reads the skip) it says 2, at step 4 it says 3. A run resumed from step 4 ends where the
// uninterrupted run does, bit for bit (both settled at the log step 4: Note [skipped steps are
// read at log steps]); ddp: the main file's optimizer state, zero1: each rank's shard file.
TEST(DdpTrain, ResumeAfterASkippedStepRestoresTheCount) {
  if (dist::env_world_size() < 2) GTEST_SKIP() << "needs a rank 1";
  for (const char* strategy : {"ddp", "zero1"}) {
    SCOPED_TRACE(strategy);
    const std::string whole = BASE + "_skip_whole_" + strategy, parts = BASE + "_skip_parts_" + strategy;
    auto cfg = [&](const std::string& dir, std::vector<std::string> extra) {
      extra.push_back(std::string("distributed.strategy=") + strategy);
      extra.push_back("model.name=nan_on_rank1");  // skips step 3
      return config(dir, extra);
    };
    auto optim_step = [&](const std::string& ckpt) {
      const std::string file = std::string(strategy) == "zero1" ? shard_path(ckpt, dist::env_rank()) : ckpt;
      return nn::safe_load(file).at("optim.step").item<int64_t>();
    };
    TrainSummary a = run_train(cfg(whole, {"train.checkpoint_every=3"}), {.progress = false});
    TrainSummary b1 = run_train(cfg(parts, {"train.steps=4"}), {.progress = false});
    TrainSummary b2 = run_train(cfg(parts, {"train.resume=true", "train.overwrite=false"}), {.progress = false});
    EXPECT_EQ(a.skipped_steps, 1);
    EXPECT_EQ(b1.skipped_steps, 1);
    EXPECT_EQ(b2.skipped_steps, 0);
    if (dist::env_rank() == 0 || std::string(strategy) == "zero1") {
      EXPECT_EQ(optim_step(whole + "/checkpoints/step_3.safetensors"), 2);
      EXPECT_EQ(optim_step(parts + "/checkpoints/step_4.safetensors"), 3);
      EXPECT_EQ(optim_step(a.last_checkpoint), 5);
      EXPECT_EQ(optim_step(b2.last_checkpoint), 5);
    }
    if (dist::env_rank() == 0) {
      auto x = model_of(a.last_checkpoint), y = model_of(b2.last_checkpoint);
      ASSERT_EQ(x.size(), y.size());
      for (auto& [k, v] : x) EXPECT_EQ(v, y[k]) << k;
    }
  }
}

// distributed.grad_dtype=bf16: the buckets cross in bfloat16, so the result differs from the
// float32 run by bfloat16 rounding of the gradients (relative 2^-8 per element), not more.
TEST(DdpTrain, Bfloat16GradientsStayCloseToFloat32) {
  for (const char* strategy : {"distributed.strategy=ddp", "distributed.strategy=zero1"}) {
    SCOPED_TRACE(strategy);
    Traced f32 = trace(config(BASE + "_grad_f32", {strategy}), 1);
    Traced b16 = trace(config(BASE + "_grad_bf16", {strategy, "distributed.grad_dtype=bf16"}), 1);
    EXPECT_EQ(b16.replays, 4);
    double worst = 0;
    for (size_t p = 0; p < f32.params[5].size(); p++)
      for (size_t j = 0; j < f32.params[5][p].size(); j++)
        worst = std::max(worst, std::abs(double(b16.params[5][p][j]) - f32.params[5][p][j]));
    if (dist::env_rank() == 0) std::printf("%s: bf16 vs fp32 gradients, max |difference| %.3g\n", strategy, worst);
    EXPECT_GT(worst, 0.0) << "bf16 gradients gave bit-identical parameters: were they cast?";
    EXPECT_LT(worst, 2e-3);
  }
}

// A model that differs by rank under the same config (Note [ranks agree before they train] in
// launcher/rank_agreement.cpp): every rank's Trainer refuses it, naming the tensors, before the
// parameter broadcast (which used to abort inside MPI on the mismatched sizes).
TG_REGISTER_MODEL("width_by_rank", [](const Config&) { return make_mlp({dist::env_rank() == 0 ? 32 : 16}); });

TEST(DdpTrain, ModelsThatDifferByRankAreRefusedBeforeTheBroadcast) {
  if (dist::env_world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  const std::string dir = BASE + "_width_by_rank";
  fs::create_directories(dir);
  auto group = dist::world_group();
  std::string msg;
  try {
    Trainer tr(config(dir, {"model.name=width_by_rank", "distributed.strategy=ddp"}), dir, group.get());
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("the ranks disagree on the model before training: rank 1 differs from rank 0 (this is rank " +
                          std::to_string(dist::env_rank()) + " of 2)\n"
                          "  parameter 1.bias: float32[16] on rank 1, float32[32] on rank 0\n"
                          "  parameter 1.weight: float32[16,784] on rank 1, float32[32,784] on rank 0\n",
                      0),
            0u)
      << msg;
  group->barrier()->wait();  // the ranks' collectives still match after the refusal
  fs::remove_all(dir);
}
