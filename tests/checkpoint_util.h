// Helpers for tests that resume `tg train` checkpoints across strategies and world sizes: the
// short fmnist MLP run they share, a checkpoint's parameters unsharded whatever wrote them, their
// largest relative difference, and a copy of a run directory stopped at a checkpoint.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distributed/fsdp.h"
#include "launcher/checkpoint.h"
#include "launcher/config.h"
#include "tinygrad/nn/state.h"

namespace tg::testutil {

// 6 steps of the fmnist MLP (hidden 30, global batch 32), clipped, checkpoints at steps 3 and 6.
inline launcher::Config short_run_config(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> o{"model.hidden=[30]",  "data.batch_size=32",     "train.steps=6",
                             "train.log_every=2",  "train.eval_every=1000", "data.eval_batch_size=5000",
                             "train.checkpoint_every=3", "optim.clip_grad_norm=0.5", "train.overwrite=true",
                             "train.run_dir=" + dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return launcher::load_config(std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", o);
}

using Params = std::map<std::string, std::vector<float>>;

inline Params values_of(const nn::StateDict& sd) {
  Params out;
  for (auto& [k, v] : sd) out[k] = v.to_vector<float>();
  return out;
}

// The model of a checkpoint, unsharded where fsdp wrote it (Note [checkpoints that reshard]).
inline Params model_of(const std::string& ckpt) {
  nn::Metadata meta = nn::safe_metadata(ckpt);
  nn::StateDict sd;
  if (meta.count("fsdp_ranks")) {
    std::vector<nn::StateDict> parts;
    for (int r = 0; r < std::stoi(meta.at("fsdp_ranks")); r++) parts.push_back(nn::safe_load(launcher::shard_path(ckpt, r, "fsdp")));
    sd = dist::unshard_checkpoint(parts, meta).first;
  }
  for (auto& [k, v] : nn::safe_load(ckpt))
    if (k.rfind("model.", 0) == 0) sd.emplace(k.substr(6), v);
  return values_of(sd);
}

// max |a - b| / (|b| + 0.01) (float32 rounding of parameters of size ~0.05 needs the floor)
inline double max_rel_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (auto& [k, v] : b) {
    auto it = a.find(k);
    if (it == a.end() || it->second.size() != v.size()) {
      ADD_FAILURE() << "parameter " << k << " differs in presence or size";
      return INFINITY;
    }
    for (size_t i = 0; i < v.size(); i++) worst = std::max(worst, std::abs(double(it->second[i]) - v[i]) / (std::abs(double(v[i])) + 1e-2));
  }
  return worst;
}

// A copy of run directory `from` that ends at the step-`step` checkpoint (a run stopped there).
inline void copy_until_step(const std::string& from, const std::string& to, int step) {
  namespace fs = std::filesystem;
  fs::remove_all(to);
  fs::create_directories(to + "/checkpoints");
  const std::string prefix = "step_" + std::to_string(step) + ".";
  for (auto& e : fs::directory_iterator(from + "/checkpoints"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) fs::copy_file(e.path(), to + "/checkpoints/" + e.path().filename().string());
  for (const char* f : {"config.yaml", "metrics.jsonl", "train.log"})
    if (fs::exists(from + "/" + f)) fs::copy_file(from + "/" + f, to + "/" + f);
}

}  // namespace tg::testutil
