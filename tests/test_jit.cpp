// engine/jit: a training step wrapped in TinyJit gives bit-identical losses and parameters to the
// same steps run without it (SGD with momentum; Adam and AdamW under a changing learning rate;
// a model with BatchNorm), replays schedule and compile nothing, returned losses stay valid,
// state replaced between calls is seen, a read-only tensor assigned between calls makes a new
// capture, a new input shape gets its own capture, a step that reads the device on the host is
// run normally with its reason, and replays update the state in place (in a copy while something
// else holds it; in new buffers when the update reads other elements). On the default device (DEVICE): test_jit_cuda runs the suite
// on CUDA, whose replays go through CUDA graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "device_env.h"
#include "train_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/knobs.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/tensor_internal.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::expect_bit_identical;
using tg::testutil::KnobScope;

namespace {

std::unique_ptr<Sequential> make_model(bool batchnorm) {
  Tensor::manual_seed(7);
  auto m = std::make_unique<Sequential>();
  m->emplace<Flatten>();
  m->emplace<Linear>(12, 16);
  if (batchnorm) m->emplace<BatchNorm1d>(16);
  m->emplace<ReLU>();
  m->emplace<Linear>(16, 5);
  return m;
}

struct Batch {
  Tensor x, y;
};
// Fresh host tensors every step, as a data loader gives them (`same`: all with the first one's data).
std::vector<Batch> make_batches(int n, int64_t batch = 8, bool same = false) {
  Tensor::manual_seed(11);
  std::vector<Batch> out;
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int i = 0; i < n; i++) {
    if (i == 0 || !same) {
      x = Tensor::randn({batch, 3, 4}).to_vector<float>();
      y = Tensor::randint({batch}, 0, 5).to_vector<int32_t>();
    }
    out.push_back({Tensor::from_vector(x, {batch, 3, 4}), Tensor::from_vector(y, {batch}, {.dtype = DType::Int32})});
  }
  return out;
}

using MakeOpt = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor*>)>;
using LrAt = std::function<double(int)>;

struct Trained : testutil::StepResults {
  int64_t captures = 0, replays = 0;
  int64_t opt_steps = 0;
};

// Trains on `batches` with the step wrapped in a TinyJit (JIT knob = jit). Losses are read only
// after the last step, so each replay's returned loss must outlive the replays after it.
Trained train(bool batchnorm, const MakeOpt& make_opt, const LrAt& lr_at, const std::vector<Batch>& batches, int jit,
              double clip = 0) {
  KnobScope k(knobs::JIT, jit);
  auto model = make_model(batchnorm);
  auto opt = make_opt(model->parameters());
  TinyJit step([&](const Tensors& in) {
    Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
    opt->zero_grad();
    loss.backward();
    if (clip > 0) clip_grad_norm_lazy(opt->params(), clip);
    opt->step({loss});
    return Tensors{loss};
  });
  Tensors losses;
  for (size_t i = 0; i < batches.size(); i++) {
    opt->lr = lr_at(static_cast<int>(i));
    losses.push_back(step({batches[i].x, batches[i].y})[0]);
  }
  Trained r;
  for (auto& l : losses) r.losses.push_back(l.item<float>());
  for (auto& [name, t] : model->state_dict()) r.params.push_back(t.cast(DType::Float32).to_vector<float>());
  r.captures = step.captures();
  r.replays = step.replays();
  r.opt_steps = opt->step_count();
  return r;
}

// The step every test here jits: forward, cross-entropy, backward, an optimizer step; returns the loss.
TinyJit::StepFn training_step(Module& model, Optimizer& opt) {
  return [&model, &opt](const Tensors& in) {
    Tensor loss = model(in[0]).sparse_categorical_crossentropy(in[1]);
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  };
}

