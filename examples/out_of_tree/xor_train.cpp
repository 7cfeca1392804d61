// An out-of-tree program on the installed tinygrad++: it registers a dataset (noisy XOR points)
// and a model (an MLP whose width is its own config key) with the launcher, trains them through
// run_train as `tg train` would, and checks that the test accuracy reached 95%.
//
//   xor_train RUN_DIR [key=value ...]    exit status 0 when the accuracy is reached
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "tinygrad/nn/layers.h"

namespace {

using tg::launcher::Config;

// Points around the four corners of [-1, 1]^2; the label is 1 where the signs differ.
class XorPoints : public tg::nn::Examples {
 public:
  XorPoints(int64_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> noise(0.0f, 0.15f);
    for (int64_t i = 0; i < n; i++) {
      int a = static_cast<int>(i % 2), b = static_cast<int>((i / 2) % 2);
      xs_.push_back((a ? 1.0f : -1.0f) + noise(gen));
      xs_.push_back((b ? 1.0f : -1.0f) + noise(gen));
      ys_.push_back(a ^ b);
    }
  }
  int64_t size() const override { return static_cast<int64_t>(ys_.size()); }
  tg::DType x_dtype() const override { return tg::DType::Float32; }
  tg::Shape x_shape() const override { return {2}; }
  tg::DType y_dtype() const override { return tg::DType::Int32; }
  tg::Shape y_shape() const override { return {}; }
  void gather(const int64_t* ids, int64_t n, void* x, void* y) const override {
    auto* xo = static_cast<float*>(x);
    auto* yo = static_cast<int32_t*>(y);
    for (int64_t i = 0; i < n; i++) {
      xo[2 * i] = xs_[static_cast<size_t>(2 * ids[i])];
      xo[2 * i + 1] = xs_[static_cast<size_t>(2 * ids[i] + 1)];
      yo[i] = ys_[static_cast<size_t>(ids[i])];
    }
  }

 private:
  std::vector<float> xs_;
  std::vector<int32_t> ys_;
};

TG_REGISTER_DATASET("xor_points", [](const Config&) {
  return tg::launcher::DataSplits{std::make_shared<XorPoints>(512, 1), std::make_shared<XorPoints>(128, 2), 2};
});

TG_REGISTER_MODEL("xor_mlp",
                  [](const Config& c) -> std::unique_ptr<tg::nn::Module> {
                    const int64_t width = c.get_int("model.xor_width");
                    return std::make_unique<tg::nn::Sequential>(std::make_unique<tg::nn::Linear>(2, width),
                                                                std::make_unique<tg::nn::Tanh>(),
                                                                std::make_unique<tg::nn::Linear>(width, 2));
                  },
                  {{"model.xor_width", tg::launcher::ValueType::Int, int64_t{16}, "xor_mlp: hidden width",
                    tg::launcher::int_at_least(1)}});

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: xor_train RUN_DIR [key=value ...]\n");
    return 2;
  }
  std::vector<std::string> overrides{"train.run_dir=" + std::string(argv[1]), "train.overwrite=true"};
  for (int i = 2; i < argc; i++) overrides.emplace_back(argv[i]);
  const std::string yaml =
      "model: {name: xor_mlp}\n"
      "data: {name: xor_points, batch_size: 32}\n"
      "optim: {name: adam, lr: 0.03}\n"
      "train: {steps: 200, log_every: 50, progress: plain, print_every: 50}\n";
  Config cfg = tg::launcher::parse_config(yaml, "xor_train", overrides);
  tg::launcher::TrainSummary sum = tg::launcher::run_train(cfg);
  const double acc = sum.accuracy.value_or(0.0);
  std::printf("xor_train: %lld steps, test accuracy %.3f\n", static_cast<long long>(sum.steps), acc);
  if (acc < 0.95) {
    std::fprintf(stderr, "xor_train: the accuracy %.3f is below 0.95\n", acc);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
