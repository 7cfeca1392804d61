// The mpi backend and data parallelism, run under mpirun (2 and 4 ranks). Every rank runs every
// test; results are checked on every rank. Equivalence: N steps with the global batch sharded
// over the ranks end with the parameters of one process training on the whole batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "distributed/collective_runner.h"
#include "distributed/coordinated_step.h"
#include "distributed/data_parallel.h"
#include "distributed/mpi_backend.h"
#include "distributed/zero.h"
#include "test_util.h"
#include "train_util.h"
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

std::unique_ptr<nn::Sequential> make_mlp() {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Linear>(12, 32);
  net->emplace<nn::ReLU>();
  net->emplace<nn::Linear>(32, 16);
  net->emplace<nn::Tanh>();
  net->emplace<nn::Linear>(16, 5);
  return net;
}

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> collectives_per_step;
  size_t buckets = 0;
};

enum class Mode { One, Ddp, Zero1 };

std::unique_ptr<nn::Optimizer> make_opt(std::vector<Tensor*> ps, bool adam) {
  if (adam) return std::make_unique<nn::Adam>(std::move(ps), 1e-2);
  return std::make_unique<nn::SGD>(std::move(ps), 0.1, 0.9);
}

// Trains `steps` steps on a global batch of `global` examples: in one process (rank 0's initial
// parameters), or sharded over the ranks (every rank starts different; the broadcast fixes that).
Trained train(Mode mode, int steps, int64_t global, double bucket_mb, bool adam, double max_norm = 0) {
  Tensor::manual_seed(7 + (mode != Mode::One ? world().rank() : 0));
  auto net = make_mlp();
  Trained out;
  std::unique_ptr<CollectiveEngine> engine;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<Zero1> zero;
  std::unique_ptr<nn::Optimizer> opt;
  if (mode != Mode::One) {
    engine = std::make_unique<CollectiveEngine>(world());
    dp = std::make_unique<DataParallel>(world(), net->parameters(), DataParallelOptions{bucket_mb});
    dp->broadcast_parameters();
    out.buckets = dp->buckets().size();
  }
  if (mode == Mode::Zero1) zero = std::make_unique<Zero1>(world(), net->parameters(), [adam](std::vector<Tensor*> ps) { return make_opt(ps, adam); });
  else opt = make_opt(net->parameters(), adam);
  for (int s = 0; s < steps; s++) {
    auto [x, y] = global_batch(s, global);
    if (mode != Mode::One) {
      x = shard_batch(x, world().rank(), world().size());
      y = shard_batch(y, world().rank(), world().size());
    }
    Tensor loss = (*net)(x).sparse_categorical_crossentropy(y);
    for (Tensor* p : net->parameters()) p->zero_grad();
    loss.backward();
    uint64_t before = GlobalCounters::get().collectives;
    StepOptions so{.max_norm = max_norm, .skip_nonfinite = max_norm > 0};
    if (mode == Mode::Ddp) {
      Tensors first = dp->reduce_gradients();
      first.push_back(loss);
      coordinated_step(*opt, first, so);
    } else if (mode == Mode::Zero1) {
      zero->step({loss}, so);
    } else {
      if (max_norm > 0) nn::clip_grad_norm(opt->params(), max_norm);
      opt->step({loss});
    }
    out.collectives_per_step.push_back(GlobalCounters::get().collectives - before);
  }
  for (Tensor* p : net->parameters()) out.params.push_back(p->to_vector<float>());
  return out;
}

}  // namespace

TEST(Mpi, WorldFromEnvironment) {
  EXPECT_EQ(world().size(), env_world_size());
  EXPECT_EQ(world().rank(), env_rank());
  EXPECT_TRUE(launched_by_mpirun());
}

TEST(Mpi, Collectives) {
  ProcessGroup& pg = world();
  const int n = pg.size(), r = pg.rank();
  std::vector<float> v{float(r), 1.0f};
  pg.all_reduce(v.data(), 2, DType::Float32, ReduceOp::Sum)->wait();
  EXPECT_EQ(v[0], n * (n - 1) / 2.0f);
  EXPECT_EQ(v[1], float(n));
  std::vector<double> a{double(r)};
  pg.all_reduce(a.data(), 1, DType::Float64, ReduceOp::Avg)->wait();
  EXPECT_DOUBLE_EQ(a[0], (n - 1) / 2.0);
  std::vector<int64_t> m{int64_t(r)};
  pg.all_reduce(m.data(), 1, DType::Int64, ReduceOp::Max)->wait();
  EXPECT_EQ(m[0], n - 1);
  std::vector<float> in(n), out(1);
  for (int b = 0; b < n; b++) in[b] = float(r * 10 + b);
  pg.reduce_scatter(in.data(), out.data(), 1, DType::Float32, ReduceOp::Sum)->wait();
  EXPECT_EQ(out[0], 10.0f * n * (n - 1) / 2 + n * r);
  std::vector<int32_t> mine{r}, all(n);
  pg.all_gather(mine.data(), all.data(), 1, DType::Int32)->wait();
  for (int k = 0; k < n; k++) EXPECT_EQ(all[k], k);
  std::vector<float> bc{float(r + 3)};
  pg.broadcast(bc.data(), 1, DType::Float32, 0)->wait();
  EXPECT_EQ(bc[0], 3.0f);
  pg.barrier()->wait();
}