const LrAt constant_lr = [](int) { return 0.05; };
// Warm-up then decay: a different lr in every step, including the replayed ones.
const MakeOpt sgd = [](std::vector<Tensor*> ps) { return std::make_unique<SGD>(std::move(ps), 0.05, 0.9); };
const LrAt changing_lr = [](int i) { return i < 3 ? 0.01 * (i + 1) : 0.03 / (1.0 + 0.5 * (i - 2)); };

TEST(Jit, SgdMomentumBitIdenticalToNoJit) {
  auto batches = make_batches(7, 8, true);  // one batch again and again: the loss must fall
  Trained off = train(false, sgd, constant_lr, batches, 0);
  Trained on = train(false, sgd, constant_lr, batches, 1);
  expect_bit_identical(off, on);
  EXPECT_EQ(off.captures, 0);
  EXPECT_EQ(on.captures, 1);
  EXPECT_EQ(on.replays, 5);  // call 1 runs normally, call 2 captures, calls 3..7 replay
  EXPECT_EQ(on.opt_steps, 7);  // replays count the optimizer's steps too
  EXPECT_LT(on.losses.back(), on.losses.front());
}

TEST(Jit, AdamAndAdamWWithChangingLrBitIdenticalToNoJit) {
  auto batches = make_batches(7);
  MakeOpt adam = [](std::vector<Tensor*> ps) { return std::make_unique<Adam>(std::move(ps), 0.01); };
  MakeOpt adamw = [](std::vector<Tensor*> ps) { return std::make_unique<AdamW>(std::move(ps), 0.01, 0.9, 0.999, 1e-8, 0.1); };
  for (auto& make : {adam, adamw}) {
    Trained off = train(false, make, changing_lr, batches, 0);
    Trained on = train(false, make, changing_lr, batches, 1);
    expect_bit_identical(off, on);
    EXPECT_EQ(on.replays, 5);
    // The lr and the bias corrections reach the replayed kernels: a run whose lr stays at its
    // first value ends elsewhere.
    Trained stale = train(false, make, [](int) { return 0.01; }, batches, 1);
    EXPECT_NE(stale.losses.back(), on.losses.back());
  }
}

TEST(Jit, BatchNormRunningStatisticsBitIdenticalToNoJit) {
  auto batches = make_batches(6);
  MakeOpt sgd_decay = [](std::vector<Tensor*> ps) { return std::make_unique<SGD>(std::move(ps), 0.05, 0.9, 0.0, 1e-4); };
  Trained off = train(true, sgd_decay, changing_lr, batches, 0);
  Trained on = train(true, sgd_decay, changing_lr, batches, 1);
  expect_bit_identical(off, on);  // includes running_mean, running_var, num_batches_tracked
  EXPECT_EQ(on.replays, 4);
}

// Clipping built on the device keeps the step replayable; it clips as clip_grad_norm does.
TEST(Jit, LazyGradientClippingIsReplayed) {
  auto batches = make_batches(6);
  Trained off = train(false, sgd, constant_lr, batches, 0, 0.5);
  Trained on = train(false, sgd, constant_lr, batches, 1, 0.5);
  expect_bit_identical(off, on);
  EXPECT_EQ(on.replays, 4);
  Trained unclipped = train(false, sgd, constant_lr, batches, 1);
  EXPECT_NE(unclipped.losses.back(), on.losses.back());  // the clip changed the steps

  for (double max_norm : {0.05, 100.0}) {  // clipping, and a norm already below the bound
    auto model = make_model(false), twin = make_model(false);
    Tensor la = (*model)(batches[0].x).sparse_categorical_crossentropy(batches[0].y);
    Tensor lb = (*twin)(batches[0].x).sparse_categorical_crossentropy(batches[0].y);
    la.backward();
    lb.backward();
    double host = clip_grad_norm(model->parameters(), max_norm);
    float dev = clip_grad_norm_lazy(twin->parameters(), max_norm).item<float>();
    EXPECT_NEAR(dev, host, 1e-5 * host);
    auto pa = model->parameters(), pb = twin->parameters();
    for (size_t i = 0; i < pa.size(); i++) {
      auto ga = pa[i]->grad()->to_vector<float>(), gb = pb[i]->grad()->to_vector<float>();
      for (size_t j = 0; j < ga.size(); j++) EXPECT_NEAR(ga[j], gb[j], 1e-6 + 1e-5 * std::abs(ga[j])) << "max_norm " << max_norm;
    }
  }
}

