// The Fashion-MNIST CNN (launcher/registry.h) trained on CUDA against the same steps on the CPU,
// from the same initial weights and batch (random numbers come from the host, so both devices
// draw the same). Label gpu: skipped with the reason where there is no GPU.
//
// Note [max-pool gradients are discontinuous]: a max pool routes its gradient to the largest
// element of each window, so two elements within rounding of each other send it to different
// places on different devices. At batch 64 that moves the gradients of everything before the
// last pool by about 1% (on the CPU alone, adding noise of 1e-6 to the input does the same), and
// the runs drift apart from there. What the pools do not touch is held to float32 rounding: the
// first loss, BatchNorm's running statistics after it (forward only), and the gradients of the
// last BatchNorm and the classifier. The rest is held to 5%, which a wrong kernel misses. Held to
// float32 rounding, the convolutions run as float32 FMAs (TF32=0); on the tensor cores
// (tf32, the default) the same quantities are held to tf32's rounding instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cuda_test.h"
#include "launcher/registry.h"
#include "test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/optim.h"

namespace tg {
namespace {

struct CnnRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> first_grads;  // in parameters() order
  std::vector<std::vector<float>> first_stats;  // buffers() after the first step
};

CnnRun train_cnn(const std::string& device, int steps) {
  testutil::KnobScope on(knobs::DEVICE, device);
  Tensor::manual_seed(7);
  auto model = launcher::make_mnist_cnn();
  nn::Adam opt(model->parameters(), 1e-3);
  Tensor x = Tensor::randn({64, 1, 28, 28}).realize();
  Tensor y = Tensor::randint({64}, 0, 10).realize();
  CnnRun run;
  for (int s = 0; s < steps; s++) {
    Tensor loss = (*model)(x).sparse_categorical_crossentropy(y);
    opt.zero_grad();
    loss.backward();
    if (s == 0)
      for (Tensor* p : model->parameters()) run.first_grads.push_back(p->grad()->to_vector<float>());
    opt.step({loss});
    run.losses.push_back(loss.to_vector<float>()[0]);
    if (s == 0)
      for (Tensor* b : model->buffers())
        if (is_float(b->dtype())) run.first_stats.push_back(b->to_vector<float>());
  }
  return run;
}

// max |a - b| relative to max |b|
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); i++) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class CudaTraining : public testutil::CudaTest {};

// Bounds on the CUDA run against the CPU's (relative): the first loss, BatchNorm's statistics
// after it, and the first gradients of the last BatchNorm and the classifier (parameters 10 to
// 13: four convolutions and a BatchNorm before the last pool come first) and, where
// `before_pool` > 0, of the parameters before it; the later losses within 5%.
struct Bounds {
  double first_loss, stats, after_pool, before_pool;
};
void expect_close(const CnnRun& cuda, const CnnRun& cpu, const Bounds& b) {
  ASSERT_EQ(cuda.losses.size(), cpu.losses.size());
  EXPECT_NEAR(cuda.losses[0], cpu.losses[0], b.first_loss * std::fabs(cpu.losses[0]))
      << "loss of the first step";
  for (size_t s = 1; s < cpu.losses.size(); s++)
    EXPECT_NEAR(cuda.losses[s], cpu.losses[s], 5e-2 * std::fabs(cpu.losses[s])) << "loss of step " << s + 1;
  ASSERT_EQ(cuda.first_stats.size(), cpu.first_stats.size());
  for (size_t i = 0; i < cpu.first_stats.size(); i++)
    EXPECT_LT(relative_error(cuda.first_stats[i], cpu.first_stats[i]), b.stats)
        << "BatchNorm statistic " << i;
  ASSERT_EQ(cpu.first_grads.size(), 14u);
  ASSERT_EQ(cuda.first_grads.size(), cpu.first_grads.size());
  for (size_t i = b.before_pool > 0 ? 0 : 10; i < cpu.first_grads.size(); i++) {
    ASSERT_EQ(cuda.first_grads[i].size(), cpu.first_grads[i].size());
    double bound = i >= 10 ? b.after_pool : b.before_pool;
    EXPECT_LT(relative_error(cuda.first_grads[i], cpu.first_grads[i]), bound) << "gradient of parameter " << i;
  }
}

TEST_F(CudaTraining, CnnStepsMatchTheCpu) {
  testutil::KnobScope fma(knobs::TF32, 0);
  CnnRun cuda = train_cnn("CUDA", 4), cpu = train_cnn("CPU", 4);
  expect_close(cuda, cpu, {.first_loss = 1e-5, .stats = 1e-4, .after_pool = 1e-3, .before_pool = 5e-2});
}

// Convolutions in tf32 (Note [tensor-core contractions] in codegen/tensor_core.cpp): what the
// pools do not touch within tf32's rounding; the gradients before them are not compared.
TEST_F(CudaTraining, CnnStepsOnTensorCoresStayCloseToTheCpu) {
  if (!get_device("CUDA").supports(Feature::TensorCores))
    GTEST_SKIP() << "this GPU has no tf32 tensor cores (sm_80 or newer)";
  CnnRun cuda = train_cnn("CUDA", 4), cpu = train_cnn("CPU", 4);
  expect_close(cuda, cpu, {.first_loss = 1e-3, .stats = 1e-2, .after_pool = 2e-2, .before_pool = 0});
}

}  // namespace
}  // namespace tg
