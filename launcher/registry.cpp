// The model and dataset registries and the built-in entries: the MLP, tinygrad's MNIST CNN and
// Fashion-MNIST. Built-ins are added when a registry is first used (not by static registrars,
// which a linker drops from a static library when nothing else in their file is referenced).
#include "launcher/registry.h"

#include "tinygrad/error.h"
#include "tinygrad/nn/layers.h"

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

Registry<ModelFactory>& model_registry() {
  static Registry<ModelFactory> r = [] {
    Registry<ModelFactory> m("model");
    m.add("mlp", [](const Config& c) { return make_mlp(c.get_ints("model.hidden")); });
    m.add("cnn", [](const Config&) { return make_mnist_cnn(); });
    return m;
  }();
  return r;
}

Registry<DatasetFactory>& dataset_registry() {
  static Registry<DatasetFactory> r = [] {
    Registry<DatasetFactory> d("dataset");
    d.add("fashion_mnist", [](const Config& c) {
      const std::string& root = c.get_string("data.root");
      return DataSplits{nn::fashion_mnist("train", root), nn::fashion_mnist("test", root), 0.2860, 0.3530, 10};
    });
    return d;
  }();
  return r;
}

std::unique_ptr<nn::Module> make_model(const Config& cfg) { return model_registry().get(cfg.get_string("model.name"))(cfg); }
DataSplits make_dataset(const Config& cfg) { return dataset_registry().get(cfg.get_string("data.name"))(cfg); }

}  // namespace tg::launcher