TEST(Jit, ReplaysScheduleAndCompileNothing) {
  KnobScope k(knobs::JIT, 1);
  auto batches = make_batches(6);
  auto model = make_model(false);
  SGD opt(model->parameters(), 0.05, 0.9);
  TinyJit step(training_step(*model, opt));
  step({batches[0].x, batches[0].y});
  auto& c = GlobalCounters::get();
  uint64_t sched0 = c.kernels_scheduled, run0 = c.kernels_run;
  step({batches[1].x, batches[1].y});  // captured
  uint64_t captured_kernels = c.kernels_run - run0;
  EXPECT_GT(captured_kernels, 5u);
  EXPECT_EQ(c.kernels_scheduled - sched0, captured_kernels);
  uint64_t sched1 = c.kernels_scheduled, run1 = c.kernels_run;
  size_t programs = get_device(default_device()).compiled_count();
  for (int i = 2; i < 6; i++) step({batches[i].x, batches[i].y});
  EXPECT_EQ(c.kernels_scheduled, sched1) << "a replay scheduled kernels";
  EXPECT_EQ(c.kernels_run - run1, 4 * captured_kernels);
  EXPECT_EQ(get_device(default_device()).compiled_count(), programs) << "a replay compiled a program";
  EXPECT_EQ(step.replays(), 4);
}

// Note [a traced replay runs item by item]: while a trace records, a replay gives every captured
// kernel its own span (on CUDA, instead of one CUDA graph launch), with the same results; the
// replays before and after it run as they always do.
TEST(Jit, ATracedReplayShowsEveryKernel) {
  KnobScope k(knobs::JIT, 1);
  auto batches = make_batches(5);
  auto model = make_model(false);
  SGD opt(model->parameters(), 0.05, 0.9);
  TinyJit step(training_step(*model, opt));
  step({batches[0].x, batches[0].y});
  auto& c = GlobalCounters::get();
  uint64_t run0 = c.kernels_run;
  step({batches[1].x, batches[1].y});  // captured
  const uint64_t captured_kernels = c.kernels_run - run0;
  step({batches[2].x, batches[2].y});  // replayed untraced
  trace::start();
  float traced_loss = step({batches[3].x, batches[3].y})[0].item<float>();
  trace::Recording rec = trace::stop();
  step({batches[4].x, batches[4].y});  // untraced again
  EXPECT_EQ(step.replays(), 3);
  EXPECT_TRUE(std::isfinite(traced_loss));

  size_t kernels = 0, replays = 0;
  for (const auto& e : rec.events) {
    if (e.category == "kernel") {
      kernels++;
      EXPECT_GE(e.dur_us, 0) << e.name;
    }
    if (e.category == "jit" && e.name == "replay") {
      replays++;
      for (const auto& [key, value] : e.args) {
        if (key == "device_graph") {
          EXPECT_NE(std::get<std::string>(value), "yes");
        }
      }
    }
  }
  EXPECT_EQ(replays, 1u);
  EXPECT_EQ(kernels, captured_kernels) << "a traced replay must show each captured kernel";
}

