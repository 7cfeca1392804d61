// All-reduce throughput under mpirun: the project's paths beside a plain MPI_Allreduce of the
// same bytes. For each size: MPI_Allreduce (in place, float32 sum); ProcessGroup::all_reduce
// (nonblocking MPI polled against the deadline); and an ALLREDUCE node in a schedule (the
// node's copy into its own buffer + the communication thread). Rank 0 prints one line per size
// with bus bandwidth-free "algorithm" throughput (bytes / time) and the ratios to MPI.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "distributed/collective_runner.h"
#include "distributed/mpi_backend.h"

namespace {

double seconds_per(int iters, const std::function<void()>& f) {
  f();  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) f();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

int main() {
  using namespace tg;
  using namespace tg::dist;
  auto pg = mpi_world_group();
  CollectiveEngine engine(*pg);
  if (pg->rank() == 0)
    std::printf("all-reduce float32 sum, %d ranks\n%10s %12s %12s %12s %10s %10s\n", pg->size(), "MB", "MPI GB/s",
                "group GB/s", "node GB/s", "group/MPI", "node/MPI");
  for (size_t mb : {1, 4, 25}) {
    size_t n = mb * 1000000 / 4;
    int iters = mb >= 25 ? 10 : 30;
    std::vector<float> buf(n, 1.0f);
    double t_mpi = seconds_per(iters, [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    double t_pg = seconds_per(iters, [&] { pg->all_reduce(buf.data(), n, DType::Float32, ReduceOp::Sum)->wait(); });
    Tensor x = Tensor::ones({int64_t(n)});
    x.realize();
    double t_node = seconds_per(iters, [&] { all_reduce_node(*pg, x, ReduceOp::Sum).realize(); });
    double bytes = double(n) * 4;
    if (pg->rank() == 0)
      std::printf("%10zu %12.3f %12.3f %12.3f %10.2f %10.2f\n", mb, bytes / t_mpi / 1e9, bytes / t_pg / 1e9,
                  bytes / t_node / 1e9, t_mpi / t_pg, t_mpi / t_node);
  }
  return 0;
}
