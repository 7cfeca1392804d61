// engine/jit over several devices of one process (Note [a state tensor over several devices] in
// engine/jit.h), on four virtual CPU devices: a data-parallel MLP step (batch sharded inside the
// step, parameters replicated; SGD with momentum, and AdamW under a changing learning rate) and a
// tensor-parallel Linear pair, replayed, give bit-identical losses and parameters to the same
// steps run without the JIT; replays schedule, compile and rewrite nothing; state replaced
// between calls is seen; an input already over several devices is refused with its reason.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tests/multi_util.h"
#include "tests/train_util.h"

using namespace tg;
using tg::testutil::expect_bit_identical;
using tg::testutil::KnobScope;

namespace {

const std::vector<std::string> kFour = {"CPU:0", "CPU:1", "CPU:2", "CPU:3"};
constexpr int kSteps = 5;  // the first runs normally, the second is captured, three replay

std::unique_ptr<nn::Sequential> make_mlp() {
  Tensor::manual_seed(7);
  return std::make_unique<nn::Sequential>(std::make_unique<nn::Linear>(12, 16), std::make_unique<nn::ReLU>(),
                                          std::make_unique<nn::Linear>(16, 4));
}

// Step s's batch of 16 rows, on one device, as a data loader gives it.
std::pair<Tensor, Tensor> batch(int s) { return testutil::global_batch(s, 16); }

enum class Layout { DataParallel, TensorParallel };

using MakeOpt = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor*>)>;
const MakeOpt sgd = [](std::vector<Tensor*> ps) { return std::make_unique<nn::SGD>(std::move(ps), 0.05, 0.9); };
const MakeOpt adamw = [](std::vector<Tensor*> ps) { return std::make_unique<nn::AdamW>(std::move(ps), 1e-2); };

// A training step of `model` over the four devices for a TinyJit: the batch split across them
// (data parallel) or replicated on each (tensor parallel), the loss's gradients, one update.
TinyJit::StepFn mlp_step(nn::Module& model, nn::Optimizer& opt, Layout layout = Layout::DataParallel) {
  return [&model, &opt, layout](const Tensors& in) {
    Tensor x = layout == Layout::DataParallel ? in[0].shard(kFour, 0) : in[0].to(kFour);
    Tensor y = layout == Layout::DataParallel ? in[1].shard(kFour, 0) : in[1].to(kFour);
    Tensor loss = model(x).sparse_categorical_crossentropy(y);
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  };
}

struct Trained : testutil::StepResults {
  int64_t captures = 0, replays = 0;
  std::string disabled_reason;
};

// kSteps steps of the MLP over the four devices, wrapped in a TinyJit (JIT knob = jit), with a
// different learning rate in every step. The losses are read after the last step.
Trained train(Layout layout, const MakeOpt& make_opt, int jit) {
  KnobScope k(knobs::JIT, jit);
  auto model = make_mlp();
  if (layout == Layout::DataParallel)
    for (Tensor* p : model->parameters()) p->shard_(kFour);
  else
    model->tensor_parallel(kFour);
  auto opt = make_opt(model->parameters());
  TinyJit step(mlp_step(*model, *opt, layout));
  Tensors losses;
  for (int s = 0; s < kSteps; s++) {
    opt->lr = 0.01 * (s + 1);
    auto [x, y] = batch(s);
    losses.push_back(step({x, y})[0]);
  }
  Trained r;
  for (auto& l : losses) r.losses.push_back(l.item<float>());
  for (Tensor* p : model->parameters()) {
    Tensors parts = p->shards();
    for (auto& part : parts) r.params.push_back(part.to_vector<float>());  // every device's part
  }
  r.captures = step.captures();
  r.replays = step.replays();
  r.disabled_reason = step.disabled_reason();
  return r;
}

size_t programs_compiled() {
  size_t n = 0;
  for (auto& d : kFour) n += get_device(d).compiled_count();
  return n;
}

}  // namespace

TEST(JitMulti, DataParallelSgdMomentumBitIdenticalToNoJit) {
  Trained jitted = train(Layout::DataParallel, sgd, 1), plain = train(Layout::DataParallel, sgd, 0);
  EXPECT_EQ(jitted.disabled_reason, "");
  EXPECT_EQ(jitted.captures, 1);
  EXPECT_EQ(jitted.replays, kSteps - 2);
  EXPECT_EQ(plain.replays, 0);
  expect_bit_identical(jitted, plain);
}

