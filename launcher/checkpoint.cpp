// Reading checkpoints of any strategy and world size as full tensors (see checkpoint.h).
#include "launcher/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <sstream>

#include "distributed/fsdp.h"
#include "tinygrad/error.h"

namespace tg::launcher {

// Note [checkpoints that reshard]: every checkpoint records the global shape of what it holds, as
// PyTorch's distributed checkpoints do, so any strategy of any world size loads its part:
//  - none, ddp: the main file holds every tensor whole ("model.<name>", and the optimizer's
//    "optim.<i>.<state>" of parameter i's shape).
//  - zero1: the main file holds the model whole; each rank's file its block of the optimizer
//    state, and the metadata zero1_ranks and zero1_layout (Note [zero1 checkpoints] in
//    distributed/zero.cpp).
//  - fsdp: each rank's file holds its dim-0 shards of the parameters and of their optimizer
//    state, and the metadata fsdp_ranks and fsdp_layout (Note [fsdp checkpoints] in
//    distributed/fsdp.cpp); the main file the model's buffers.
// read_full_checkpoint turns any of them into full tensors: the model's state dict and the
// per-parameter optimizer state a data-parallel optimizer holds. The loading trainer then takes
// its part: none and ddp the whole, zero1 its block of the flattened state
// (Zero1::load_full_optimizer_state), fsdp its rows (Fsdp::reload_parameters,
// load_full_optimizer_state). Resharding copies values and never computes them, so the
// parameters and optimizer state a run resumes from are bit for bit those saved; what follows
// differs from the saving run only where the new layout sums the gradients in another order.
// Before anything is assembled the checkpoint's tensors are checked against the loading model
// (every parameter's name and global shape, nothing but buffers besides, and the order a layout
// records, which the optimizer state's indices follow), so a checkpoint of another model fails
// with every difference named, and
// nothing of the run directory is written before a load succeeds (run_train loads first).
namespace {

// The rank count of `key` in the metadata (a positive integer), or 0 when the key is absent.
int64_t rank_count(const nn::Metadata& meta, const std::string& key, const std::string& path) {
  if (!meta.count(key)) return 0;
  int64_t n = metadata_int(meta, key, path);
  TG_CHECK(n > 0, "checkpoint '", path, "': metadata ", key, "=0");
  return n;
}

std::vector<nn::StateDict> rank_files(const std::string& path, const std::string& strategy, int64_t ranks) {
  std::vector<nn::StateDict> out;
  for (int64_t r = 0; r < ranks; r++) out.push_back(nn::safe_load(shard_path(path, static_cast<int>(r), strategy)));
  return out;
}

using Shapes = std::map<std::string, Shape>;

Shapes shapes_of(const nn::StateDict& sd) {
  Shapes out;
  for (auto& [k, v] : sd) out.emplace(k, v.shape());
  return out;
}

// The parameters an fsdp layout lists ("<name> <rows> <shape>" lines), in order.
std::vector<dist::ParamLayout> fsdp_params(const std::string& path, const nn::Metadata& meta) {
  TG_CHECK(meta.count("fsdp_layout"), "checkpoint '", path, "' has fsdp_ranks but no fsdp_layout in its metadata");
  std::vector<dist::ParamLayout> out;
  std::stringstream lines(meta.at("fsdp_layout"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::stringstream ls(line);
    std::string name, rows, shape;
    ls >> name >> rows >> shape;
    out.push_back({name, dist::parse_shape_csv(shape, "checkpoint '" + path + "': fsdp layout of '" + name + "'")});
  }
  return out;
}

// Every way the checkpoint's tensors (`saved` by name; `order`: the parameter names its layout
// lists, empty when it lists none) differ from the loading model's `params` and `buffers`, one per
// line.
std::string differences(const Shapes& saved, const std::vector<std::string>& order,
                        const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers) {
  std::ostringstream err;
  for (const auto& p : params) {
    auto it = saved.find(p.name);
    if (it == saved.end()) err << "\n  parameter '" << p.name << "' " << shape_str(p.shape) << " is not in the checkpoint";
    else if (it->second != p.shape)
      err << "\n  parameter '" << p.name << "' is " << shape_str(it->second) << " in the checkpoint, " << shape_str(p.shape)
          << " in this model";
  }
  std::set<std::string> known = buffers;
  for (const auto& p : params) known.insert(p.name);
  for (const auto& [name, shape] : saved)
    if (!known.count(name)) err << "\n  the checkpoint's '" << name << "' " << shape_str(shape) << " is not in this model";
  if (!order.empty()) {
    std::vector<std::string> mine;
    for (const auto& p : params) mine.push_back(p.name);
    if (err.str().empty() && order != mine) err << "\n  the checkpoint lists the parameters in another order";
  }
  return err.str();
}

void check_fits(const std::string& path, const Shapes& saved, const std::vector<std::string>& order,
                const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers) {
  std::string diff = differences(saved, order, params, buffers);
  TG_CHECK(diff.empty(), "checkpoint '", path, "' does not fit this model:", diff);
}

// The optimizer state of each rank's zero1 file ("optim." dropped).
std::vector<nn::StateDict> zero1_blocks(const std::string& path, int64_t ranks) {
  std::vector<nn::StateDict> out;
  for (auto& file : rank_files(path, "zero1", ranks)) {
    nn::StateDict state;
    for (auto& [k, v] : file)
      if (k.rfind("optim.", 0) == 0) state.emplace(k.substr(6), v);
    out.push_back(std::move(state));
  }
  return out;
}

}  // namespace

int64_t metadata_int(const nn::Metadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  TG_CHECK(it != meta.end(), "checkpoint '", path, "' has no \"", key, "\" in its metadata");
  const std::string& s = it->second;
  int64_t v = -1;
  bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TG_CHECK(digits && ec == std::errc() && end == s.data() + s.size(), "checkpoint '", path, "': metadata ", key, "=\"",
           s, "\" is not a non-negative integer");
  return v;
}

FullCheckpoint read_full_checkpoint(const std::string& path, const nn::Metadata& meta,
                                    const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers) {
  const int64_t fsdp_ranks = rank_count(meta, "fsdp_ranks", path), zero1_ranks = rank_count(meta, "zero1_ranks", path);
  TG_CHECK(!(fsdp_ranks && zero1_ranks), "checkpoint '", path, "' names both fsdp and zero1 shards");
  FullCheckpoint out;
  for (auto& [k, v] : nn::safe_load(path)) {
    if (k.rfind("model.", 0) == 0) out.model.emplace(k.substr(6), v);
    else if (k.rfind("optim.", 0) == 0) out.optim.emplace(k.substr(6), v);
  }
  if (fsdp_ranks) {  // the layout gives the global shapes: checked before the shards are read
    std::vector<dist::ParamLayout> layout = fsdp_params(path, meta);
    Shapes saved;
    std::vector<std::string> order;
    for (auto& p : layout) {
      saved.emplace(p.name, p.shape);
      order.push_back(p.name);
    }
    for (auto& [name, v] : out.model) saved.emplace(name, v.shape());  // the buffers
    check_fits(path, saved, order, params, buffers);
    auto [model, optim] = dist::unshard_checkpoint(rank_files(path, "fsdp", fsdp_ranks), meta);
    out.model.merge(model);
    out.optim = std::move(optim);
    return out;
  }
  std::vector<dist::ParamLayout> layout = dist::zero1_layout(meta);
  std::vector<std::string> order;
  for (auto& p : layout) order.push_back(p.name);
  check_fits(path, shapes_of(out.model), order, params, buffers);
  if (zero1_ranks)  // a layout-less zero1 checkpoint was written before zero1_layout: Note [zero1 checkpoints]
    out.optim = dist::unshard_zero1_optimizer(zero1_blocks(path, zero1_ranks), layout.empty() ? params : layout);
  return out;
}

std::string shard_path(const std::string& checkpoint, int rank, const std::string& strategy) {
  std::string base = checkpoint.substr(0, checkpoint.size() - std::string(".safetensors").size());
  return base + "." + strategy + "-rank" + std::to_string(rank) + ".safetensors";
}

}  // namespace tg::launcher