// Note [random numbers on the device]: a replayed step draws new values, the ones the same calls
// draw without the JIT (the draw counter is a device tensor the step assigns).
TEST(Jit, ReplayedDropoutDrawsNewMasks) {
  KnobScope k(knobs::JIT, 1);
  Tensor x = Tensor::ones({256}).realize();
  auto dropout = [](const Tensors& in) { return Tensors{(in[0] * 2).dropout(0.5)}; };
  Tensor::manual_seed(7);
  std::vector<std::vector<float>> eager;
  for (int i = 0; i < 5; i++) eager.push_back(dropout({x})[0].to_vector<float>());
  Tensor::manual_seed(7);
  TinyJit step(dropout);
  for (int i = 0; i < 5; i++) EXPECT_EQ(step({x})[0].to_vector<float>(), eager[i]) << "call " << i;
  EXPECT_EQ(step.replays(), 3);
  for (int i = 1; i < 5; i++) EXPECT_NE(eager[i], eager[0]) << "call " << i << " drew the first mask again";
  size_t kept = 0;
  for (float v : eager[0]) kept += v == 4.0f;  // kept values are scaled by 1 / (1 - p)
  EXPECT_GT(kept, 90u);
  EXPECT_LT(kept, 166u);
}

TEST(Jit, DebugSaysWhenCapturedAndReplayed) {
  KnobScope k(knobs::JIT, 1);
  auto batches = make_batches(3);
  auto model = make_model(false);
  SGD opt(model->parameters(), 0.05);
  TinyJit step(
      [&](const Tensors& in) {
        Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
        opt.zero_grad();
        loss.backward();
        opt.step({loss});
        return Tensors{loss};
      },
      "mlp");
  KnobScope d(knobs::DEBUG, 1);
  ::testing::internal::CaptureStderr();
  for (auto& b : batches) step({b.x, b.y});
  std::string err = ::testing::internal::GetCapturedStderr();
  const std::string dev = default_device();
  EXPECT_NE(err.find("jit mlp: first call with [float32[8,3,4] on " + dev + ", int32[8] on " + dev + "]"), std::string::npos)
      << err;
  EXPECT_NE(err.find("jit mlp: captured"), std::string::npos) << err;
  EXPECT_NE(err.find("jit mlp: replay 1:"), std::string::npos) << err;
}

// A new input shape gets its own capture (after one normal call); the old one keeps replaying.
TEST(Jit, NewShapeGetsItsOwnCapture) {
  auto big = make_batches(6, 8), small = make_batches(3, 4);
  std::vector<Batch> seq{big[0], big[1], big[2], small[0], small[1], big[3], small[2], big[4], big[5]};
  Trained off = train(false, sgd, changing_lr, seq, 0);
  Trained on = train(false, sgd, changing_lr, seq, 1);
  expect_bit_identical(off, on);
  EXPECT_EQ(on.captures, 2);
  // big: run, capture, replay, (small: run, capture), replay, (small: replay), replay, replay
  EXPECT_EQ(on.replays, 5);
}

// Parameters replaced between calls (a checkpoint load) are what the next replay reads.
TEST(Jit, StateReplacedBetweenCallsIsSeen) {
  auto batches = make_batches(6);
  auto run = [&](int jit) {
    KnobScope k(knobs::JIT, jit);
    auto model = make_model(false);
    Adam opt(model->parameters(), 0.01);
    TinyJit step([&](const Tensors& in) {
      Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
      opt.zero_grad();
      loss.backward();
      opt.step({loss});
      return Tensors{loss};
    });
    StateDict saved_model, saved_opt;
    std::vector<float> losses;
    for (int i = 0; i < 6; i++) {
      if (i == 1) {  // snapshot after step 1 (copies, so later steps do not change it)
        for (auto& [n, t] : model->state_dict()) saved_model.emplace(n, (t + 0).contiguous().realize());
        for (auto& [n, t] : opt.state_dict()) saved_opt.emplace(n, (t + 0).contiguous().realize());
      }
      if (i == 4) {  // back to the snapshot: steps 5, 6 repeat steps 2, 3 on batches 4, 5
        model->load_state_dict(saved_model);
        opt.load_state_dict(saved_opt);
      }
      losses.push_back(step({batches[i].x, batches[i].y})[0].item<float>());
    }
    return losses;
  };
  auto off = run(0), on = run(1);
  ASSERT_EQ(off.size(), on.size());
  for (size_t i = 0; i < off.size(); i++) EXPECT_EQ(off[i], on[i]) << "step " << i + 1;
}