TEST(JitMulti, DataParallelAdamWBitIdenticalToNoJit) {
  Trained jitted = train(Layout::DataParallel, adamw, 1), plain = train(Layout::DataParallel, adamw, 0);
  EXPECT_EQ(jitted.captures, 1);
  EXPECT_EQ(jitted.replays, kSteps - 2);
  expect_bit_identical(jitted, plain);
}

TEST(JitMulti, TensorParallelLinearPairBitIdenticalToNoJit) {
  Trained jitted = train(Layout::TensorParallel, adamw, 1), plain = train(Layout::TensorParallel, adamw, 0);
  EXPECT_EQ(jitted.disabled_reason, "");
  EXPECT_EQ(jitted.captures, 1);
  EXPECT_EQ(jitted.replays, kSteps - 2);
  expect_bit_identical(jitted, plain);
}

// The captured list holds every device's kernels and the collectives between them: a replay runs
// as many kernels as the capture did, and neither schedules, compiles nor rewrites anything.
TEST(JitMulti, ReplaysScheduleCompileAndRewriteNothing) {
  KnobScope k(knobs::JIT, 1);
  auto model = make_mlp();
  for (Tensor* p : model->parameters()) p->shard_(kFour);
  nn::SGD opt(model->parameters(), 0.05, 0.9);
  TinyJit step(mlp_step(*model, opt));
  auto [x0, y0] = batch(0);
  step({x0, y0});
  auto& c = GlobalCounters::get();
  uint64_t run0 = c.kernels_run;
  MultiStats rewrite0 = multi_stats();
  auto [x1, y1] = batch(1);
  step({x1, y1});  // captured
  uint64_t captured_kernels = c.kernels_run - run0;
  EXPECT_GE(testutil::stats_since(rewrite0).allreduces, 4u) << "one per parameter gradient";
  EXPECT_GT(captured_kernels, 20u) << "every device's forward, backward and update";
  uint64_t sched1 = c.kernels_scheduled, run1 = c.kernels_run;
  size_t programs = programs_compiled();
  MultiStats rewrite1 = multi_stats();
  for (int s = 2; s < 5; s++) {
    auto [x, y] = batch(s);
    step({x, y});
  }
  EXPECT_EQ(step.replays(), 3);
  EXPECT_EQ(c.kernels_scheduled, sched1) << "a replay scheduled kernels";
  EXPECT_EQ(c.kernels_run - run1, 3 * captured_kernels);
  EXPECT_EQ(programs_compiled(), programs) << "a replay compiled a program";
  EXPECT_EQ(testutil::stats_since(rewrite1).allreduces, 0u) << "a replay ran the multi-device rewrite";
}

// Parameters replaced between calls (a checkpoint load) are what the next replay reads, on every device.
TEST(JitMulti, StateReplacedBetweenCallsIsSeen) {
  auto run = [](int jit) {
    KnobScope k(knobs::JIT, jit);
    auto model = make_mlp();
    for (Tensor* p : model->parameters()) p->shard_(kFour);
    nn::SGD opt(model->parameters(), 0.05);
    TinyJit step(mlp_step(*model, opt));
    std::vector<float> losses;
    for (int s = 0; s < 5; s++) {
      if (s == 3)
        for (Tensor* p : model->parameters()) p->assign((*p * 0.5f).realize());
      auto [x, y] = batch(s);
      losses.push_back(step({x, y})[0].item<float>());
    }
    return std::make_pair(losses, step.replays());
  };
  auto [jitted, replays] = run(1);
  auto [plain, none] = run(0);
  EXPECT_EQ(replays, 3);
  EXPECT_EQ(jitted, plain);
}

TEST(JitMulti, InputOverSeveralDevicesIsRefusedWithItsReason) {
  KnobScope k(knobs::JIT, 1);
  auto model = make_mlp();
  for (Tensor* p : model->parameters()) p->shard_(kFour);
  TinyJit step([&](const Tensors& in) { return Tensors{(*model)(in[0]).sum()}; });
  for (int s = 0; s < 3; s++) {
    Tensor x = batch(s).first;
    float want = (*model)(x.shard(kFour, 0)).sum().item<float>();
    EXPECT_EQ(step({x.shard(kFour, 0)})[0].item<float>(), want);
  }
  EXPECT_EQ(step.captures(), 0);
  EXPECT_NE(step.disabled_reason().find("over several devices"), std::string::npos) << step.disabled_reason();
}
