// The workloads of `tg bench`. Shapes and optimizers match scripts/bench/torch_cpu.py, which
// runs the same workloads in PyTorch.
#include "launcher/bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "launcher/registry.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/tensor.h"

namespace tg::launcher {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Runs step() (which must realize its results) `reps` times after one warm-up, in place. Each
// step ends with a synchronize of the default device, so GPU kernels are timed to completion.
BenchResult measure(const std::string& name, int reps, const std::function<void()>& step_fn) {
  Device& dev = get_device(default_device());
  auto step = [&] {
    step_fn();
    dev.synchronize();
  };
  BenchResult r{name};
  auto t0 = Clock::now();
  step();
  r.first_ms = ms_since(t0);
  step();
  std::vector<double> times;
  for (int i = 0; i < reps; i++) {
    auto t = Clock::now();
    step();
    times.push_back(ms_since(t));
  }
  std::sort(times.begin(), times.end());
  r.ms = times[times.size() / 2];
  return r;
}

BenchResult train_step(const std::string& name, int reps, nn::Module& model, nn::Optimizer& opt, const Shape& x_shape) {
  MemoryPool& pool = get_device(default_device()).pool();
  pool.reset_peak();
  Tensor x = Tensor::randn(x_shape).realize();
  Tensor y = Tensor::randint({x_shape[0]}, 0, 10).realize();
  TinyJit step([&](const Tensors& in) {
    Tensor loss = model(in[0]).sparse_categorical_crossentropy(in[1]);
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  });
  BenchResult r = measure(name, reps, [&] { step({x, y}); });  // under JIT=1: run, capture, then replays
  r.peak_mb = static_cast<double>(pool.stats().peak_bytes) / 1e6;
  return r;
}

BenchResult matmul(int64_t n, int reps) {
  Tensor a = Tensor::randn({n, n}).realize(), b = Tensor::randn({n, n}).realize();
  BenchResult r = measure("matmul_" + std::to_string(n), reps, [&] { a.matmul(b).realize(); });
  r.gflops = 2.0 * n * n * n / (r.ms * 1e6);
  return r;
}

constexpr int64_t STREAM_N = 1 << 24;  // 64 MiB of float32 per operand

const std::map<std::string, std::function<BenchResult(int)>>& workloads() {
  static const std::map<std::string, std::function<BenchResult(int)>> w = {
      {"mlp_step",
       [](int reps) {
         Tensor::manual_seed(0);
         auto model = make_mlp({512, 512});
         nn::SGD opt(model->parameters(), 0.01, 0.9);
         return train_step("mlp_step", reps, *model, opt, {512, 1, 28, 28});
       }},
      {"mlp_step_b16",
       [](int reps) {
         // the same step on 16 examples: mostly the per-step cost outside the kernels (graph,
         // schedule, launches), which JIT replays remove
         Tensor::manual_seed(0);
         auto model = make_mlp({512, 512});
         nn::SGD opt(model->parameters(), 0.01, 0.9);
         return train_step("mlp_step_b16", reps, *model, opt, {16, 1, 28, 28});
       }},
      {"cnn_step",
       [](int reps) {
         Tensor::manual_seed(0);
         auto model = make_mnist_cnn();
         nn::Adam opt(model->parameters(), 1e-3);
         return train_step("cnn_step", reps, *model, opt, {512, 1, 28, 28});
       }},
      {"matmul_1024", [](int reps) { return matmul(1024, reps); }},
      {"matmul_2048", [](int reps) { return matmul(2048, std::max(1, reps / 2)); }},
      {"elementwise",
       [](int reps) {
         Tensor x = Tensor::randn({STREAM_N}).realize(), y = Tensor::randn({STREAM_N}).realize(),
                z = Tensor::randn({STREAM_N}).realize();
         BenchResult r = measure("elementwise", reps, [&] { (x * y + z).relu().realize(); });
         r.gbps = 4.0 * 4 * STREAM_N / (r.ms * 1e6);  // three reads and one write
         return r;
       }},
      {"copy",
       [](int reps) {
         Tensor x = Tensor::randn({STREAM_N}).realize();
         BenchResult r = measure("copy", reps, [&] { (x + 0.0).contiguous().realize(); });
         r.gbps = 2.0 * 4 * STREAM_N / (r.ms * 1e6);
         return r;
       }},
      {"softmax",
       [](int reps) {
         Tensor x = Tensor::randn({4096, 1024}).realize();
         BenchResult r = measure("softmax", reps, [&] { x.softmax(-1).realize(); });
         r.gbps = 2.0 * 4 * 4096 * 1024 / (r.ms * 1e6);
         return r;
       }},
      {"layernorm",
       [](int reps) {
         Tensor x = Tensor::randn({4096, 1024}).realize();
         BenchResult r = measure("layernorm", reps, [&] { x.layernorm().realize(); });
         r.gbps = 2.0 * 4 * 4096 * 1024 / (r.ms * 1e6);
         return r;
       }},
      {"conv2d",
       [](int reps) {
         // the CNN's second layer: 32 -> 32 channels, 5x5, on 24x24 maps, batch 512
         Tensor x = Tensor::randn({512, 32, 24, 24}).realize();
         Tensor w = (Tensor::randn({32, 32, 5, 5}) * 0.05).realize();
         w.requires_grad_();
         x.requires_grad_();
         BenchResult r = measure("conv2d", reps, [&] {
           x.set_grad(std::nullopt);
           w.set_grad(std::nullopt);
           Tensor out = x.conv2d(w);
           out.sum().backward();
           Tensor::realize_all({out, *x.grad(), *w.grad()});
         });
         r.gflops = 3 * 2.0 * 512 * 32 * 20 * 20 * 32 * 25 / (r.ms * 1e6);  // forward + two backward
         return r;
       }},
  };
  return w;
}

}  // namespace

std::vector<std::string> bench_names() {
  std::vector<std::string> n;
  for (auto& [k, v] : workloads()) n.push_back(k);
  return n;
}

std::vector<BenchResult> run_bench(const std::vector<std::string>& names, int repetitions) {
  TG_CHECK(repetitions > 0, "tg bench: repetitions must be positive, got ", repetitions);
  std::vector<BenchResult> out;
  for (auto& n : names.empty() ? bench_names() : names) {
    auto it = workloads().find(n);
    if (it == workloads().end()) {
      std::string list;
      for (auto& k : bench_names()) list += (list.empty() ? "" : ", ") + k;
      throw Error("tg bench: unknown workload '" + n + "' (workloads: " + list + ")");
    }
    out.push_back(it->second(repetitions));
  }
  return out;
}

std::string bench_json(const BenchResult& r) {
  nlohmann::json j{{"name", r.name}, {"ms", r.ms}, {"first_ms", r.first_ms}};
  if (r.gflops > 0) j["gflops"] = r.gflops;
  if (r.gbps > 0) j["gbps"] = r.gbps;
  if (r.peak_mb > 0) j["peak_mb"] = r.peak_mb;
  return j.dump();
}

}  // namespace tg::launcher
