// The local (threads) process group: every collective's result on 1-4 ranks, mismatched
// collectives, a stuck rank (timeout naming it) and a dead rank (named at once).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "distributed/collective_runner.h"
#include "distributed/data_parallel.h"
#include "distributed/local_backend.h"
#include "distributed/rendezvous.h"
#include "tinygrad/runtime/cpu.h"
#include "schedule_util.h"
#include "test_util.h"
#include "tinygrad/nn/optim.h"

using namespace tg;
using namespace tg::dist;

class LocalCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectives, AllCollectives) {
  const int n = GetParam();
  run_local(n, [n](ProcessGroup& pg) {
    const int r = pg.rank();
    EXPECT_EQ(pg.size(), n);
    std::vector<float> v{float(r), float(2 * r + 1), -float(r)};
    pg.all_reduce(v.data(), 3, DType::Float32, ReduceOp::Sum)->wait();
    float s = n * (n - 1) / 2.0f;
    EXPECT_EQ(v, (std::vector<float>{s, 2 * s + n, -s}));
    std::vector<double> a{double(r), 1.0};
    pg.all_reduce(a.data(), 2, DType::Float64, ReduceOp::Avg)->wait();
    EXPECT_DOUBLE_EQ(a[0], (n - 1) / 2.0);
    EXPECT_DOUBLE_EQ(a[1], 1.0);
    std::vector<int64_t> m{int64_t(r), -int64_t(r)};
    pg.all_reduce(m.data(), 2, DType::Int64, ReduceOp::Max)->wait();
    EXPECT_EQ(m, (std::vector<int64_t>{n - 1, 0}));
    // reduce_scatter: rank r gets block r of the sum; block b of rank k's input is k + b
    std::vector<float> in(2 * n), out(2);
    for (int b = 0; b < n; b++) in[2 * b] = in[2 * b + 1] = float(r + b);
    pg.reduce_scatter(in.data(), out.data(), 2, DType::Float32, ReduceOp::Sum)->wait();
    EXPECT_EQ(out[0], s + n * r);
    std::vector<int32_t> mine{r, 10 * r}, all(2 * n);
    pg.all_gather(mine.data(), all.data(), 2, DType::Int32)->wait();
    for (int k = 0; k < n; k++) EXPECT_EQ(all[2 * k + 1], 10 * k);
    std::vector<float> bc{float(r + 5)};
    pg.broadcast(bc.data(), 1, DType::Float32, n - 1)->wait();
    EXPECT_EQ(bc[0], float(n - 1 + 5));
    pg.barrier()->wait();
    EXPECT_EQ(pg.collectives_started(), 7u);
  });
}
INSTANTIATE_TEST_SUITE_P(Ranks, LocalCollectives, ::testing::Values(1, 2, 3, 4));

namespace {

// A stand-in for the layout of buckets only (nothing runs on it): CPU memory, views held to
// 16-byte offsets as CUDA's are (DevicePolicy::view_alignment).
class AlignedViewsDevice : public Device {
 public:
  explicit AlignedViewsDevice(const std::string& name) : Device(name), cpu_(make_cpu_device(name)) {
    policy_.view_alignment = 16;
  }
  Allocator& allocator() override { return cpu_->allocator(); }
  const Renderer& renderer() const override { return cpu_->renderer(); }
  Compiler& compiler() override { return cpu_->compiler(); }
  bool supports(Feature f) const override { return cpu_->supports(f); }
  const DevicePolicy& policy() const override { return policy_; }

 private:
  std::unique_ptr<Device> cpu_;
  DevicePolicy policy_;
};

std::vector<size_t> bucket_order(const std::string& device) {
  TensorOptions on{.device = device};
  Tensor w1 = Tensor::zeros({32, 12}, on), b1 = Tensor::zeros({32}, on), w2 = Tensor::zeros({10, 32}, on),
         b2 = Tensor::zeros({10}, on);
  std::vector<size_t> order;
  run_local(1, [&](ProcessGroup& pg) {
    DataParallel dp(pg, {&w1, &b1, &w2, &b2}, {});
    EXPECT_EQ(dp.buckets().size(), 1u);
    order = dp.buckets().at(0).params;
  });
  return order;
}

}  // namespace

