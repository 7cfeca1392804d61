// Fully sharded data parallelism under mpirun (2 and 4 ranks): N steps of fsdp end with ddp's
// parameters within 1e-5 relative (SGD with momentum, Adam with clipping, AdamW, an uneven dim 0);
// one ALLGATHER per unit before the forward pass and one REDUCE_SCATTER per unit after backward;
// steps replayed by TinyJit equal steps run without it, a NaN on one rank skipped everywhere;
// LAMB refused; the memory held between steps for parameters, gradients and optimizer state (the
// device pool's bytes in use) is about 1/world of ddp's. Sharded checkpoints are tested through
// tg train (test_fsdp_train.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "distributed/collective_runner.h"
#include "distributed/coordinated_step.h"
#include "distributed/data_parallel.h"
#include "distributed/fsdp.h"
#include "distributed/mpi_backend.h"
#include "test_util.h"
#include "train_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/nn/layers.h"

using namespace tg;
using namespace tg::dist;

namespace {

using tg::testutil::global_batch;
using tg::testutil::max_rel_diff;

ProcessGroup& world() {
  static std::unique_ptr<ProcessGroup> g = mpi_world_group();
  return *g;
}

// Layer widths with dim 0 that 4 does not divide (the last layer's 5 rows, the middle's 30).
std::unique_ptr<nn::Sequential> make_mlp(int64_t in = 12, int64_t hidden = 30) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Linear>(in, hidden);
  net->emplace<nn::ReLU>();
  net->emplace<nn::Linear>(hidden, 16);
  net->emplace<nn::Tanh>();
  net->emplace<nn::Linear>(16, 5);
  return net;
}

enum class OptName { Sgd, Adam, AdamW };

std::unique_ptr<nn::Optimizer> make_opt(std::vector<Tensor*> ps, OptName o) {
  if (o == OptName::Adam) return std::make_unique<nn::Adam>(std::move(ps), 1e-2);
  if (o == OptName::AdamW) return std::make_unique<nn::AdamW>(nn::decay_matrices_only(ps, 0.1), 1e-2);
  return std::make_unique<nn::SGD>(std::move(ps), 0.1, 0.9);
}

struct RunSpec {
  OptName opt = OptName::Sgd;
  int steps = 3;
  double max_norm = 0;
  bool jit = false;
  int64_t in = 12, hidden = 30;
  int nan_step = -1;  // this step's batch is NaN on rank 1 (every rank must skip it)
};

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> collectives_per_step;
  size_t resident_bytes = 0;  // the device pool's bytes in use after the last step, less those before the model
  int64_t optimizer_steps = 0;
  int64_t skipped = 0;
};

size_t pool_in_use() { return get_device(default_device()).pool().stats().bytes_in_use; }

// Trains r.steps steps on a global batch of 8 * world examples, data parallel or fully sharded.
Trained train(bool fsdp, const RunSpec& r) {
  const int64_t global = 8 * world().size();
  Trained out;
  const size_t before = pool_in_use();
  {
    Tensor::manual_seed(7 + world().rank());  // every rank starts different; the broadcast fixes that
    auto net = make_mlp(r.in, r.hidden);
    CollectiveEngine engine(world());
    DataParallel dp(world(), net->parameters());
    dp.broadcast_parameters();
    std::unique_ptr<Fsdp> sharded;
    std::unique_ptr<nn::Optimizer> opt;
    if (fsdp) {
      sharded = std::make_unique<Fsdp>(world(), *net, [&](std::vector<Tensor*> ps) { return make_opt(ps, r.opt); });
    } else {
      opt = make_opt(net->parameters(), r.opt);
    }
    StepOptions so{.max_norm = r.max_norm, .skip_nonfinite = r.max_norm > 0};
    auto step = [&](const Tensors& batch) -> Tensors {
      Tensor x = shard_batch(batch[0], world().rank(), world().size());
      Tensor y = shard_batch(batch[1], world().rank(), world().size());
      if (sharded) sharded->unshard();
      for (Tensor* p : net->parameters()) p->zero_grad();
      Tensor loss = (*net)(x).sparse_categorical_crossentropy(y);
      loss.backward();
      LazyStepOutcome lazy;
      if (sharded) {
        lazy = sharded->step_lazy({loss}, so);
      } else {
        Tensors first = dp.reduce_gradients();
        first.push_back(loss);
        lazy = coordinated_step_lazy(world(), *opt, first, so);
      }
      if (lazy.ok) return {loss, *lazy.ok, *lazy.grad_norm};
      return {loss};
    };
    TinyJit jit(step, "fsdp_test_step");
    for (int s = 0; s < r.steps; s++) {
      auto [x, y] = global_batch(s, global, r.in);
      if (s == r.nan_step && world().rank() == 1) x = x.full_like(NAN).realize();
      uint64_t c0 = GlobalCounters::get().collectives;
      Tensors outs = r.jit ? jit({x, y}) : step({x, y});
      if (outs.size() == 3) out.skipped += settle_step(sharded ? sharded->shard_optimizer() : *opt, {outs[1], outs[2]}).skipped;
      out.collectives_per_step.push_back(GlobalCounters::get().collectives - c0);
    }
    if (r.jit) {
      EXPECT_GE(jit.replays(), r.steps - 2) << jit.disabled_reason();
    }
    // gradients counted as buffers of their own: a lazy ddp gradient would also hold its step's graph
    for (Tensor* t : sharded ? sharded->shards() : net->parameters())
      if (auto g = t->grad()) t->set_grad(Tensor::empty(g->shape()).assign(*g));
    out.resident_bytes = pool_in_use() - before;
    out.optimizer_steps = (sharded ? sharded->shard_optimizer() : *opt).step_count();
    if (sharded) sharded->materialize();
    for (Tensor* p : net->parameters()) out.params.push_back(p->to_vector<float>());
  }
  return out;
}

}  // namespace

