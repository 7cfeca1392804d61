// One fault of rank 1 under mpirun, for tests/scripts/dist_fault.sh, which times the job and
// checks its output: after three all-reduces, rank 1 stops itself (SIGSTOP), kills itself
// (SIGKILL) or sleeps past the timeout, either before all-reduce #3 or right after starting it
// (its arrival notice sent: the case that looks as if it had arrived). Rank 0's all-reduce #3
// must end in an error naming rank 1, and the job must end (Note [a failed collective ends
// the job] in distributed/mpi_backend.cpp). Mode "stop-two": rank 1 stops, and the others wait
// on #3 in a second thread (as the communication thread does) while the main thread waits on #4
// with a long deadline: that wait must end with the first failure's message, not hang or say
// less. Mode "notices" (Note [arrival notices for a device group] in mpi_backend.cpp): the
// ranks send arrival notices for a device group's collectives, rank 1 only for #0 and #1, then
// sleeps (alive); rank 0 reports #2 as failed: the report must name rank 1 as never having
// reached it, and the job must end. Usage: dist_faults stop|stop-two|kill|sleep|notices
// before|started TIMEOUT_S
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "distributed/mpi_backend.h"
#include "tinygrad/error.h"

using namespace tg::dist;

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Rank 1's fault; prints when it happens (the driver measures from there).
void fault(const std::string& mode, double timeout_s) {
  std::printf("rank 1 faults (%s) at %.3f\n", mode.c_str(), unix_seconds());
  std::fflush(stdout);
  if (mode == "stop" || mode == "stop-two") std::raise(SIGSTOP);
  else if (mode == "kill") std::raise(SIGKILL);
  else std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 10));
}

// All-reduce #3 waited on by a second thread, #4 by this one with a deadline far past the
// group's: #4 must end soon after #3 fails.
void wait_in_two_threads(ProcessGroup& pg, std::vector<float>& a, std::vector<float>& b) {
  auto third = pg.all_reduce(a.data(), a.size(), tg::DType::Float32, ReduceOp::Sum);
  auto fourth = pg.all_reduce(b.data(), b.size(), tg::DType::Float32, ReduceOp::Sum);
  std::thread comm([&] {
    try {
      third->wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "second thread: %s\n", e.what());
    }
  });
  try {
    fourth->wait(Seconds(60));
  } catch (...) {
    comm.join();
    throw;
  }
  comm.join();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: dist_faults stop|stop-two|kill|sleep before|started TIMEOUT_S\n");
    return 2;
  }
  const std::string mode = argv[1], where = argv[2];
  const double timeout_s = std::atof(argv[3]);
  try {
    auto pg = mpi_world_group();
    pg->set_timeout(Seconds(timeout_s));
    std::printf("rank %d pid %d\n", pg->rank(), static_cast<int>(getpid()));
    std::fflush(stdout);
    if (mode == "notices") {
      for (uint64_t s = 0; s < (pg->rank() == 1 ? 2u : 3u); s++) pg->notice_arrival(s);
      if (pg->rank() == 1) fault(mode, timeout_s);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      throw tg::Error("a device collective #2 failed; " + pg->report_failure(2));
    }
    // 4 MB: past the eager limit, so the all-reduce cannot finish without every rank's progress
    std::vector<float> grad(1 << 20, 1.0f);
    for (int step = 0; step < 3; step++) pg->all_reduce(grad.data(), grad.size(), tg::DType::Float32, ReduceOp::Sum)->wait();
    if (pg->rank() == 1) {
      std::shared_ptr<Work> started;
      if (where == "started") started = pg->all_reduce(grad.data(), grad.size(), tg::DType::Float32, ReduceOp::Sum);
      fault(mode, timeout_s);
    }
    if (mode == "stop-two") {
      std::vector<float> more(grad.size(), 1.0f);
      wait_in_two_threads(*pg, grad, more);
    }
    // training goes on: a rank whose #3 could finish without rank 1 waits in #4 or #5
    for (int step = 3; step < 6; step++) pg->all_reduce(grad.data(), grad.size(), tg::DType::Float32, ReduceOp::Sum)->wait();
    std::printf("rank %d: all-reduces #3-#5 finished despite rank 1\n", pg->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