// Note [bucket layout] in distributed/data_parallel.cpp: a bucket holds the gradients in reverse
// parameter order, but where views need 16-byte offsets the odd-sized one (b2: 40 bytes) goes
// last, so that every piece starts on the grid and can be stored in place.
TEST(DataParallelBuckets, PiecesOnTheDevicesGridComeFirst) {
  register_device("ALIGNED16", [](const std::string& n) { return std::make_unique<AlignedViewsDevice>(n); });
  EXPECT_EQ(bucket_order("CPU"), (std::vector<size_t>{3, 2, 1, 0}));
  EXPECT_EQ(bucket_order("ALIGNED16"), (std::vector<size_t>{2, 1, 0, 3}));
}

// Note [the norm from the buckets] in distributed/data_parallel.cpp: the norm taken from the
// buckets is the parameters' gradient norm (a parameter without a gradient counts as none), on
// every rank, in fewer kernels than a reduce per parameter.
TEST(DataParallelBuckets, TheNormFromTheBucketsIsTheGradientsNorm) {
  std::vector<double> from_buckets(2), per_parameter(2);
  std::vector<size_t> bucket_kernels(2), parameter_kernels(2);
  run_local(2, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    Tensor w1 = Tensor::zeros({32, 12}), b1 = Tensor::zeros({32}), w2 = Tensor::zeros({10, 32}),
           b2 = Tensor::zeros({10});
    auto values = [r](int64_t n, double step) {  // different on each rank, some negative
      return (Tensor::arange(0.0, static_cast<double>(n)) * (step * (r + 1)) - 0.5).sin();
    };
    w1.set_grad(values(32 * 12, 0.01).reshape({32, 12}).realize());
    b1.set_grad(values(32, 0.3).realize());
    w2.set_grad(values(10 * 32, 0.07).reshape({10, 32}).realize());
    CollectiveEngine engine(pg);
    DataParallel dp(pg, {&w1, &b1, &w2, &b2}, {});
    Tensors reduced = dp.reduce_gradients();
    Tensor norm = dp.grad_norm_lazy(reduced), reference = nn::grad_norm_lazy({&w1, &b1, &w2, &b2});
    bucket_kernels[r] = testutil::kernels({norm});
    parameter_kernels[r] = testutil::kernels({reference});
    from_buckets[r] = norm.item<double>();
    per_parameter[r] = reference.item<double>();
  });
  for (int r = 0; r < 2; r++) {
    EXPECT_GT(per_parameter[r], 0);
    EXPECT_NEAR(from_buckets[r], per_parameter[r], 1e-6 * per_parameter[r]) << "rank " << r;
    EXPECT_LT(bucket_kernels[r], parameter_kernels[r]) << "rank " << r;
  }
  EXPECT_EQ(from_buckets[0], from_buckets[1]) << "the ranks decide from one value";
}

TEST(LocalBackend, MismatchedCollectiveIsAnError) {
  std::string msg = testutil::error_of([] {
    run_local(2, [](ProcessGroup& pg) {
      std::vector<float> v(pg.rank() + 1);
      pg.all_reduce(v.data(), v.size(), DType::Float32, ReduceOp::Sum)->wait();
    });
  });
  EXPECT_HAS(msg, "collective #0 differs between ranks");
}

TEST(LocalBackend, StuckRankTimesOutNamingIt) {
  std::string msg = testutil::error_of([] {
    run_local(
        3,
        [](ProcessGroup& pg) {
          if (pg.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(800));
          else pg.barrier()->wait();
        },
        Seconds(0.2));
  });
  // the first rank to time out names rank 2; the other may report that rank's error instead
  EXPECT_HAS(msg, "barrier #0 on rank ");
  EXPECT_HAS(msg, "timed out after 0.2 s waiting for rank(s) 2");
}