// SGD with momentum, Adam with clipping and the skip check (one more ALLREDUCE: the decision), AdamW
// with weight decay on the matrices only (a shard keeps its parameter's rank).
TEST(Fsdp, EqualsDataParallel) {
  for (RunSpec r : {RunSpec{.opt = OptName::Sgd}, RunSpec{.opt = OptName::Adam, .max_norm = 0.05}, RunSpec{.opt = OptName::AdamW}}) {
    Trained d = train(false, r), f = train(true, r);
    double err = max_rel_diff(f.params, d.params);
    if (world().rank() == 0)
      std::printf("world %d, optimizer %d, max_norm %g: fsdp vs ddp max relative difference %.3g\n", world().size(), int(r.opt), r.max_norm, err);
    EXPECT_LT(err, 1e-5) << "optimizer " << int(r.opt);
    // per step: 3 ALLGATHERs (one per Linear) and 2 more for backward (Note [gathers layer by layer]),
    // 3 REDUCE_SCATTERs, and the decision's ALLREDUCE
    for (uint64_t c : f.collectives_per_step) EXPECT_EQ(c, r.max_norm > 0 ? 9u : 8u);
  }
}

// The 4th step (a replay) has a NaN gradient on rank 1: every rank skips it, under the JIT as
// without it, and ddp skips it too.
TEST(Fsdp, JitReplaysTheGathersAndEqualsJitOff) {
  RunSpec r{.opt = OptName::Adam, .steps = 5, .max_norm = 0.5, .nan_step = 3};
  Trained eager = train(true, r), ddp = train(false, r);
  r.jit = true;
  Trained replayed = train(true, r);
  EXPECT_EQ(max_rel_diff(replayed.params, eager.params), 0.0);
  EXPECT_LT(max_rel_diff(replayed.params, ddp.params), 1e-5);
  for (const Trained* t : {&eager, &replayed, &ddp}) {
    EXPECT_EQ(t->skipped, 1);
    EXPECT_EQ(t->optimizer_steps, 4);
  }
  for (uint64_t c : replayed.collectives_per_step) EXPECT_EQ(c, 9u);
}

// LAMB's trust ratio needs each parameter's whole norm, which no shard has.
TEST(Fsdp, RefusesLamb) {
  auto net = make_mlp();
  try {
    Fsdp f(world(), *net, [](std::vector<Tensor*> ps) { return std::make_unique<nn::LAMB>(std::move(ps), 1e-3); });
    ADD_FAILURE() << "LAMB was accepted";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "fsdp: LAMB needs per-parameter norms; use sgd, adam or adamw");
  }
}

// Between steps ddp holds the parameters, their gradients (the buckets' all-reduce outputs) and
// Adam's two moments in full; fsdp holds a 1/world share of each (shards, the shards' averaged
// gradients, the shards' moments), the padding rows aside. Measured by the device pool.
TEST(Fsdp, ResidentMemoryIsAboutOneOverWorld) {
  RunSpec r{.opt = OptName::Adam, .steps = 1, .in = 64, .hidden = 512};
  Trained d = train(false, r), f = train(true, r);
  const double ratio = double(f.resident_bytes) / double(d.resident_bytes);
  if (world().rank() == 0)
    std::printf("world %d: resident parameters + gradients + Adam state: ddp %zu bytes, fsdp %zu bytes (%.3f)\n",
                world().size(), d.resident_bytes, f.resident_bytes, ratio);
  EXPECT_GT(d.resident_bytes, size_t(4 * 4 * 41000));  // 4 copies of 41573 float32 parameters
  EXPECT_NEAR(ratio, 1.0 / world().size(), 0.1 / world().size());
}