// A timeout ends the job (Note [a failed collective ends the job] in mpi_backend.cpp), so the
// stuck, stopped and dead ranks are tested one per mpirun job: dist_faults.cpp, dist_dead_rank.cpp.

// Note [data parallel against one process]: each rank sums its share of the batch and the
// all-reduce sums the shares, so gradients agree with one process's to float32 rounding (a
// different order of the same sum), and the kernels differ too (a rank's 8 rows read W^T as it is,
// one process's 32 rows through a copy: Note [transposed B]). SGD carries that rounding through
// 25 steps as it is (about 1e-6); Adam divides each coordinate by its own root mean square, which
// magnifies it where a gradient is near zero: 0.9e-5 to 1.4e-5 at 4 ranks. A wrong average or a
// missed bucket is off by orders of magnitude more.
TEST(Mpi, DataParallelEqualsOneProcess) {
  const int n = world().size();
  const int64_t global = 8 * n;
  for (bool adam : {false, true}) {
    Trained ref = train(Mode::One, 4, global, 25, adam);
    Trained dp = train(Mode::Ddp, 4, global, 25, adam);
    double err = max_rel_diff(dp.params, ref.params);
    if (world().rank() == 0) std::printf("world %d, %s: max relative difference %.3g\n", n, adam ? "adam" : "sgd", err);
    EXPECT_LT(err, adam ? 5e-5 : 1e-5) << (adam ? "adam" : "sgd");
    EXPECT_EQ(dp.buckets, 1u);
  }
}

TEST(Mpi, OneAllReducePerBucket) {
  // 0.001 MB buckets: the 12x32, 32x16 and 16x5 weights and their biases fall into several
  Trained dp = train(Mode::Ddp, 2, 4 * world().size(), 0.001, false);
  EXPECT_GT(dp.buckets, 2u);
  for (uint64_t c : dp.collectives_per_step) EXPECT_EQ(c, dp.buckets);
  // clipping and the skip check decide from the reduced gradients, which every rank holds alike:
  // no collective of their own (Note [one decision from the reduced gradients])
  Trained clipped = train(Mode::Ddp, 2, 4 * world().size(), 0.001, false, 0.05);
  for (uint64_t c : clipped.collectives_per_step) EXPECT_EQ(c, clipped.buckets);
}

TEST(Mpi, ClippedDataParallelEqualsOneProcess) {
  const int64_t global = 8 * world().size();
  Trained ref = train(Mode::One, 3, global, 25, false, 0.05);
  Trained dp = train(Mode::Ddp, 3, global, 25, false, 0.05);
  EXPECT_LT(max_rel_diff(dp.params, ref.params), 1e-5);
}

TEST(Mpi, Zero1EqualsDataParallel) {
  const int64_t global = 8 * world().size();
  for (bool adam : {false, true}) {
    Trained dp = train(Mode::Ddp, 4, global, 25, adam, 0.5);
    Trained z = train(Mode::Zero1, 4, global, 25, adam, 0.5);
    double err = max_rel_diff(z.params, dp.params);
    if (world().rank() == 0) std::printf("world %d, %s: zero1 vs ddp max relative difference %.3g\n", world().size(), adam ? "adam" : "sgd", err);
    EXPECT_LT(err, 1e-5) << (adam ? "adam" : "sgd");
  }
}

