// The model and dataset registries and the built-in entries: the MLP, tinygrad's MNIST CNN,
// Fashion-MNIST, llm.c token shards and byte-level text. Built-ins are added when a registry is
// first used (not by static registrars, which a linker drops from a static library when nothing
// else in their file is referenced).
#include "launcher/registry.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <new>
#include <set>
#include <stdexcept>

#include "tinygrad/error.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/tokens.h"

namespace tg::launcher {

template <class Factory>
void Registry<Factory>::add(const std::string& name, Factory f) {
  TG_CHECK(!name.empty(), "register ", kind_, ": the name is empty");
  TG_CHECK(!table_.count(name), "register ", kind_, " '", name, "': the name is already registered");
  table_[name] = std::move(f);
}

template <class Factory>
const Factory& Registry<Factory>::get(const std::string& name) const {
  auto it = table_.find(name);
  if (it == table_.end()) {
    std::string list;
    for (const auto& n : names()) list += (list.empty() ? "" : ", ") + n;
    throw Error("unknown " + kind_ + " '" + name + "' (registered: " + list + ")");
  }
  return it->second;
}

template <class Factory>
std::vector<std::string> Registry<Factory>::names() const {
  std::vector<std::string> out;
  for (const auto& kv : table_) out.push_back(kv.first);
  return out;
}

template class Registry<ModelFactory>;
template class Registry<DatasetFactory>;

std::unique_ptr<nn::Module> make_mlp(const std::vector<int64_t>& hidden, int64_t in, int64_t classes) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Flatten>();
  int64_t width = in;
  for (int64_t h : hidden) {
    net->emplace<nn::Linear>(width, h);
    net->emplace<nn::ReLU>();
    width = h;
  }
  net->emplace<nn::Linear>(width, classes);
  return net;
}

// tinygrad's examples/beautiful_mnist model: 28x28 -> 24 -> 20 -> pool 10 -> 8 -> 6 -> pool 3.
std::unique_ptr<nn::Module> make_mnist_cnn(int64_t classes) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(1, 32, std::vector<int64_t>{5});
  net->emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(32, 32, std::vector<int64_t>{5});
  net->emplace<nn::ReLU>();
  net->emplace<nn::BatchNorm2d>(32);
  net->emplace<nn::MaxPool2d>(std::vector<int64_t>{2});
  net->emplace<nn::Conv2d>(32, 64, std::vector<int64_t>{3});
  net->emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(64, 64, std::vector<int64_t>{3});
  net->emplace<nn::ReLU>();
  net->emplace<nn::BatchNorm2d>(64);
  net->emplace<nn::MaxPool2d>(std::vector<int64_t>{2});
  net->emplace<nn::Flatten>();
  net->emplace<nn::Linear>(576, classes);
  return net;
}

nn::GPTConfig gpt_config(const Config& c) {
  nn::GPTConfig g;
  g.vocab_size = c.get_int("model.vocab_size");
  g.block_size = c.get_int("model.block_size");
  g.n_layer = c.get_int("model.n_layer");
  g.n_head = c.get_int("model.n_head");
  g.n_embd = c.get_int("model.n_embd");
  g.dropout = c.get_float("model.dropout");
  TG_CHECK(g.vocab_size > 0 && g.block_size > 0, "model gpt: model.vocab_size (", g.vocab_size, ") and model.block_size (",
           g.block_size, ") must be set (0 takes them from the dataset, which the trainer does)");
  return g;
}

namespace {
std::vector<ConfigField> gpt_keys() {
  return {{"model.n_layer", ValueType::Int, int64_t{4}, "gpt: transformer blocks", int_at_least(1)},
          {"model.n_head", ValueType::Int, int64_t{4}, "gpt: attention heads (must divide model.n_embd)", int_at_least(1)},
          {"model.n_embd", ValueType::Int, int64_t{128}, "gpt: width of the residual stream", int_at_least(1)},
          {"model.vocab_size", ValueType::Int, int64_t{0}, "gpt: vocabulary (0: the dataset's)", int_at_least(0)},
          {"model.block_size", ValueType::Int, int64_t{0}, "gpt: longest sequence (0: data.seq_len)", int_at_least(0)},
          {"model.dropout", ValueType::Float, 0.0, "gpt: dropout after embeddings, attention and MLP",
           [](const Value& v) {
             double p = std::get<double>(v);
             return p >= 0 && p < 1 ? std::string() : "must be in [0, 1), got " + std::to_string(p);
           }}};
}
}  // namespace

