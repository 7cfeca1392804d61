// All-reduce bus bandwidth under mpirun, one GPU per rank: a plain ncclAllReduce loop on a
// communicator of its own beside the project's two paths on the same bytes: the nccl process
// group's all_reduce (with its event and watchdog bookkeeping) and an ALLREDUCE node in a schedule
// (the collective engine: events between the streams). float32 sum, 1 MB to 1 GB. Bus bandwidth
// is nccl-tests' formula: bytes / time * 2 (n - 1) / n (0 at one rank, so the algorithm bandwidth,
// bytes / time, is printed too). Rank 0 prints one line per size and the ratios to plain NCCL.
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "distributed/bootstrap.h"
#include "distributed/collective_runner.h"
#include "distributed/host_exchange.h"
#include "distributed/mpi_backend.h"
#include "tinygrad/runtime/nccl_api.h"
#include "distributed/nccl_backend.h"
#include "tinygrad/device.h"
#include "tinygrad/knobs.h"

namespace {

using namespace tg;
using namespace tg::dist;

// Waits for everything queued on both of the device's streams.
void drain(Device& dev) {
  for (StreamKind s : {StreamKind::Compute, StreamKind::Comm})
    if (auto e = dev.record_event(s))
      while (!e->done()) {
      }
}

double seconds_per(ProcessGroup& host, Device& dev, int iters, const std::function<void()>& f) {
  f();  // warm-up
  drain(dev);
  host.barrier()->wait();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) f();
  drain(dev);
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  all_reduce_host(host, &t, 1, DType::Float64, ReduceOp::Max);  // the slowest rank's time
  return t;
}

// A communicator of plain NCCL, blocking, on the device's communication stream.
ncclComm_t plain_comm(ProcessGroup& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) TG_NCCL(0, ncclGetUniqueId, &id);
  group_bootstrap(host)->broadcast(&id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  TG_NCCL(host.rank(), ncclCommInitRankConfig, &comm, host.size(), id, host.rank(), &config);
  return comm;
}

}  // namespace

int main() {
  auto host = mpi_world_group();
  const std::string device = rank_device("CUDA", env_local_ranks(), device_count("CUDA"));
  knobs::DEVICE.set(device);
  Device& dev = get_device(device);
  dev.make_current();
  auto boot = group_bootstrap(*host);
  auto pg = nccl_group(*boot, device, Seconds(120));
  CollectiveEngine engine(*pg);
  ncclComm_t plain = plain_comm(*host);
  auto stream = static_cast<cudaStream_t>(dev.native_stream(StreamKind::Comm));
  const int n = host->size();
  const double bus = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (host->rank() == 0)
    std::printf("all-reduce float32 sum, %d rank(s) on %s ...; GB/s (algorithm / bus)\n%8s %16s %16s %16s %9s %9s\n",
                n, device.c_str(), "MB", "plain NCCL", "group", "node", "group/x", "node/x");
  for (size_t mb : {1, 4, 16, 64, 256, 1024}) {
    const size_t count = mb * 1000000 / 4;
    const int iters = mb >= 256 ? 10 : 50;
    Buffer buf(device, DType::Float32, static_cast<int64_t>(count));
    void* p = buf.ensure_allocated();
    double t_plain = seconds_per(*host, dev, iters, [&] {
      TG_NCCL(host->rank(), ncclAllReduce, p, p, count, ncclFloat32, ncclSum, plain, stream);
    });
    double t_group = seconds_per(*host, dev, iters, [&] { pg->all_reduce(p, count, DType::Float32, ReduceOp::Sum); });
    Tensor x = Tensor::ones({static_cast<int64_t>(count)});
    x.realize();
    double t_node = seconds_per(*host, dev, iters, [&] { all_reduce_node(*pg, x).realize(); });
    const double bytes = static_cast<double>(count) * 4;
    auto bw = [&](double t) {
      char s[32];
      std::snprintf(s, sizeof(s), "%7.1f / %6.1f", bytes / t / 1e9, bytes / t / 1e9 * bus);
      return std::string(s);
    };
    if (host->rank() == 0)
      std::printf("%8zu %16s %16s %16s %9.3f %9.3f\n", mb, bw(t_plain).c_str(), bw(t_group).c_str(),
                  bw(t_node).c_str(), t_plain / t_group, t_plain / t_node);
  }
  nccl::api().ncclCommDestroy(plain);
  return 0;
}
