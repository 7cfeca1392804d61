// Trainer runs that tests of several ranks and devices compare: a run's JIT record, the
// collectives counted after each step, each parameter's values on every device and whole, and
// the reported gradient norms; the largest relative difference of two runs' parameters; the
// check that every device and rank holds the same replicas; the MLP and tiny GPT configs they
// train (TG_SOURCE_DIR names the source tree).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "distributed/host_exchange.h"
#include "distributed/process_group.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "tests/test_util.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/multi.h"

namespace tg::testutil {

using launcher::Config;
using launcher::StepEvent;
using launcher::Trainer;
using launcher::TrainObserver;
using launcher::TrainSummary;

// The counters after one step: collectives across the ranks and the multi-device rewrite's.
struct StepCounts {
  uint64_t rank_collectives = 0;
  MultiStats multi;
};

// What a Trainer run left: the JIT's record, the counters after every step, and each parameter's
// value on every device it lives on.
struct Trained {
  TrainSummary summary;
  int64_t captures = 0, replays = 0;
  std::string disabled_reason;
  std::vector<StepCounts> after_step;
  std::vector<std::vector<std::string>> devices;              // of each parameter
  std::vector<std::vector<std::vector<float>>> on_device;      // [parameter][device] values
  std::vector<std::optional<int64_t>> axes;                    // each parameter's split axis
  std::vector<std::vector<float>> whole;                       // each parameter's whole value
  std::vector<double> grad_norms;                              // reported at the log steps
  std::vector<std::vector<float>> params() const {             // the first device's
    std::vector<std::vector<float>> out;
    for (auto& p : on_device) out.push_back(p[0]);
    return out;
  }
};

class Counter : public TrainObserver {
 public:
  explicit Counter(Trained& t) : t_(t) {}
  void on_step(Trainer&, int64_t) override { t_.after_step.push_back({GlobalCounters::get().collectives, multi_stats()}); }
  void on_step_end(Trainer&, const StepEvent& ev) override { t_.grad_norms.push_back(ev.grad_norm.value_or(-1)); }

 private:
  Trained& t_;
};

// Trains through a Trainer (so that its JIT can be inspected), under the world group when
// `ranks`, else as one process.
inline Trained train(const Config& cfg, bool ranks) {
  std::filesystem::create_directories(cfg.get_string("train.run_dir"));
  auto group = ranks ? dist::world_group_for("auto", launcher::group_device(cfg)) : nullptr;
  Trained t;
  Trainer tr(cfg, cfg.get_string("train.run_dir"), group.get());
  tr.add_observer(std::make_shared<Counter>(t));
  t.summary = tr.fit();
  t.captures = tr.jit().captures();
  t.replays = tr.jit().replays();
  t.disabled_reason = tr.jit().disabled_reason();
  for (Tensor* p : tr.model().parameters()) {
    t.devices.push_back(p->devices());
    t.axes.push_back(p->shard_axis());
    t.whole.push_back(p->to_vector<float>());
    std::vector<std::vector<float>> parts;
    for (const Tensor& s : p->shards()) parts.push_back(s.to_vector<float>());
    t.on_device.push_back(std::move(parts));
  }
  return t;
}

// Largest |a - b| / max(1e-3, |b|) over two parameter lists (the floor as in test_dist_train:
// float32 rounding of parameters near zero).
inline double worst_relative(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); i++)
    for (size_t j = 0; j < b[i].size(); j++)
      worst = std::max(worst, std::abs(double(a[i][j]) - b[i][j]) / std::max(1e-3, std::abs(double(b[i][j]))));
  return worst;
}

// Every device of every replicated parameter holds the same values, bit for bit, and every rank
// the same parameters.
inline void expect_same_everywhere(const Trained& t) {
  double sum = 0;
  for (size_t i = 0; i < t.on_device.size(); i++) {
    for (size_t d = 1; d < t.on_device[i].size() && !t.axes[i]; d++)
      EXPECT_EQ(t.on_device[i][d], t.on_device[i][0]) << "parameter " << i << " on " << t.devices[i][d];
    for (float f : t.whole[i]) sum += f;
  }
  auto group = dist::world_group();
  std::vector<double> sums(static_cast<size_t>(group->size()));
  dist::all_gather_host(*group, &sum, sums.data(), 1, DType::Float64);
  for (double s : sums) EXPECT_EQ(s, sums[0]) << "the ranks' parameters differ";
}

// The counters' growth from after step `from` to after step `to` (1-based), per step.
inline StepCounts per_step(const Trained& t, size_t from, size_t to) {
  const StepCounts &a = t.after_step.at(from - 1), &b = t.after_step.at(to - 1);
  const auto n = static_cast<uint64_t>(to - from);
  return {(b.rank_collectives - a.rank_collectives) / n,
          {(b.multi.allreduces - a.multi.allreduces) / n, (b.multi.allgathers - a.multi.allgathers) / n,
           (b.multi.copies - a.multi.copies) / n}};
}

// The MLP of test_dist_train: 784-32-10 on Fashion-MNIST, clipping at 0.5 and the non-finite
// check (the default ddp step), a global batch of 32, 6 steps (the 2nd captured, 4 replayed). SGD
// with momentum: Adam's division by sqrt(v) magnifies the float rounding of tiny gradients, which
// differ with the order of the sums (test_dist_train's zero1 comparison does the same).
inline Config mlp(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> o{"model.hidden=[32]", "data.batch_size=32", "train.steps=6", "train.log_every=2",
                             "train.eval_every=1000", "data.eval_batch_size=1000", "train.eval_batches=1",
                             "optim.clip_grad_norm=0.5", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05",
                             "train.overwrite=true", "train.run_dir=" + dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return launcher::load_config(std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", o);
}

// The char GPT of configs/gpt_char.yaml made tiny (1 layer, width 32, 4 heads), 2 steps of SGD.
inline Config tiny_gpt(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> o{"model.n_layer=1", "model.n_embd=32", "data.seq_len=16", "data.batch_size=8",
                             "train.steps=2", "train.log_every=1", "train.eval_every=1000", "train.eval_batches=1",
                             "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05", "schedule.warmup_steps=0",
                             "train.overwrite=true", "train.run_dir=" + dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return launcher::load_config(std::string(TG_SOURCE_DIR) + "/configs/gpt_char.yaml", o);
}

// The error of a Trainer of mlp() with `extra` over the world group, run in `dir` (on the small
// synthetic images: it fails before its model is built).
inline std::string refusal_of(const std::string& dir, std::vector<std::string> extra) {
  std::filesystem::create_directories(dir);
  extra.push_back("data.name=test_synth");
  auto group = dist::world_group();
  return error_of([&] { launcher::Trainer tr(mlp(dir, extra), dir, group.get()); });
}

}  // namespace tg::testutil
