// Models and datasets by name, so a config names them (`model.name: cnn`). The built-in ones
// (models mlp and cnn, dataset fashion_mnist) are registered here; a user's own adds itself with
// one line at namespace scope in any source file linked into the program:
//
//   TG_REGISTER_MODEL("tiny", [](const tg::launcher::Config& c) {
//     return std::make_unique<MyNet>(c.get_ints("model.hidden"));
//   });
//   TG_REGISTER_DATASET("my_data", [](const tg::launcher::Config& c) { return load_mine(c.get_string("data.root")); });
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "tinygrad/nn/data.h"
#include "tinygrad/nn/module.h"

namespace tg::launcher {

// A dataset as the trainer sees it: train and test splits and the normalisation of the pixels.
struct DataSplits {
  nn::Dataset train, test;
  double mean = 0.0, std = 1.0;
  int64_t num_classes = 10;
};

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

// The built-in models, also usable directly.
std::unique_ptr<nn::Module> make_mlp(const std::vector<int64_t>& hidden, int64_t in = 784, int64_t classes = 10);
std::unique_ptr<nn::Module> make_mnist_cnn(int64_t classes = 10);

struct ModelRegistrar {
  ModelRegistrar(const std::string& name, ModelFactory f) { model_registry().add(name, std::move(f)); }
};
struct DatasetRegistrar {
  DatasetRegistrar(const std::string& name, DatasetFactory f) { dataset_registry().add(name, std::move(f)); }
};

}  // namespace tg::launcher

#define TG_LAUNCHER_CAT2(a, b) a##b
#define TG_LAUNCHER_CAT(a, b) TG_LAUNCHER_CAT2(a, b)
// Variadic, so a factory lambda may contain unparenthesised commas.
#define TG_REGISTER_MODEL(name, ...) \
  static ::tg::launcher::ModelRegistrar TG_LAUNCHER_CAT(tg_model_registrar_, __LINE__)(name, __VA_ARGS__)
#define TG_REGISTER_DATASET(name, ...) \
  static ::tg::launcher::DatasetRegistrar TG_LAUNCHER_CAT(tg_dataset_registrar_, __LINE__)(name, __VA_ARGS__)
