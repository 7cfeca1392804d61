// `tg bench`: the project's side of the benchmark suite (scripts/bench/ runs it beside PyTorch).
// Each workload runs on random data after warm-up steps (compilation excluded) and reports the
// median time of its timed repetitions, plus GFLOP/s or GB/s where those are the measure.
#pragma once
#include <string>
#include <vector>

namespace tg::launcher {

struct BenchResult {
  std::string name;
  double ms = 0;          // median milliseconds per repetition
  double cpu_ms = 0;      // median CPU time per repetition (every thread's; a loaded machine stretches ms, not this)
  double gflops = 0;      // 0 when not a measure of this workload
  double gbps = 0;
  double first_ms = 0;    // the first repetition, compilation included
  double peak_mb = 0;     // training steps: the memory pool's peak from the inputs' creation on
  double tokens_per_s = 0;  // language-model steps
};

// Workloads: mlp_step, cnn_step, gpt_char_step, matmul_1024, matmul_2048, elementwise, copy, softmax,
// layernorm, conv2d, mlp_step_b16, and, sized for a GPU and run only when named, matmul_8192_bf16,
// matmul_8192_fp16, copy_8192, elementwise_8192, softmax_8192 and layernorm_8192, and copy_peer
// (256 MiB from the default device to the next of its backend, CUDA -> CUDA:1; PEER_COPY=0 for
// the host path). An empty list runs all the others.
std::vector<std::string> bench_names();
// The workloads `tg bench` runs when none is named: all but the GPU-sized ones.
std::vector<std::string> default_bench_names();
std::vector<BenchResult> run_bench(const std::vector<std::string>& names, int repetitions);
std::string bench_json(const BenchResult& r);  // one JSON object per line

}  // namespace tg::launcher