TEST(Jit, HostReadInsideTheStepRunsNormally) {
  KnobScope k(knobs::JIT, 1);
  auto batches = make_batches(4);
  auto model = make_model(false);
  SGD opt(model->parameters(), 0.05);
  std::vector<double> norms;
  TinyJit step([&](const Tensors& in) {
    Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
    opt.zero_grad();
    loss.backward();
    norms.push_back(clip_grad_norm(opt.params(), 1.0));  // reads the norm on the host
    opt.step({loss});
    return Tensors{loss};
  });
  for (auto& b : batches) step({b.x, b.y});
  EXPECT_EQ(step.captures(), 0);
  EXPECT_EQ(step.replays(), 0);
  EXPECT_NE(step.disabled_reason().find("on the host"), std::string::npos) << step.disabled_reason();
  EXPECT_EQ(norms.size(), 4u);  // the function ran every time
  EXPECT_EQ(opt.step_count(), 4);
}

// Inputs are rebound on every replay, not baked in: the same step on different data gives
// what an unjitted pure function gives.
TEST(Jit, InputsAreReboundOnReplay) {
  KnobScope k(knobs::JIT, 1);
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  TinyJit f([&](const Tensors& in) { return Tensors{(in[0] * w).sum() + in[1]}; });
  for (int i = 0; i < 5; i++) {
    float a = static_cast<float>(i);
    Tensor x = Tensor::from_vector(std::vector<float>{a, a + 1, a + 2}, {3});
    Tensor b = Tensor::from_vector(std::vector<float>{10.0f * a}, {1});
    EXPECT_EQ(f({x, b})[0].item<float>(), a * 1 + (a + 1) * 2 + (a + 2) * 3 + 10 * a) << "call " << i + 1;
  }
  EXPECT_EQ(f.replays(), 3);
}

// A tensor the step reads but does not assign is captured as it is; assigning it a new value
// between calls makes the next call capture again.
TEST(Jit, AssigningAReadOnlyTensorBetweenCallsCapturesAgain) {
  KnobScope k(knobs::JIT, 1);
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  TinyJit f([&](const Tensors& in) { return Tensors{(in[0] * w).sum()}; });
  auto call = [&] { return f({Tensor::from_vector(std::vector<float>{1, 1, 1}, {3})})[0].item<float>(); };
  for (int i = 0; i < 3; i++) EXPECT_EQ(call(), 6.0f);
  EXPECT_EQ(f.captures(), 1);
  w.assign(Tensor::from_vector(std::vector<float>{10, 20, 30}, {3}));
  EXPECT_EQ(call(), 60.0f);
  EXPECT_EQ(call(), 60.0f);
  EXPECT_EQ(f.captures(), 2);
  EXPECT_EQ(f.replays(), 2);
}

}  // namespace

// Note [one arena for a captured step's intermediates]: a, b and c are intermediates of 4n, n
// and 2n floats; c's life does not overlap a's, so it lies where a did and the arena holds 5n
// (buffers of equal sizes only would hold all 7n). Replays with new inputs compute the right
// values through the shared memory.
TEST(Jit, IntermediatesOfDifferentSizesShareOneArena) {
  if (!get_device(default_device()).supports(Feature::AddressableMemory))
    GTEST_SKIP() << default_device() << " buffers are handles: intermediates share by equal sizes there";
  KnobScope k(knobs::JIT, 1);
  constexpr int64_t n = int64_t{1} << 14;
  TinyJit step([](const Tensors& in) {
    Tensor a = (in[0].reshape({1, n}).expand({4, n}) * 2.0 + 1.0).contiguous();
    Tensor b = a.sum(0).contiguous();
    Tensor c = (b.reshape({1, n}).expand({2, n}) * 3.0).contiguous();
    return Tensors{c.sum(0)};
  });
  for (int i = 0; i < 4; i++) {
    auto out = step({Tensor::full({n}, i)})[0].to_vector<float>();
    for (int64_t j = 0; j < n; j += 997) ASSERT_FLOAT_EQ(out[j], 24.0f * (2 * i + 1)) << "call " << i << " at " << j;
  }
  EXPECT_EQ(step.replays(), 2);
  EXPECT_EQ(step.arena_bytes(), 5 * n * sizeof(float));
}