TEST(LocalBackend, DeadRankIsNamedAtOnce) {
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = testutil::error_of([] {
    run_local(
        2,
        [](ProcessGroup& pg) {
          if (pg.rank() == 1) throw Error("out of memory in step 3");
          std::vector<float> v(4);
          pg.all_reduce(v.data(), 4, DType::Float32, ReduceOp::Sum)->wait();
        },
        Seconds(30));
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_HAS(msg, "all_reduce #0 on rank 0 of 2: rank 1 died (out of memory in step 3)");
}

TEST(LocalBackend, UnsupportedDtypeIsAnError) {
  std::string msg = testutil::error_of([] {
    run_local(1, [](ProcessGroup& pg) {
      uint8_t b = 0;
      pg.all_reduce(&b, 1, DType::UInt8, ReduceOp::Sum);
    });
  });
  EXPECT_HAS(msg, "dtype uint8 is not supported");
}

// Note [a rank's device]: an unindexed GPU device is the local rank's GPU; too many ranks for the
// node's GPUs is an error naming both numbers; the CPU and indexed devices are kept.
TEST(RankDevice, UnindexedGpuIsTheLocalRanksGpu) {
  using tg::dist::LocalRanks;
  using tg::dist::rank_device;
  EXPECT_EQ(rank_device("CUDA", LocalRanks{0, 2}, 2), "CUDA");
  EXPECT_EQ(rank_device("cuda", LocalRanks{1, 2}, 2), "CUDA:1");
  EXPECT_EQ(rank_device("CUDA:3", LocalRanks{1, 2}, 8), "CUDA:3");
  EXPECT_EQ(rank_device("CPU", LocalRanks{3, 4}, 0), "CPU");
  EXPECT_HAS(testutil::error_of([] { rank_device("CUDA", LocalRanks{0, 4}, 1); }),
             "4 ranks on this node but 1 CUDA device(s)");
}

// The built backends and NCCL's state are named; a backend that cannot serve the run's device is
// refused with the reason.
TEST(Backends, NcclStateIsNamedAndUnbuiltPathsAreRefused) {
  auto built = tg::dist::built_backends();
  ASSERT_FALSE(built.empty());
  EXPECT_EQ(built.front(), "local");
  std::string nccl = tg::dist::nccl_status();
  const bool has_nccl = std::find(built.begin(), built.end(), "nccl") != built.end();
  if (has_nccl) {
    // "NCCL 2.28.9 (path)" or "unavailable: libnccl.so.2 not found (tried ...)"
    std::regex ok(R"(NCCL \d+\.\d+\.\d+ \(.*libnccl\.so\.2\)|unavailable: .*libnccl\.so\.2.*)");
    EXPECT_TRUE(std::regex_match(nccl, ok)) << nccl;
  } else {
    EXPECT_HAS(nccl, "not built");
  }
  std::printf("process-group backends: %zu; NCCL: %s\n", built.size(), nccl.c_str());
  EXPECT_HAS(testutil::error_of([] { tg::dist::world_group_for("nccl", "CPU"); }),
             "nccl runs collectives on CUDA devices, not on CPU");
  // no such GPU here: the error names the backend, how it was chosen and the device
  std::string auto_gpu = testutil::error_of([] { tg::dist::world_group_for("auto", "CUDA:99"); });
  EXPECT_HAS(auto_gpu, has_nccl ? "distributed.backend=nccl (auto, for device CUDA:99 under no launcher)" : "not built");
  if (has_nccl && nccl.rfind("NCCL ", 0) == 0) {
    EXPECT_HAS(auto_gpu, "device 'CUDA:99'");
  }
  EXPECT_HAS(testutil::error_of([] { tg::dist::world_group_for("mpi", "CUDA"); }),
             "the mpi backend runs collectives on host memory, not on CUDA");
  EXPECT_HAS(testutil::error_of([] { tg::dist::world_group_for("shm", "CPU"); }), "'shm' is not one of auto, mpi, nccl, gloo");
}

namespace {
// Sets environment variables for one scope, restoring what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};
}  // namespace

// Note [who started this process]: ranks from mpirun, tg launch or srun, in that order.
TEST(Launchers, RanksComeFromWhoeverStartedTheProcess) {
  using tg::dist::Launcher;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "runs outside mpirun";
  EXPECT_EQ(tg::dist::detected_launcher(), Launcher::None);
  EXPECT_EQ(tg::dist::env_world_size(), 1);
  {
    ScopedEnv slurm({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"}});
    EXPECT_EQ(tg::dist::detected_launcher(), Launcher::Slurm);
    EXPECT_EQ(tg::dist::env_rank(), 5);
    EXPECT_EQ(tg::dist::env_world_size(), 8);
    EXPECT_EQ(tg::dist::env_local_ranks().rank, 1);
    EXPECT_EQ(tg::dist::env_local_ranks().size, 4);
    ScopedEnv launch({{"TG_RANK", "3"}, {"TG_WORLD_SIZE", "4"}, {"TG_LOCAL_RANK", "1"}, {"TG_LOCAL_WORLD_SIZE", "2"}});
    EXPECT_EQ(tg::dist::detected_launcher(), Launcher::TgLaunch);  // tg launch inside a Slurm job
    EXPECT_EQ(tg::dist::env_rank(), 3);
    EXPECT_EQ(tg::dist::env_world_size(), 4);
    EXPECT_EQ(tg::dist::env_local_ranks().rank, 1);
    EXPECT_EQ(tg::dist::env_local_ranks().size, 2);
    EXPECT_EQ(tg::dist::rank_device("CUDA", tg::dist::env_local_ranks(), 2), "CUDA:1");
    // CPU collectives without mpirun need gloo (here without a store to meet through); the mpi
    // backend needs mpirun
    const auto built = tg::dist::built_backends();
    EXPECT_HAS(testutil::error_of([] { tg::dist::world_group_for("auto", "CPU"); }),
               std::find(built.begin(), built.end(), "gloo") != built.end()
                   ? "tg launch gave no TG_RDZV_ENDPOINT"
                   : "distributed.backend=gloo (auto, for device CPU under tg launch): the gloo backend");
    EXPECT_HAS(testutil::error_of([] { tg::dist::world_group_for("mpi", "CPU"); }),
               "started by tg launch, not by mpirun");
  }
  EXPECT_EQ(tg::dist::detected_launcher(), Launcher::None);
}

TEST(Launchers, FirstNodeOfASlurmNodeList) {
  EXPECT_EQ(tg::dist::first_slurm_node("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(tg::dist::first_slurm_node("node3,node4"), "node3");
  EXPECT_EQ(tg::dist::first_slurm_node("single"), "single");
  EXPECT_EQ(tg::dist::first_slurm_node("a1,b[1-2]"), "a1");
  EXPECT_EQ(tg::dist::first_slurm_node("rack-2-n[5]"), "rack-2-n5");
  EXPECT_EQ(tg::dist::resolve_ipv4("localhost"), "127.0.0.1");
  EXPECT_EQ(tg::dist::resolve_ipv4("10.1.2.3"), "10.1.2.3");
}

// send/recv on the local backend: a ring exchange in order, a size that differs named by both
// sizes, a peer that never sends named at the deadline.
TEST(LocalPointToPoint, RingExchangeAndErrors) {
  run_local(3, [](ProcessGroup& pg) {
    const int r = pg.rank(), n = pg.size();
    for (int round = 0; round < 2; round++) {
      std::vector<float> out{float(r * 10 + round), 0.5f}, in(2);
      pg.send(out.data(), 2, DType::Float32, (r + 1) % n)->wait();
      pg.recv(in.data(), 2, DType::Float32, (r + n - 1) % n)->wait();
      EXPECT_EQ(in[0], float(((r + n - 1) % n) * 10 + round));
      EXPECT_EQ(in[1], 0.5f);
    }
    EXPECT_HAS(testutil::error_of([&] { pg.send(nullptr, 0, DType::Float32, r); }), "is not another rank");
  });
  run_local(2, [](ProcessGroup& pg) {
    std::vector<int32_t> v(4, pg.rank());
    if (pg.rank() == 0) {
      pg.send(v.data(), 4, DType::Int32, 1);
      pg.barrier()->wait();  // alive, but sending nothing more
      return;
    }
    EXPECT_HAS(testutil::error_of([&] { pg.recv(v.data(), 3, DType::Int32, 0); }),
               "local: recv of 3 int32 from rank 0 on rank 1: rank 0 sent 4 int32");
    pg.set_timeout(Seconds(0.2));
    EXPECT_HAS(testutil::error_of([&] { pg.recv(v.data(), 4, DType::Int32, 0); }),
               "timed out after 0.2 s waiting for rank 0's send");
    pg.set_timeout(Seconds(60));
    pg.barrier()->wait();
    EXPECT_HAS(testutil::error_of([&] { pg.recv(v.data(), 4, DType::Int32, 0); }),
               "rank 0 died (returned from its function) without sending it");
  });
}