Registry<ModelFactory>& model_registry() {
  // Note [registered config keys] in config.cpp: the built-ins' keys are registered here.
  static Registry<ModelFactory> r = [] {
    Registry<ModelFactory> m("model");
    m.add("mlp", [](const Config& c) { return make_mlp(c.get_ints("model.hidden")); });
    m.add("cnn", [](const Config&) { return make_mnist_cnn(); });
    m.add("gpt", [](const Config& c) { return std::make_unique<nn::GPT>(gpt_config(c)); });
    register_config_keys("model 'gpt'", gpt_keys());
    return m;
  }();
  return r;
}

DataSplits image_splits(nn::Dataset train, nn::Dataset test, double mean, double std, int64_t num_classes) {
  const double scale = nn::DataLoaderOptions{}.scale;  // 1/255
  return DataSplits{std::make_shared<nn::ImageExamples>(std::move(train), scale, mean, std),
                    std::make_shared<nn::ImageExamples>(std::move(test), scale, mean, std), num_classes};
}

namespace {

namespace fs = std::filesystem;

// GPT-2's vocabulary: what llm.c's version-1 shards hold.
constexpr int64_t GPT2_VOCAB_SIZE = 50257;

// A function, not a namespace-scope constant: a user's static registrar may build the registry
// before this file's constants are initialised.
ConfigField seq_len_key() {
  return {"data.seq_len", ValueType::Int, int64_t{1024},
          "tokens, text: window length T (an example is T+1 tokens: x the first T, y the last T)",
          int_at_least(1)};
}

// The shard files of one split of the `tokens` dataset: the glob in `key`, or, when it is empty,
// llm.c's names in data.root (*_train_*.bin, *_val_*.bin).
std::vector<std::string> shard_files(const Config& c, const std::string& key, const std::string& part) {
  std::string pattern = c.get_string(key);
  std::string what = "dataset tokens: " + key;
  if (pattern.empty()) {
    pattern = (fs::path(c.get_string("data.root")) / ("*_" + part + "_*.bin")).string();
    what += " is empty, so llm.c's " + part + " shards in data.root";
  }
  return nn::glob_files(pattern, what);
}

DataSplits token_splits(const Config& c) {
  const int64_t seq_len = c.get_int("data.seq_len");
  auto train = shard_files(c, "data.train_files", "train"), val = shard_files(c, "data.val_files", "val");
  std::set<std::string> train_set(train.begin(), train.end());
  for (const auto& f : val)
    TG_CHECK(!train_set.count(f), "dataset tokens: '", f, "' is both a training and a validation shard "
             "(data.train_files and data.val_files must match different files)");
  return DataSplits{nn::shard_windows(train, seq_len), nn::shard_windows(val, seq_len), GPT2_VOCAB_SIZE,
                    Task::NextToken};
}

DataSplits text_splits(const Config& c) {
  const std::string& path = c.get_string("data.text_file");
  std::error_code ec;
  TG_CHECK(path != nn::DEFAULT_TEXT_FILE || fs::exists(path, ec), "dataset text: '", path,
           "' not found; install the Debian package jargon-text (scripts/setup.sh does), or set "
           "data.text_file");
  auto t = nn::text_windows(path, c.get_int("data.seq_len"), c.get_float("data.val_fraction"));
  return DataSplits{t.train, t.val, nn::BYTE_VOCAB_SIZE, Task::NextToken};
}

}  // namespace