// Note [a capture leaves no gradients]: after the capturing call the parameters hold no
// gradients (a normal call leaves them), so that call's graph is not kept alive by them.
TEST(Jit, ACaptureLeavesNoGradients) {
  KnobScope k(knobs::JIT, 1);
  auto batches = make_batches(2);
  auto model = make_model(false);
  SGD opt(model->parameters(), 0.05);
  TinyJit step(training_step(*model, opt));
  step({batches[0].x, batches[0].y});
  for (Tensor* p : model->parameters()) EXPECT_TRUE(p->grad().has_value());
  step({batches[1].x, batches[1].y});
  EXPECT_EQ(step.captures(), 1);
  for (Tensor* p : model->parameters()) EXPECT_FALSE(p->grad().has_value());
}

namespace {

const Buffer* buffer_address(const Tensor& t) { return TensorAccess::buffer(t).get(); }

}  // namespace

// Note [state updated in place] (engine/jit_in_place.cpp): replays write the parameters and the
// optimizer's moments over their old values, so a replay holds no second copy of them: it
// allocates nothing of their size, and every state tensor keeps its buffer.
TEST(Jit, ReplaysUpdateTheStateInPlace) {
  KnobScope k(knobs::JIT, 1);
  Tensor::manual_seed(3);
  Linear layer(512, 512);  // 1 MB of weight; Adam adds 2 MB of moments
  Adam opt(layer.parameters(), 1e-4);
  TinyJit step([&](const Tensors& in) {
    Tensor loss = layer(in[0]).square().mean();
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  });
  Tensor x = Tensor::randn({4, 512}).realize();
  step({x});
  step({x});  // captures
  step({x});  // the first replay: its intermediates get their memory
  const Buffer* weight = buffer_address(layer.weight);
  MemoryPool& pool = get_device(default_device()).pool();
  Device& dev = get_device(default_device());
  dev.synchronize();
  const size_t in_use = pool.stats().bytes_in_use;
  pool.reset_peak();
  std::vector<float> losses;
  for (int i = 0; i < 3; i++) losses.push_back(step({x})[0].item<float>());
  EXPECT_EQ(step.replays(), 4);
  EXPECT_EQ(buffer_address(layer.weight), weight);
  EXPECT_LT(pool.stats().peak_bytes - in_use, size_t{64} << 10) << "a replay allocated new state buffers";
  EXPECT_LT(losses[2], losses[0]);
}

