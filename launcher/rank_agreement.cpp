// The ranks' agreement check before a distributed run trains (see rank_agreement.h): canonical
// texts of the config, world layout and model, their digests, and the exchange that compares
// them with rank 0's and names the first differences on every rank.
#include "launcher/rank_agreement.h"

#include "distributed/host_exchange.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <map>
#include <sstream>

#include "tinygrad/error.h"

namespace tg::launcher {

// Note [ranks agree before they train]: data parallelism assumes that every rank runs the same
// program on the same model: the parameter broadcast and every gradient all-reduce send buffers
// whose sizes each rank derives from its own model. When the ranks' configs differ, the
// collectives do not fail cleanly: a wider MLP on rank 0 ends inside MPI with MPI_ERR_TRUNCATE,
// an MLP against a CNN corrupts the heap, and a different batch size or learning rate trains to
// the end with no word. So, before the first collective that depends on them, the ranks compare:
//   1. in run_train, right after the process group exists: the resolved config and the world
//      layout (config_agreement_text), before the run directory is chosen or the data loaded;
//   2. in the Trainer, after the model is built and before its parameters are broadcast: the
//      model's tensors, names, dtypes and shapes (model_agreement_text), which also catches
//      builds whose models differ for the same config (a user's model registered differently).
// Each comparison is one all-gather of a 64-bit digest per rank, so that agreeing ranks pay one
// small collective. Only when some digest differs do the texts travel: rank 0's and that of the
// lowest differing rank are broadcast (their length first, then their bytes), so that every rank
// names the same first differences, line by line, and throws. Every rank makes the same
// decisions from the same gathered digests, so the collectives stay matched on all of them.

// Note [keys that may differ per rank]: rank 0 alone chooses, prepares and writes the run
// directory (the others receive its choice), so train.run_dir and train.overwrite matter on
// rank 0 only. train.device names each rank's own device: ranks sharing a host give each its
// own GPU (CUDA:0 on rank 0, CUDA:1 on rank 1). Every other key shapes the model, the data
// order, the optimizer or the collectives and must be equal.
const std::vector<std::string>& per_rank_config_keys() {
  static const std::vector<std::string> keys = {"train.run_dir", "train.overwrite", "train.device"};
  return keys;
}

namespace {

// Exact text of a config value (floats in their shortest round-trip form, so 0.001 and
// 0.0010000001 differ).
std::string exact_text(const Value& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *d);
    return std::string(buf, end);
  }
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  std::string out = "[";
  for (int64_t x : std::get<std::vector<int64_t>>(v)) out += (out.size() > 1 ? ", " : "") + std::to_string(x);
  return out + "]";
}

std::string shape_text(const Tensor& t) {
  std::string out = std::string(dtype_name(t.dtype())) + "[";
  for (size_t i = 0; i < t.shape().size(); i++) out += (i ? "," : "") + std::to_string(t.shape()[i]);
  return out + "]";
}

// A canonical text's lines as (name, value), in order; a line is "name = value".
std::vector<std::pair<std::string, std::string>> lines_of(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find(" = ");
    if (eq == std::string::npos) out.emplace_back(line, "");
    else out.emplace_back(line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

// Root's text on every rank: its length, then its bytes packed into int64 words.
std::string broadcast_text(dist::ProcessGroup& group, const std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  dist::broadcast_host(group, &length, 1, DType::Int64, root);
  std::vector<int64_t> words((static_cast<size_t>(length) + 7) / 8, 0);
  if (group.rank() == root) std::memcpy(words.data(), text.data(), text.size());
  if (!words.empty()) dist::broadcast_host(group, words.data(), words.size(), DType::Int64, root);
  std::string out(static_cast<size_t>(length), '\0');
  std::memcpy(out.data(), words.data(), out.size());
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

std::string config_agreement_text(const Config& cfg, const dist::ProcessGroup& group) {
  const auto& skip = per_rank_config_keys();
  std::string out;
  for (const auto& f : config_schema()) {
    if (std::find(skip.begin(), skip.end(), f.key) != skip.end()) continue;  // Note [keys that may differ per rank]
    out += f.key + " = " + exact_text(cfg.values().at(f.key)) + "\n";
  }
  out += "world size = " + std::to_string(group.size()) + "\n";
  out += "world backend = " + group.backend() + "\n";
  out += "world size from the launcher = " + std::to_string(dist::env_world_size()) + "\n";
  return out;
}

std::string model_agreement_text(const nn::Module& model) {
  std::map<std::string, bool> is_parameter;
  for (const auto& [name, p] : model.named_parameters()) is_parameter[name] = true;
  std::string out;
  for (const auto& [name, t] : model.state_dict())
    out += std::string(is_parameter.count(name) ? "parameter " : "buffer ") + name + " = " + shape_text(t) + "\n";
  return out;
}

uint64_t digest64(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<std::string> text_differences(const std::string& rank0_text, const std::string& other_text, int other_rank,
                                          size_t limit) {
  auto ref = lines_of(rank0_text), other = lines_of(other_text);
  std::map<std::string, std::string> ref_value(ref.begin(), ref.end()), other_value(other.begin(), other.end());
  const std::string on_other = " on rank " + std::to_string(other_rank), on_0 = " on rank 0";
  std::vector<std::string> all;
  for (const auto& [name, value] : ref) {
    auto it = other_value.find(name);
    if (it == other_value.end()) all.push_back(name + ": missing" + on_other + ", " + value + on_0);
    else if (it->second != value) all.push_back(name + ": " + it->second + on_other + ", " + value + on_0);
  }
  for (const auto& [name, value] : other)
    if (!ref_value.count(name)) all.push_back(name + ": " + value + on_other + ", missing" + on_0);
  if (all.size() > limit) {
    size_t more = all.size() - limit;
    all.resize(limit);
    all.push_back("(and " + std::to_string(more) + " more difference" + (more > 1 ? "s" : "") + ")");
  }
  return all;
}

void check_ranks_agree(dist::ProcessGroup& group, const std::string& what, const std::string& text) {
  // Note [ranks agree before they train]
  const int n = group.size();
  if (n < 2) return;
  int64_t mine = std::bit_cast<int64_t>(digest64(text));
  std::vector<int64_t> digests(static_cast<size_t>(n));
  dist::all_gather_host(group, &mine, digests.data(), 1, DType::Int64);
  std::vector<int> differing;
  for (int r = 1; r < n; r++)
    if (digests[static_cast<size_t>(r)] != digests[0]) differing.push_back(r);
  if (differing.empty()) return;
  const int first = differing.front();
  const std::string rank0_text = broadcast_text(group, text, 0);
  const std::string first_text = broadcast_text(group, text, first);
  std::string msg = "the ranks disagree on the " + what + " before training: rank" + (differing.size() > 1 ? "s " : " ") +
                    rank_list(differing) + (differing.size() > 1 ? " differ" : " differs") + " from rank 0 (this is rank " +
                    std::to_string(group.rank()) + " of " + std::to_string(n) + ")";
  for (const auto& d : text_differences(rank0_text, first_text, first)) msg += "\n  " + d;
  if (group.rank() != first && digests[static_cast<size_t>(group.rank())] != digests[0]) {
    msg += "\n  and on this rank:";
    for (const auto& d : text_differences(rank0_text, text, group.rank())) msg += "\n  " + d;
  }
  std::string keys;
  for (const auto& k : per_rank_config_keys()) keys += (keys.empty() ? "" : ", ") + k;
  msg += "\nevery rank must train the same config and model (only " + keys + " may differ)";
  throw Error(msg);
}

}  // namespace tg::launcher