// float16 and bfloat16 travel as 16-bit words and are added in float32 by user-defined MPI ops:
// small integers are exact in both, and Avg divides after the sum.
TEST(Mpi, HalfDtypesReduceGatherAndBroadcast) {
  ProcessGroup& pg = world();
  const int n = pg.size(), r = pg.rank();
  struct Half {
    DType dtype;
    uint16_t (*narrow)(float);
    float (*widen)(uint16_t);
  };
  for (Half h : {Half{DType::BFloat16, float_to_bfloat, bfloat_to_float}, Half{DType::Float16, float_to_half, half_to_float}}) {
    SCOPED_TRACE(dtype_name(h.dtype));
    std::vector<uint16_t> v{h.narrow(float(r)), h.narrow(1.5f), h.narrow(float(-r))};
    pg.all_reduce(v.data(), 3, h.dtype, ReduceOp::Sum)->wait();
    EXPECT_EQ(h.widen(v[0]), n * (n - 1) / 2.0f);
    EXPECT_EQ(h.widen(v[1]), 1.5f * n);
    std::vector<uint16_t> m{h.narrow(float(r))};
    pg.all_reduce(m.data(), 1, h.dtype, ReduceOp::Max)->wait();
    EXPECT_EQ(h.widen(m[0]), float(n - 1));
    std::vector<uint16_t> a{h.narrow(float(2 * r))};
    pg.all_reduce(a.data(), 1, h.dtype, ReduceOp::Avg)->wait();
    EXPECT_EQ(h.widen(a[0]), float(n - 1));
    std::vector<uint16_t> in(n), out(1);
    for (int b = 0; b < n; b++) in[b] = h.narrow(float(r + b));
    pg.reduce_scatter(in.data(), out.data(), 1, h.dtype, ReduceOp::Sum)->wait();
    EXPECT_EQ(h.widen(out[0]), n * (n - 1) / 2.0f + float(n * r));
    std::vector<uint16_t> mine{h.narrow(float(r) + 0.5f)}, all(n);
    pg.all_gather(mine.data(), all.data(), 1, h.dtype)->wait();
    for (int k = 0; k < n; k++) EXPECT_EQ(h.widen(all[k]), float(k) + 0.5f);
  }
  EXPECT_HAS(testutil::error_of([&] {
               bool b = true;
               pg.all_reduce(&b, 1, DType::Bool, ReduceOp::Sum);
             }),
             "dtype bool is not supported");
}

// REDUCE_SCATTER and ALLGATHER as graph nodes, run by the engine like ALLREDUCE, in float32 and
// bfloat16.
TEST(Mpi, ReduceScatterAndAllGatherNodes) {
  ProcessGroup& pg = world();
  const int n = pg.size(), r = pg.rank();
  CollectiveEngine engine(pg);
  std::vector<float> data(static_cast<size_t>(2 * n));
  for (int i = 0; i < 2 * n; i++) data[i] = float(i + r);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = Tensor::from_vector(data, {2 * n}).cast(dt);
    Tensor block = reduce_scatter_node(pg, x);
    ASSERT_EQ(block.shape(), (Shape{2}));
    Tensor gathered = all_gather_node(pg, block * 2.0);
    ASSERT_EQ(gathered.shape(), (Shape{2 * n}));
    std::vector<float> got = gathered.cast(DType::Float32).to_vector<float>();
    const float ranks_sum = n * (n - 1) / 2.0f;
    for (int i = 0; i < 2 * n; i++) EXPECT_EQ(got[i], 2 * (float(n * i) + ranks_sum)) << i;
  }
  EXPECT_HAS(testutil::error_of([&] { reduce_scatter_node(pg, Tensor::zeros({2 * n + 1})); }),
             "do not split into " + std::to_string(n) + " equal blocks");
}

// Ranks that schedule different collectives are told so, by rank, before any of them runs
// (instead of a deadlock or MPI_ERR_TRUNCATE); an agreed sequence is compared only once.
TEST(Mpi, CollectiveSequenceMismatchIsNamedByRank) {
  ProcessGroup& pg = world();
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CollectiveEngine engine(pg);
  Tensor same = Tensor::ones({5});
  for (int i = 0; i < 3; i++) all_reduce_node(pg, same + float(i)).realize();
  EXPECT_EQ(engine.sequences_checked(), 1u);
  Tensor x = Tensor::ones({pg.rank() == 1 ? 6 : 4});
  std::string msg = testutil::error_of([&] { all_reduce_node(pg, x).realize(); });
  EXPECT_HAS(msg, "the ranks run different collectives");
  EXPECT_HAS(msg, "rank 0: all_reduce sum of float32[4]");
  EXPECT_HAS(msg, "rank 1: all_reduce sum of float32[6]");
  EXPECT_HAS(msg, "this is rank " + std::to_string(pg.rank()));
  pg.barrier()->wait();
}

// send/recv over MPI: a ring exchange in float32 and bfloat16, in order.
TEST(Mpi, PointToPointRing) {
  ProcessGroup& pg = world();
  const int n = pg.size(), r = pg.rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int round = 0; round < 2; round++) {
    std::vector<float> out{float(r * 10 + round), -1.0f}, in(2);
    auto s = pg.send(out.data(), 2, DType::Float32, next);
    pg.recv(in.data(), 2, DType::Float32, prev)->wait();
    s->wait();
    EXPECT_EQ(in[0], float(prev * 10 + round));
    EXPECT_EQ(in[1], -1.0f);
  }
  std::vector<uint16_t> hb{float_to_bfloat(float(r) + 0.5f)}, got(1);
  auto s = pg.send(hb.data(), 1, DType::BFloat16, next);
  pg.recv(got.data(), 1, DType::BFloat16, prev)->wait();
  s->wait();
  EXPECT_EQ(bfloat_to_float(got[0]), float(prev) + 0.5f);
  EXPECT_HAS(testutil::error_of([&] { float x = 0; pg.send(&x, 1, DType::Float32, n); }), "is not another rank");
  pg.barrier()->wait();
}
