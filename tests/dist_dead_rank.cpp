// A rank that dies mid-step: rank 1 exits (without MPI_Finalize) after a few all-reduces; the
// others must fail their next all-reduce within the collective timeout, with an error naming
// rank 1 and the collective, instead of hanging. Run under `mpirun --enable-recovery` (else
// mpirun itself kills the survivors when a rank exits without MPI_Finalize); prints
// "survivor error after S s: ..." on success, which CTest matches.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "distributed/mpi_backend.h"
#include "tinygrad/error.h"

int main() {
  using namespace tg::dist;
  auto pg = mpi_world_group();
  pg->set_timeout(Seconds(3));
  std::vector<float> grad(1000, 1.0f);
  for (int step = 0; step < 3; step++) pg->all_reduce(grad.data(), grad.size(), tg::DType::Float32, ReduceOp::Sum)->wait();
  if (pg->rank() == 1) {
    std::fprintf(stderr, "rank 1: dying in step 3\n");
    std::fflush(stderr);
    _exit(0);
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    pg->all_reduce(grad.data(), grad.size(), tg::DType::Float32, ReduceOp::Sum)->wait();
    std::printf("rank %d: the all-reduce finished without rank 1\n", pg->rank());
  } catch (const tg::Error& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string msg = e.what();
    bool named = msg.find("all_reduce #3") != std::string::npos && msg.find(": 1 (last seen") != std::string::npos;
    std::printf("survivor error%s after %.1f s: %s\n", named ? "" : " (does not name rank 1)", s, msg.c_str());
  }
  std::fflush(stdout);
  _exit(0);  // MPI_Finalize would wait for the dead rank
}
