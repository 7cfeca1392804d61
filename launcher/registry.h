// Models and datasets by name, so a config names them (`model.name: cnn`). The built-in ones
// (models mlp and cnn, datasets fashion_mnist, tokens and text) are registered here; a user's own
// adds itself with one line at namespace scope in any source file linked into the program, with
// the config keys it reads, if any, that are not built in (each with type, default, help and an
// optional check; Note [registered config keys] in config.cpp):
//
//   TG_REGISTER_MODEL("tiny", [](const tg::launcher::Config& c) {
//     return std::make_unique<MyNet>(c.get_ints("model.hidden"));
//   });
//   TG_REGISTER_DATASET("my_data", [](const tg::launcher::Config& c) { return load_mine(c); },
//                       {{"data.my_size", tg::launcher::ValueType::Int, int64_t{100}, "my_data: examples",
//                         tg::launcher::int_at_least(1)}});
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "tinygrad/nn/data.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/module.h"

namespace tg::launcher {

// A dataset as the trainer sees it: the examples it trains on and those it evaluates on (the
// test set of fashion_mnist; the validation split of tokens and text), each batched by a
// DataLoader (tinygrad/nn/data.h). Examples are pairs x, y of any dtype and shape: normalised
// images and labels (image_splits), windows of tokens (tinygrad/nn/tokens.h), or a user's own.
// What the examples are for, which decides the trainer's loss and evaluation (Note [training
// tasks] in trainer.cpp): a label per example, or the next token at every position.
enum class Task { Classify, NextToken };

struct DataSplits {
  std::shared_ptr<const nn::Examples> train, test;
  int64_t num_classes = 0;  // a classifier's classes, or a token dataset's vocabulary size (0: not known)
  Task task = Task::Classify;
};

// Images and labels as splits: x = (pixel / 255 - mean) / std in float32, y the int32 label.
DataSplits image_splits(nn::Dataset train, nn::Dataset test, double mean, double std, int64_t num_classes);

using ModelFactory = std::function<std::unique_ptr<nn::Module>(const Config&)>;
using DatasetFactory = std::function<DataSplits(const Config&)>;

// A name -> factory table. Registering a name twice is an error (it names the name).
template <class Factory>
class Registry {
 public:
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}
  void add(const std::string& name, Factory f);
  bool has(const std::string& name) const { return table_.count(name) > 0; }
  const Factory& get(const std::string& name) const;  // throws naming the known names
  std::vector<std::string> names() const;
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::map<std::string, Factory> table_;
};

// The process-wide registries, with the built-ins already in them.
Registry<ModelFactory>& model_registry();
Registry<DatasetFactory>& dataset_registry();

// By model.name. The mlp's size is checked first against this machine's memory, and a build that
// runs out of memory is an error naming the model (Note [model sizes are checked before the model is built]).
std::unique_ptr<nn::Module> make_model(const Config& cfg);
DataSplits make_dataset(const Config& cfg);                 // by data.name

// model.name=gpt's sizes from the config (model.vocab_size and model.block_size must be set:
// the trainer fills them from the dataset where they are 0).
nn::GPTConfig gpt_config(const Config& cfg);

// The built-in models, also usable directly.
std::unique_ptr<nn::Module> make_mlp(const std::vector<int64_t>& hidden, int64_t in = 784, int64_t classes = 10);
std::unique_ptr<nn::Module> make_mnist_cnn(int64_t classes = 10);

// Registers a model or dataset by name with the config keys it adds (register_config_keys).
void register_model(const std::string& name, ModelFactory f, const std::vector<ConfigField>& keys = {});
void register_dataset(const std::string& name, DatasetFactory f, const std::vector<ConfigField>& keys = {});

struct ModelRegistrar {
  ModelRegistrar(const std::string& name, ModelFactory f, const std::vector<ConfigField>& keys = {}) {
    register_model(name, std::move(f), keys);
  }
};
struct DatasetRegistrar {
  DatasetRegistrar(const std::string& name, DatasetFactory f, const std::vector<ConfigField>& keys = {}) {
    register_dataset(name, std::move(f), keys);
  }
};

}  // namespace tg::launcher

#define TG_LAUNCHER_CAT2(a, b) a##b
#define TG_LAUNCHER_CAT(a, b) TG_LAUNCHER_CAT2(a, b)
// Variadic, so a factory lambda may contain unparenthesised commas; an optional last argument
// lists the config keys it registers.
#define TG_REGISTER_MODEL(name, ...) \
  static ::tg::launcher::ModelRegistrar TG_LAUNCHER_CAT(tg_model_registrar_, __LINE__)(name, __VA_ARGS__)
#define TG_REGISTER_DATASET(name, ...) \
  static ::tg::launcher::DatasetRegistrar TG_LAUNCHER_CAT(tg_dataset_registrar_, __LINE__)(name, __VA_ARGS__)
