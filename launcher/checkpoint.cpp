// Reading checkpoints of any strategy and world size as full tensors (see checkpoint.h).
#include "launcher/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <sstream>

#include "distributed/fsdp.h"
#include "launcher/checkpoint_pieces.h"
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
// per-parameter optimizer state a data-parallel optimizer holds, of which it reads only the
// elements the loading rank keeps (Note [reading what a rank needs]). The loading trainer then takes
// its part: none and ddp the whole, zero1 its block of the flattened state
// (Zero1::load_full_optimizer_state), fsdp its rows (Fsdp::reload_parameters,
// load_full_optimizer_state). Resharding copies values and never computes them, so the
// parameters and optimizer state a run resumes from are bit for bit those saved; what follows
// differs from the saving run only where the new layout sums the gradients in another order.
// Before anything is assembled the checkpoint's tensors are checked against the loading model
// (every parameter's name and global shape, nothing but buffers besides, and the order a layout
// records, which the optimizer state's indices follow), from the files' headers alone, so a
// checkpoint of another model fails with every difference named before any tensor data is read,
// and nothing of the run directory is written before a load succeeds (run_train loads first).
// Tensor parallel and train.devices runs write plain checkpoints (their tensors gathered whole
// by safe_save) and load full tensors into their layouts (Module::load_state_dict and
// Optimizer::load_state_dict keep each tensor's devices), so they reshard like ddp.
namespace {

// The rank count of `key` in the metadata (a positive integer), or 0 when the key is absent.
int64_t rank_count(const nn::Metadata& meta, const std::string& key, const std::string& path) {
  if (!meta.count(key)) return 0;
  int64_t n = metadata_int(meta, key, path);
  TG_CHECK(n > 0, "checkpoint '", path, "': metadata ", key, "=0");
  return n;
}

using Shapes = std::map<std::string, Shape>;

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape rows_first(const Shape& s) { return s.empty() ? Shape{1} : s; }

// A parameter of an fsdp layout: its name, global shape and rows per shard.
struct FsdpEntry {
  dist::ParamLayout param;
  int64_t rows = 0;
};

// The parameters an fsdp layout lists ("<name> <rows> <shape>" lines), in order.
std::vector<FsdpEntry> fsdp_entries(const std::string& path, const nn::Metadata& meta) {
  TG_CHECK(meta.count("fsdp_layout"), "checkpoint '", path, "' has fsdp_ranks but no fsdp_layout in its metadata");
  std::vector<FsdpEntry> out;
  std::stringstream lines(meta.at("fsdp_layout"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::stringstream ls(line);
    std::string name, shape;
    int64_t rows = -1;
    ls >> name >> rows >> shape;
    TG_CHECK(!name.empty() && rows >= 0, "checkpoint '", path, "': fsdp layout line '", line, "' is not \"<name> <rows> <shape>\"");
    out.push_back({{name, dist::parse_shape_csv(shape, "checkpoint '" + path + "': fsdp layout of '" + name + "'")}, rows});
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

// Where the full tensors of a checkpoint lie (no data read yet).
struct StoredCheckpoint {
  std::map<std::string, StoredTensor> model, optim;  // by parameter or buffer name; by "<i>.<state>" and "step"
};

StoredTensor whole_of(nn::SafeReader& file, const std::string& entry) {
  const nn::SafeTensorInfo& info = file.entry(entry);
  return {info.dtype, info.shape, {{&file, entry, 0, numel_of(info.shape), 0}}};
}

// The main file's tensors: "model.<name>" and "optim.<key>", whole.
void add_main_file(StoredCheckpoint& sc, nn::SafeReader& main) {
  for (const auto& [k, info] : main.entries()) {
    if (k.rfind("model.", 0) == 0) sc.model.emplace(k.substr(6), whole_of(main, k));
    else if (k.rfind("optim.", 0) == 0) sc.optim.emplace(k.substr(6), whole_of(main, k));
  }
}

std::vector<nn::SafeReader*> rank_files(CheckpointFiles& files, const std::string& path, const std::string& strategy,
                                        int64_t ranks) {
  std::vector<nn::SafeReader*> out;
  for (int64_t r = 0; r < ranks; r++) out.push_back(&files.open(shard_path(path, static_cast<int>(r), strategy)));
  return out;
}

// Note [fsdp checkpoints] in distributed/fsdp.cpp: rank s's file holds rows [s * rows, (s + 1) *
// rows) of every parameter and of its optimizer state, padded; the padding is no piece.
void add_fsdp_shards(StoredCheckpoint& sc, const std::vector<nn::SafeReader*>& shards, const std::vector<FsdpEntry>& layout) {
  auto rows_of = [&](const FsdpEntry& e, const std::string& key) {
    StoredTensor t{DType::Float32, e.param.shape, {}};
    Shape shard_shape = rows_first(e.param.shape);
    const int64_t d0 = shard_shape[0], inner = d0 > 0 ? numel_of(shard_shape) / d0 : 0;
    shard_shape[0] = e.rows;
    for (size_t s = 0; s < shards.size(); s++) {
      const nn::SafeTensorInfo& info = shards[s]->entry(key);
      TG_CHECK(info.shape == shard_shape, "fsdp checkpoint '", shards[s]->path(), "': '", key, "' is ", shape_str(info.shape),
               "; the layout makes it ", shape_str(shard_shape));
      t.dtype = info.dtype;
      const int64_t begin = std::min(d0, static_cast<int64_t>(s) * e.rows), end = std::min(d0, begin + e.rows);
      if (end > begin) t.pieces.push_back({shards[s], key, begin * inner, (end - begin) * inner, 0});
    }
    return t;
  };
  for (const auto& e : layout) sc.model.emplace(e.param.name, rows_of(e, "model." + e.param.name));
  for (const auto& [k, info] : shards[0]->entries()) {
    if (k.rfind("optim.", 0) != 0) continue;
    const std::string key = k.substr(6);
    const int64_t i = dist::split_state_key(key).first;
    TG_CHECK(i < static_cast<int64_t>(layout.size()), "fsdp checkpoint '", shards[0]->path(), "': optimizer state '", key,
             "' names parameter ", i, " of ", layout.size());
    sc.optim.emplace(key, i < 0 ? whole_of(*shards[0], k) : rows_of(layout[static_cast<size_t>(i)], k));
  }
}

// Note [zero1 checkpoints] in distributed/zero.cpp: rank s's file holds block s ("0.<state>") of
// the parameters' states flattened in the layout's order and padded; parameter j's state is the
// pieces of the blocks that overlap its stretch of the flat vector.
void add_zero1_blocks(StoredCheckpoint& sc, const std::vector<nn::SafeReader*>& blocks, const std::vector<dist::ParamLayout>& layout) {
  TG_CHECK(!layout.empty(), "zero1 checkpoint '", blocks[0]->path(), "': no parameters");
  int64_t total = 0;
  for (const auto& p : layout) total += numel_of(p.shape);
  const auto n = static_cast<int64_t>(blocks.size());
  const int64_t block = dist::zero1_block_size(total, n);
  for (const auto& [k, info] : blocks[0]->entries()) {
    if (k.rfind("optim.", 0) != 0) continue;
    auto [i, state] = dist::split_state_key(k.substr(6));
    if (i < 0) {
      sc.optim.emplace(k.substr(6), whole_of(*blocks[0], k));  // the step count
      continue;
    }
    TG_CHECK(i == 0, "zero1 checkpoint: optimizer state '", k.substr(6), "' (a zero1 optimizer holds one flat block, '0.*')");
    DType dtype = info.dtype;
    for (int64_t s = 0; s < n; s++) {
      const nn::SafeTensorInfo& b = blocks[static_cast<size_t>(s)]->entry(k);
      TG_CHECK(b.shape == Shape{block}, "zero1 checkpoint: rank ", s, "'s '", k.substr(6), "' is ", shape_str(b.shape), "; ",
               layout.size(), " parameters of ", total, " elements over ", n, " ranks make blocks of ", block,
               " (a checkpoint of another model?)");
      TG_CHECK(b.dtype == dtype, "zero1 checkpoint: rank ", s, "'s '", k.substr(6), "' is ", dtype_name(b.dtype), ", rank 0's ",
               dtype_name(dtype));
    }
    int64_t offset = 0;
    for (size_t j = 0; j < layout.size(); j++) {
      const int64_t numel = numel_of(layout[j].shape);
      StoredTensor t{dtype, layout[j].shape, {}};
      for (int64_t s = 0; s < n; s++) {
        const int64_t lo = std::max(offset, s * block), hi = std::min(offset + numel, (s + 1) * block);
        if (lo < hi) t.pieces.push_back({blocks[static_cast<size_t>(s)], k, lo - offset, hi - lo, lo - s * block});
      }
      sc.optim.emplace(std::to_string(j) + "." + state, std::move(t));
      offset += numel;
    }
  }
}

// Note [reading what a rank needs]: resharding a checkpoint only copies, so a rank need read
// nothing but what its strategy keeps of the full tensors: one process, ddp, train.devices and
// tensor parallel keep everything; fsdp its rows of each parameter and of its optimizer state
// (Note [fsdp shards]); zero1 every parameter and its block of the flattened optimizer state.
// The full tensors are assembled on the host from exactly those elements, zeros elsewhere, and
// each strategy cuts its part from them as before, so nothing else changes. A checkpoint is a
// map of pieces (StoredCheckpoint, from the files' headers alone), and a rank reads the bytes of
// the pieces its elements fall in (read_part): fsdp of N ranks from an fsdp checkpoint of N
// reads its own shard file, a quarter of the whole with 4. A tensor of a file read whole is
// verified against its checksum where it is read; one read in part by several ranks is verified
// after the reads by joining the CRC-32s of its parts, which the ranks exchange (verify_parts),
// so a damaged tensor is an error on every rank naming the file and the tensor.
ElementRange wanted(const RankShare& share, const std::vector<dist::ParamLayout>& params, int64_t param, bool state,
                    const Shape& shape) {
  const int64_t numel = numel_of(shape);
  if (share.layout == RankShare::Layout::Whole || !share.group || param < 0) return {0, numel};
  const int64_t rank = share.group->rank(), world = share.group->size();
  if (share.layout == RankShare::Layout::Fsdp) {
    const int64_t rows = dist::fsdp_shard_rows(shape, world), d0 = rows_first(shape)[0], inner = d0 > 0 ? numel / d0 : 0;
    return {std::min(d0, rank * rows) * inner, std::min(d0, (rank + 1) * rows) * inner};
  }
  if (!state) return {0, numel};  // zero1 keeps every parameter
  int64_t total = 0, offset = 0;
  for (size_t i = 0; i < params.size(); i++) {
    if (static_cast<int64_t>(i) == param) offset = total;
    total += numel_of(params[i].shape);
  }
  const int64_t block = dist::zero1_block_size(total, world);
  auto clamp = [&](int64_t v) { return std::clamp(v - offset, int64_t{0}, numel); };
  return {clamp(rank * block), clamp((rank + 1) * block)};
}

// What this rank needs of the checkpoint, read (see read_full_checkpoint); the parts of tensors
// it read go to `parts`.
FullCheckpoint read_rank_part(const std::string& path, const nn::Metadata& meta, const std::vector<dist::ParamLayout>& params,
                              const std::set<std::string>& buffers, const RankShare& share, CheckpointFiles& files,
                              std::vector<PartRead>& parts) {
  const int64_t fsdp_ranks = rank_count(meta, "fsdp_ranks", path), zero1_ranks = rank_count(meta, "zero1_ranks", path);
  TG_CHECK(!(fsdp_ranks && zero1_ranks), "checkpoint '", path, "' names both fsdp and zero1 shards");
  StoredCheckpoint sc;
  add_main_file(sc, files.open(path));
  Shapes saved;
  for (auto& [name, t] : sc.model) saved.emplace(name, t.shape);  // the buffers, for fsdp
  std::vector<std::string> order;
  std::vector<FsdpEntry> fsdp_layout;
  std::vector<dist::ParamLayout> zero1_layout = dist::zero1_layout(meta);
  if (fsdp_ranks) {  // the layout gives the global shapes: checked before the shards are opened
    fsdp_layout = fsdp_entries(path, meta);
    for (auto& e : fsdp_layout) saved.emplace(e.param.name, e.param.shape);
    for (auto& e : fsdp_layout) order.push_back(e.param.name);
  }
  for (auto& p : zero1_layout) order.push_back(p.name);
  check_fits(path, saved, order, params, buffers);
  if (fsdp_ranks) add_fsdp_shards(sc, rank_files(files, path, "fsdp", fsdp_ranks), fsdp_layout);
  if (zero1_ranks)  // a layout-less zero1 checkpoint was written before zero1_layout: Note [zero1 checkpoints]
    add_zero1_blocks(sc, rank_files(files, path, "zero1", zero1_ranks), zero1_layout.empty() ? params : zero1_layout);
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < params.size(); i++) index.emplace(params[i].name, static_cast<int64_t>(i));
  FullCheckpoint out;
  for (auto& [name, t] : sc.model) {
    auto it = index.find(name);
    out.model.emplace(name, read_part(t, wanted(share, params, it == index.end() ? -1 : it->second, false, t.shape), parts));
  }
  for (auto& [key, t] : sc.optim) {
    const int64_t i = dist::split_state_key(key).first;
    out.optim.emplace(key, read_part(t, wanted(share, params, i < static_cast<int64_t>(params.size()) ? i : -1, true, t.shape), parts));
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
                                    const std::vector<dist::ParamLayout>& params, const std::set<std::string>& buffers,
                                    const RankShare& share) {
  CheckpointFiles files;
  std::vector<PartRead> parts;
  if (!share.group) return read_rank_part(path, meta, params, buffers, share, files, parts);
  FullCheckpoint out;
  std::string error;
  try {
    out = read_rank_part(path, meta, params, buffers, share, files, parts);
  } catch (const std::exception& e) {
    error = e.what();
  }
  verify_parts(*share.group, parts, error, files);  // every rank, so that an error of one is an error of all
  return out;
}

std::string shard_path(const std::string& checkpoint, int rank, const std::string& strategy) {
  std::string base = checkpoint.substr(0, checkpoint.size() - std::string(".safetensors").size());
  return base + "." + strategy + "-rank" + std::to_string(rank) + ".safetensors";
}

}  // namespace tg::launcher
