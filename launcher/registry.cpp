// The model and dataset registries and the built-in entries: the MLP, tinygrad's MNIST CNN and
// Fashion-MNIST. Built-ins are added when a registry is first used (not by static registrars,
// which a linker drops from a static library when nothing else in their file is referenced).
#include "launcher/registry.h"

#include <unistd.h>

#include <cstdio>
#include <new>
#include <stdexcept>

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