Registry<DatasetFactory>& dataset_registry() {
  // Note [registered config keys] in config.cpp: the built-ins' keys are registered here, not by
  // register_dataset, which would use this registry while it is being built.
  static Registry<DatasetFactory> r = [] {
    Registry<DatasetFactory> d("dataset");
    d.add("fashion_mnist", [](const Config& c) {
      const std::string& root = c.get_string("data.root");
      return image_splits(nn::fashion_mnist("train", root), nn::fashion_mnist("test", root), 0.2860, 0.3530, 10);
    });
    d.add("tokens", token_splits);
    register_config_keys("dataset 'tokens'",
                         {seq_len_key(),
                          {"data.train_files", ValueType::String, std::string(""),
                           "tokens: glob of the llm.c training shards (empty: data.root/*_train_*.bin)"},
                          {"data.val_files", ValueType::String, std::string(""),
                           "tokens: glob of the llm.c validation shards (empty: data.root/*_val_*.bin)"}});
    d.add("text", text_splits);
    register_config_keys("dataset 'text'",
                         {seq_len_key(),
                          {"data.text_file", ValueType::String, std::string(nn::DEFAULT_TEXT_FILE),
                           "text: a UTF-8 text file, plain or gzipped, tokenized by bytes (vocabulary 256)"},
                          {"data.val_fraction", ValueType::Float, 0.1,
                           "text: the fraction at the end of the text held out for validation",
                           float_in_open_interval(0, 1)}});
    return d;
  }();
  return r;
}

void register_model(const std::string& name, ModelFactory f, const std::vector<ConfigField>& keys) {
  model_registry().add(name, std::move(f));
  register_config_keys("model '" + name + "'", keys);
}

void register_dataset(const std::string& name, DatasetFactory f, const std::vector<ConfigField>& keys) {
  dataset_registry().add(name, std::move(f));
  register_config_keys("dataset '" + name + "'", keys);
}

namespace {

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  for (; bytes >= 1024 && u < 6; u++) bytes /= 1024;
  char buf[64];
  std::snprintf(buf, sizeof buf, u < 6 || bytes < 1e6 ? "%.1f %s" : "%.3g %s", bytes, units[u]);
  return buf;
}

double physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

std::string hidden_text(const Config& cfg) {
  std::string out = "[";
  for (int64_t h : cfg.get_ints("model.hidden")) out += (out.size() > 1 ? ", " : "") + std::to_string(h);
  return out + "]";
}

// Note [model sizes are checked before the model is built]: the built-in MLP's width comes from
// the config, and its parameters are drawn on the host when it is built, so a typo such as
// model.hidden=[1000000000] ended in `std::bad_alloc` (or, for a size the kernel overcommits, in
// the OOM killer later). Its parameter count is computed first (in double: widths up to INT64_MAX
// multiply without overflow) and a model whose float32 parameters alone exceed this machine's
// memory is refused, naming the key and the memory. Any model, a user's too, whose build still
// runs out of memory is reported by name instead of as bad_alloc.
void check_mlp_fits(const Config& cfg) {
  double params = 0, width = 784;
  for (int64_t h : cfg.get_ints("model.hidden")) {
    params += width * static_cast<double>(h) + static_cast<double>(h);
    width = static_cast<double>(h);
  }
  params += width * 10 + 10;
  double need = params * 4, have = physical_memory_bytes();
  char count[32];
  std::snprintf(count, sizeof count, params < 1e15 ? "%.0f" : "%.3g", params);
  TG_CHECK(have == 0 || need <= have, "model.hidden=", hidden_text(cfg), " makes an MLP of ", count, " parameters, ",
           bytes_text(need), " as float32, more than this machine's ", bytes_text(have), " of memory");
}

}  // namespace

std::unique_ptr<nn::Module> make_model(const Config& cfg) {
  const std::string& name = cfg.get_string("model.name");
  if (name == "mlp") check_mlp_fits(cfg);  // Note [model sizes are checked before the model is built]
  try {
    return model_registry().get(name)(cfg);
  } catch (const std::bad_alloc&) {
    throw Error("model '" + name + "' (model.hidden=" + hidden_text(cfg) + ") does not fit in memory: building it failed");
  } catch (const std::length_error&) {
    throw Error("model '" + name + "' (model.hidden=" + hidden_text(cfg) + ") is too large to build");
  }
}
DataSplits make_dataset(const Config& cfg) { return dataset_registry().get(cfg.get_string("data.name"))(cfg); }

}  // namespace tg::launcher