// A state buffer that something outside the step still holds (here a detached tensor taken
// between calls) is copied before the update: the holder keeps the values it saw, the parameter
// gets the new ones, bit-identical to a run without the JIT; once nothing else holds it, the
// updates are in place again.
TEST(Jit, AStateHeldOutsideTheStepKeepsItsValues) {
  auto batches = make_batches(6);
  auto run = [&](int jit, std::vector<float>* held_before, std::vector<float>* held_after) {
    KnobScope k(knobs::JIT, jit);
    auto model = make_model(false);
    SGD opt(model->parameters(), 0.05, 0.9);
    TinyJit step(training_step(*model, opt));
    Tensor& w = *model->parameters()[0];
    std::vector<float> losses;
    const Buffer* before = nullptr;
    for (int i = 0; i < 6; i++) {
      if (i == 3) {
        Tensor held = w.detach();
        *held_before = held.to_vector<float>();
        losses.push_back(step({batches[i].x, batches[i].y})[0].item<float>());
        *held_after = held.to_vector<float>();
        before = buffer_address(w);
        continue;
      }
      losses.push_back(step({batches[i].x, batches[i].y})[0].item<float>());
      if (jit && before) {
        EXPECT_EQ(buffer_address(w), before) << "step " << i + 1 << ": the updates after the copy are not in place";
      }
    }
    for (float v : w.to_vector<float>()) losses.push_back(v);
    return losses;
  };
  std::vector<float> held_before, held_after, unused_before, unused_after;
  auto on = run(1, &held_before, &held_after);
  auto off = run(0, &unused_before, &unused_after);
  EXPECT_EQ(held_after, held_before) << "the replay wrote over a buffer that a tensor outside the step holds";
  EXPECT_NE(on[3], on[4]);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); i++) EXPECT_EQ(on[i], off[i]) << "value " << i;
}

// An update that reads other elements of the old value (here its reverse) cannot run in place:
// its replays still compute what the calls without the JIT compute.
TEST(Jit, AnUpdateThatReadsOtherElementsIsNotInPlace) {
  auto run = [](int jit) {
    KnobScope k(knobs::JIT, jit);
    Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {8});
    TinyJit f([&](const Tensors& in) {
      w.assign(w.flip({0}) * 0.5 + in[0]);
      return Tensors{w.sum()};
    });
    for (int i = 0; i < 5; i++) f({Tensor::full({8}, static_cast<double>(i))});
    EXPECT_EQ(f.replays(), jit ? 3 : 0);
    return w.to_vector<float>();
  };
  EXPECT_EQ(run(1), run(0));
}

// Note [intermediates written over a dying input] (engine/jit_in_place.cpp): b is computed from a,
// element by element, by a's last reader, so b is written over a and the arena holds one of the
// two; a b that reads a reversed cannot be, and the arena holds both (beside what both steps
// hold alike, a GPU's partial sums, which the reversed step's larger arena may fit into a gap).
// Replays with new inputs compute the right values either way.
TEST(Jit, AnIntermediateIsWrittenOverItsLastReadersInput) {
  if (!get_device(default_device()).supports(Feature::AddressableMemory))
    GTEST_SKIP() << default_device() << " buffers are handles: intermediates share by equal sizes there";
  KnobScope k(knobs::JIT, 1);
  constexpr int64_t n = int64_t{1} << 14;
  size_t arena[2] = {0, 0};
  for (bool reversed : {false, true}) {
    TinyJit step([&](const Tensors& in) {
      Tensor a = (in[0] * 2.0 + 1.0).contiguous();
      Tensor b = ((reversed ? a.flip({0}) : a) * 3.0 + in[0]).contiguous();
      return Tensors{b.sum(), b.shrink({{0, 4}})};
    });
    for (int i = 0; i < 4; i++) {
      Tensor x = Tensor::arange(0.0, static_cast<double>(n)) * (0.001 * (i + 1));
      auto out = step({x.realize()});
      auto head = out[1].to_vector<float>();
      auto xs = x.to_vector<float>();
      for (int64_t j = 0; j < 4; j++) {
        float a = xs[reversed ? n - 1 - j : j] * 2.0f + 1.0f;
        EXPECT_FLOAT_EQ(head[j], a * 3.0f + xs[j]) << "call " << i << (reversed ? ", reversed" : "") << " at " << j;
      }
    }
    EXPECT_EQ(step.replays(), 2);
    arena[reversed] = step.arena_bytes();
  }
  EXPECT_GE(arena[0], n * sizeof(float));
  EXPECT_LT(arena[0], 2 * n * sizeof(float)) << "in order, a and b share: " << arena[0] << " bytes";
  EXPECT_GE(arena[1], 2 * n * sizeof(float)) << "reversed, a and b are both held: " << arena[1] << " bytes";
}
