// The gloo process group (distributed/gloo_backend.h) with its ranks as threads of this process,
// meeting through a rendezvous store on 127.0.0.1: every collective in the dtypes the trainer
// uses, send/recv in a ring and a size that differs, and a timeout that names the rank that never
// arrived. Skipped where the build has no gloo backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <thread>

#include "distributed/process_group.h"
#include "distributed/store.h"
#include "tinygrad/error.h"
#ifdef TG_WITH_GLOO
#include "distributed/gloo_backend.h"
#endif

using namespace tg;
using namespace tg::dist;

#ifdef TG_WITH_GLOO
namespace {

const std::string TOKEN = "gloo-test-token";

// Runs fn(group) on n ranks (threads), each with its own gloo group; returns each rank's error ("" if none).
std::vector<std::string> on_ranks(int n, const std::function<void(ProcessGroup&)>& fn, Seconds timeout = Seconds(10)) {
  StoreServerOptions so;
  so.token = TOKEN;
  StoreServer server(so);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; r++)
    ranks.emplace_back([&, r] {
      try {
        StoreClientOptions co;
        co.port = server.port();
        co.token = TOKEN;
        co.prefix = "gloo-test";
        co.timeout = Seconds(10);
        auto g = gloo_group(std::make_unique<StoreClient>(co), r, n, timeout, "127.0.0.1");
        fn(*g);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

}  // namespace

TEST(Gloo, Collectives) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    const int r = g.rank(), n = g.size();
    EXPECT_EQ(g.backend(), "gloo");
    std::vector<float> x(1001);  // odd: a ring's chunks of unequal size
    for (size_t i = 0; i < x.size(); i++) x[i] = float(r + 1) * float(i);
    g.all_reduce(x.data(), x.size(), DType::Float32, ReduceOp::Sum)->wait();
    for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(x[i], 6.0f * float(i));
    std::vector<double> m{double(r), -double(r)};
    g.all_reduce(m.data(), 2, DType::Float64, ReduceOp::Max)->wait();
    EXPECT_EQ(m, (std::vector<double>{2.0, 0.0}));
    std::vector<int64_t> a{int64_t(r) * 3};
    g.all_reduce(a.data(), 1, DType::Int64, ReduceOp::Avg)->wait();
    EXPECT_EQ(a[0], 3);
    std::vector<uint16_t> h{float_to_bfloat(1.5f), float_to_bfloat(float(r))};
    g.all_reduce(h.data(), 2, DType::BFloat16, ReduceOp::Sum)->wait();
    EXPECT_EQ(bfloat_to_float(h[0]), 4.5f);
    EXPECT_EQ(bfloat_to_float(h[1]), 3.0f);
    std::vector<float> in(size_t(n) * 2), out(2);
    for (size_t i = 0; i < in.size(); i++) in[i] = float(i + size_t(r));
    g.reduce_scatter(in.data(), out.data(), 2, DType::Float32, ReduceOp::Sum)->wait();
    EXPECT_EQ(out, (std::vector<float>{float(3 * (2 * r) + 3), float(3 * (2 * r + 1) + 3)}));
    std::vector<int32_t> mine{r, 10 * r}, all(size_t(2 * n));
    g.all_gather(mine.data(), all.data(), 2, DType::Int32)->wait();
    EXPECT_EQ(all, (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));
    std::vector<float> b{float(r), float(r)};
    g.broadcast(b.data(), 2, DType::Float32, 2)->wait();
    EXPECT_EQ(b, (std::vector<float>{2.0f, 2.0f}));
    g.barrier()->wait();
    EXPECT_EQ(g.collectives_started(), 8u);
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Gloo, SendRecvInARingAndASizeThatDiffers) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    const int r = g.rank(), n = g.size();
    for (int round = 0; round < 2; round++) {
      std::vector<float> out(5, float(10 * r + round)), in(5);
      auto s = g.send(out.data(), 5, DType::Float32, (r + 1) % n);
      auto v = g.recv(in.data(), 5, DType::Float32, (r + n - 1) % n);
      s->wait();
      v->wait();
      EXPECT_EQ(in[4], float(10 * ((r + n - 1) % n) + round));
    }
    if (r < 2) {  // rank 0 sends 3 floats, rank 1 expects 4
      std::vector<float> buf(4);
      if (r == 0) g.send(buf.data(), 3, DType::Float32, 1)->wait(Seconds(2));
      else g.recv(buf.data(), 4, DType::Float32, 0)->wait(Seconds(2));
    }
  });
  EXPECT_NE(errors[1].find("recv: rank 1 expected 4 float32 from rank 0, which sent 3 float32"), std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[2], "");
}

TEST(Gloo, ATimeoutNamesTheRankThatNeverArrived) {
  auto errors = on_ranks(
      3,
      [](ProcessGroup& g) {
        std::vector<float> x(4, 1.0f);
        g.all_reduce(x.data(), 4, DType::Float32, ReduceOp::Sum)->wait();
        if (g.rank() == 2) {  // never reaches all_reduce #1; keeps its connections open past the timeout
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        g.all_reduce(x.data(), 4, DType::Float32, ReduceOp::Sum)->wait();
      },
      Seconds(1));
  for (int r : {0, 1}) {
    EXPECT_NE(errors[size_t(r)].find("imed out"), std::string::npos) << errors[size_t(r)];
    std::printf("rank %d: %s\n", r, errors[size_t(r)].c_str());
    EXPECT_NE(errors[size_t(r)].find("gloo: all_reduce #1 failed on rank " + std::to_string(r)), std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("never reached it: rank 2"), std::string::npos) << errors[size_t(r)];
  }
  EXPECT_EQ(errors[2], "");
}
// The notices a device group (nccl) leaves through its gloo watch: rank 2 never noticed #1.
TEST(Gloo, ArrivalNoticesOfADeviceGroupNameTheMissingRank) {
  std::vector<std::string> reports(3);
  auto errors = on_ranks(3, [&](ProcessGroup& g) {
    g.notice_arrival(0);
    if (g.rank() != 2) g.notice_arrival(1);
    g.barrier()->wait();
    reports[size_t(g.rank())] = g.report_failure(1);
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(reports[0], "never reached it: rank 2");
  EXPECT_EQ(reports[1], "never reached it: rank 2");
  EXPECT_EQ(reports[2], "never reached it: rank 2");
}
#else
TEST(Gloo, NotBuilt) { GTEST_SKIP() << "the gloo backend is not built (needs libgloo-dev, libboost-dev, libssl-dev)"; }
#endif
