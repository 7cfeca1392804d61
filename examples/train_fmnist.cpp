// Trains an MLP on Fashion-MNIST with the library API directly (no CLI, no config):
// data loader -> model -> loss -> backward -> Adam step, then test accuracy per epoch.
//
//   train_fmnist [epochs=2] [batch=128] [lr=0.001] [hidden=256]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tinygrad/nn/data.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"

using namespace tg;

namespace {

double arg(int argc, char** argv, const char* key, double fallback) {
  std::string prefix = std::string(key) + "=";
  for (int i = 1; i < argc; i++)
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::atof(argv[i] + prefix.size());
  return fallback;
}

double accuracy(nn::Module& model, nn::DataLoader& loader) {
  NoGradGuard no_grad;
  model.train(false);
  int64_t correct = 0, seen = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    Tensor hits = model(batch->x).argmax(-1).eq(batch->y).sum();
    correct += hits.item<int64_t>();
    seen += batch->y.shape(0);
  }
  model.train(true);
  return static_cast<double>(correct) / static_cast<double>(seen);
}

}  // namespace

int main(int argc, char** argv) try {
  auto epochs = static_cast<int64_t>(arg(argc, argv, "epochs", 2));
  auto batch = static_cast<int64_t>(arg(argc, argv, "batch", 128));
  auto hidden = static_cast<int64_t>(arg(argc, argv, "hidden", 256));
  double lr = arg(argc, argv, "lr", 1e-3);
  Tensor::manual_seed(0);

  nn::Dataset train = nn::fashion_mnist("train"), test = nn::fashion_mnist("test");
  nn::DataLoader train_loader(train, {.batch_size = batch, .shuffle = true, .seed = 0, .mean = 0.2860, .std = 0.3530});
  nn::DataLoader test_loader(test, {.batch_size = 1000, .shuffle = false, .mean = 0.2860, .std = 0.3530});

  nn::Sequential model(std::make_unique<nn::Flatten>(), std::make_unique<nn::Linear>(784, hidden),
                       std::make_unique<nn::ReLU>(), std::make_unique<nn::Linear>(hidden, 10));
  nn::Adam opt(model.parameters(), lr);
  std::printf("training MLP 784-%lld-10 on Fashion-MNIST: %lld examples, batch %lld, %lld epochs\n",
              static_cast<long long>(hidden), static_cast<long long>(train.size()), static_cast<long long>(batch),
              static_cast<long long>(epochs));

  for (int64_t epoch = 0; epoch < epochs; epoch++) {
    auto t0 = std::chrono::steady_clock::now();
    train_loader.start_epoch(epoch);
    int64_t step = 0;
    while (auto b = train_loader.next()) {
      Tensor loss = model(b->x).sparse_categorical_crossentropy(b->y);
      opt.zero_grad();
      loss.backward();
      opt.step({loss});  // the loss is computed in the same schedule as the update
      if (++step % 100 == 0) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("epoch %lld step %4lld  loss %.4f  %.0f examples/s\n", static_cast<long long>(epoch),
                    static_cast<long long>(step), loss.item<float>(), static_cast<double>(step * batch) / s);
        std::fflush(stdout);
      }
    }
    std::printf("epoch %lld: test accuracy %.2f%%\n", static_cast<long long>(epoch), 100 * accuracy(model, test_loader));
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
