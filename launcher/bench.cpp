// The workloads of `tg bench`. Shapes and optimizers match scripts/bench/torch_cpu.py, which
// runs the same workloads in PyTorch.
#include "launcher/bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "launcher/registry.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/tensor.h"

namespace tg::launcher {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The process's CPU time so far (user and system, every thread), in milliseconds.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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
  std::vector<double> times, cpu_times;
  for (int i = 0; i < reps; i++) {
    auto t = Clock::now();
    double c = process_cpu_ms();
    step();
    times.push_back(ms_since(t));
    cpu_times.push_back(process_cpu_ms() - c);
  }
  r.ms = median(times);
  r.cpu_ms = median(cpu_times);
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

BenchResult matmul(const std::string& name, int64_t n, int reps, DType dtype = DType::Float32) {
  Tensor a = Tensor::randn({n, n}).cast(dtype).realize(), b = Tensor::randn({n, n}).cast(dtype).realize();
  BenchResult r = measure(name, reps, [&] { a.matmul(b).realize(); });
  r.gflops = 2.0 * n * n * n / (r.ms * 1e6);
  return r;
}

constexpr int64_t STREAM_N = 1 << 24;  // 64 MiB of float32 per operand

// Memory-bound workloads report bytes read plus bytes written, each tensor counted once.
BenchResult elementwise(const std::string& name, const Shape& shape, int reps) {
  Tensor x = Tensor::randn(shape).realize(), y = Tensor::randn(shape).realize(), z = Tensor::randn(shape).realize();
  BenchResult r = measure(name, reps, [&] { (x * y + z).relu().realize(); });
  r.gbps = 4.0 * 4 * static_cast<double>(prod(shape)) / (r.ms * 1e6);  // three reads and one write
  return r;
}

BenchResult copy(const std::string& name, const Shape& shape, int reps) {
  Tensor x = Tensor::randn(shape).realize();
  BenchResult r = measure(name, reps, [&] { (x + 0.0).contiguous().realize(); });
  r.gbps = 2.0 * 4 * static_cast<double>(prod(shape)) / (r.ms * 1e6);
  return r;
}

// 256 MiB from the default device to the next device of its backend (CUDA -> CUDA:1, CUDA:1 ->
// CUDA), peer to peer or, with PEER_COPY=0, through the host (Note [copies between devices]); the
// destination is synchronized too, so the copy is timed to completion.
BenchResult copy_peer(const std::string& name, int reps) {
  const std::string from = default_device();
  const std::string base = from.substr(0, from.find(':'));
  const int devices = device_count(base);
  TG_CHECK(devices >= 2, "tg bench ", name, ": needs two ", base, " devices, found ", devices);
  const std::string to = from == base ? base + ":1" : base;
  const int64_t n = int64_t{64} << 20;
  Tensor x = Tensor::randn({n}).realize();
  Device& dst = get_device(to);
  BenchResult r = measure(name, reps, [&] {
    x.to(to).realize();
    dst.synchronize();
  });
  r.gbps = 4.0 * static_cast<double>(n) / (r.ms * 1e6);
  return r;
}

// A GPT training step on batch b of t random tokens: forward, cross-entropy, backward, AdamW
// (weight decay on matrices only), replayed by the JIT; `dtype` is the model's compute dtype.
BenchResult gpt_step(const std::string& name, int reps, const nn::GPTConfig& c, int64_t b, int64_t t,
                     double lr, double b2, DType dtype = DType::Float32) {
  Tensor::manual_seed(0);
  nn::GPT model(c);
  if (dtype != DType::Float32) model.set_compute_dtype(dtype);
  nn::AdamW opt(nn::decay_matrices_only(model.parameters(), 0.1), lr, 0.9, b2);
  MemoryPool& pool = get_device(default_device()).pool();
  pool.reset_peak();
  Tensor x = Tensor::randint({b, t}, 0, c.vocab_size).realize(), y = Tensor::randint({b, t}, 0, c.vocab_size).realize();
  TinyJit step([&](const Tensors& in) {
    Tensor logits = model(in[0]);
    Tensor loss = logits.reshape({-1, c.vocab_size}).sparse_categorical_crossentropy(in[1].reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step({loss});
    return Tensors{loss};
  });
  BenchResult r = measure(name, reps, [&] { step({x, y}); });
  r.peak_mb = static_cast<double>(pool.stats().peak_bytes) / 1e6;
  r.tokens_per_s = static_cast<double>(b * t) / (r.ms * 1e-3);
  return r;
}

// configs/gpt_char.yaml's training step: a 4-block GPT (128 wide, 4 heads) on batch 32 of 128
// byte tokens. Reports tokens per second.
BenchResult gpt_char_step(int reps) {
  nn::GPTConfig c;
  c.vocab_size = 256, c.block_size = 128, c.n_layer = 4, c.n_head = 4, c.n_embd = 128;
  return gpt_step("gpt_char_step", reps, c, 32, 128, 2e-3, 0.99);
}

// configs/gpt2_124m.yaml's step in bf16 (scripts/bench/gpt2.sh): GPT-2 124M (vocabulary 50304)
// on batch 16 of 1024 tokens, or batch 4 of 4096 (position embeddings for 4096).
BenchResult gpt2_step(const std::string& name, int reps, int64_t b, int64_t t) {
  nn::GPTConfig c;
  c.block_size = std::max<int64_t>(t, 1024);
  return gpt_step(name, reps, c, b, t, 6e-4, 0.95, DType::BFloat16);
}

Tensor softmax(const Tensor& x) { return x.softmax(-1); }
Tensor layernorm(const Tensor& x) { return x.layernorm(); }

// An op over the rows of a matrix (softmax, layernorm): one read and one write of it.
BenchResult row_op(const std::string& name, const Shape& shape, int reps, Tensor (*op)(const Tensor&)) {
  Tensor x = Tensor::randn(shape).realize();
  BenchResult r = measure(name, reps, [&] { op(x).realize(); });
  r.gbps = 2.0 * 4 * static_cast<double>(prod(shape)) / (r.ms * 1e6);
  return r;
}

// GPT-2's column sums (a bias gradient: [16384, 768] summed over its rows) and LayerNorm's
// backward pass over [16384, 768] (the gradients of x, the weight and the bias: row statistics
// and column sums), GPU-sized. Bytes: the column sum reads x; the backward pass reads x and the
// incoming gradient and writes x's gradient (the [768] vectors are not counted).
constexpr int64_t GPT2_ROWS = 16384, GPT2_WIDTH = 768;

BenchResult column_sum(const std::string& name, int reps) {
  Tensor x = Tensor::randn({GPT2_ROWS, GPT2_WIDTH}).realize();
  BenchResult r = measure(name, reps, [&] { x.sum(0).realize(); });
  r.gbps = 4.0 * static_cast<double>(x.numel()) / (r.ms * 1e6);
  return r;
}

BenchResult layernorm_backward(const std::string& name, int reps) {
  Tensor x = Tensor::randn({GPT2_ROWS, GPT2_WIDTH}).realize(), g = Tensor::randn({GPT2_ROWS, GPT2_WIDTH}).realize();
  Tensor w = Tensor::randn({GPT2_WIDTH}).realize(), b = Tensor::randn({GPT2_WIDTH}).realize();
  for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
  BenchResult r = measure(name, reps, [&] {
    for (Tensor* t : {&x, &w, &b}) t->set_grad(std::nullopt);
    ((x.layernorm() * w + b) * g).sum().backward();
    Tensor::realize_all({*x.grad(), *w.grad(), *b.grad()});
  });
  r.gbps = 3.0 * 4 * static_cast<double>(x.numel()) / (r.ms * 1e6);
  return r;
}

struct Workload {
  template <class F>
  Workload(F f, bool in_default = true) : run(std::move(f)), by_default(in_default) {}
  std::function<BenchResult(int)> run;
  bool by_default;  // false: sized for a GPU, run only when named
};

const std::map<std::string, Workload>& workloads() {
  static const std::map<std::string, Workload> w = {
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
      // the MLP and CNN steps under train.precision: bf16 (bfloat16 products, float32 weights);
      // scripts/bench/cpu.sh's bf16 section names them
      {"mlp_step_bf16",
       {[](int reps) {
          Tensor::manual_seed(0);
          auto model = make_mlp({512, 512});
          model->set_compute_dtype(DType::BFloat16);
          nn::SGD opt(model->parameters(), 0.01, 0.9);
          return train_step("mlp_step_bf16", reps, *model, opt, {512, 1, 28, 28});
        },
        false}},
      {"cnn_step_bf16",
       {[](int reps) {
          Tensor::manual_seed(0);
          auto model = make_mnist_cnn();
          model->set_compute_dtype(DType::BFloat16);
          nn::Adam opt(model->parameters(), 1e-3);
          return train_step("cnn_step_bf16", reps, *model, opt, {512, 1, 28, 28});
        },
        false}},
      {"gpt_char_step", gpt_char_step},
      {"gpt2_step", {[](int reps) { return gpt2_step("gpt2_step", reps, 16, 1024); }, false}},
      {"gpt2_step_t4096", {[](int reps) { return gpt2_step("gpt2_step_t4096", reps, 4, 4096); }, false}},
      {"matmul_1024", [](int reps) { return matmul("matmul_1024", 1024, reps); }},
      {"matmul_2048", [](int reps) { return matmul("matmul_2048", 2048, std::max(1, reps / 2)); }},
      {"matmul_1024_bf16", {[](int reps) { return matmul("matmul_1024_bf16", 1024, reps, DType::BFloat16); }, false}},
      {"matmul_2048_bf16",
       {[](int reps) { return matmul("matmul_2048_bf16", 2048, std::max(1, reps / 2), DType::BFloat16); }, false}},
      {"matmul_8192_bf16", {[](int reps) { return matmul("matmul_8192_bf16", 8192, reps, DType::BFloat16); }, false}},
      {"matmul_8192_fp16", {[](int reps) { return matmul("matmul_8192_fp16", 8192, reps, DType::Float16); }, false}},
      {"elementwise", [](int reps) { return elementwise("elementwise", {STREAM_N}, reps); }},
      {"elementwise_8192", {[](int reps) { return elementwise("elementwise_8192", {8192, 8192}, reps); }, false}},
      {"copy", [](int reps) { return copy("copy", {STREAM_N}, reps); }},
      {"copy_8192", {[](int reps) { return copy("copy_8192", {8192, 8192}, reps); }, false}},
      {"copy_peer", {[](int reps) { return copy_peer("copy_peer", reps); }, false}},
      {"softmax", [](int reps) { return row_op("softmax", {4096, 1024}, reps, softmax); }},
      {"softmax_8192", {[](int reps) { return row_op("softmax_8192", {8192, 8192}, reps, softmax); }, false}},
      {"layernorm", [](int reps) { return row_op("layernorm", {4096, 1024}, reps, layernorm); }},
      {"layernorm_8192", {[](int reps) { return row_op("layernorm_8192", {8192, 8192}, reps, layernorm); }, false}},
      {"colsum_16384", {[](int reps) { return column_sum("colsum_16384", reps); }, false}},
      {"layernorm_bwd_16384", {[](int reps) { return layernorm_backward("layernorm_bwd_16384", reps); }, false}},
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

std::vector<std::string> default_bench_names() {
  std::vector<std::string> n;
  for (auto& [k, v] : workloads())
    if (v.by_default) n.push_back(k);
  return n;
}

std::vector<BenchResult> run_bench(const std::vector<std::string>& names, int repetitions) {
  TG_CHECK(repetitions > 0, "tg bench: repetitions must be positive, got ", repetitions);
  std::vector<BenchResult> out;
  for (auto& n : names.empty() ? default_bench_names() : names) {
    auto it = workloads().find(n);
    if (it == workloads().end()) {
      std::string list;
      for (auto& k : bench_names()) list += (list.empty() ? "" : ", ") + k;
      throw Error("tg bench: unknown workload '" + n + "' (workloads: " + list + ")");
    }
    out.push_back(it->second.run(repetitions));
  }
  return out;
}

std::string bench_json(const BenchResult& r) {
  nlohmann::json j{{"name", r.name}, {"ms", r.ms}, {"cpu_ms", r.cpu_ms}, {"first_ms", r.first_ms}};
  if (r.gflops > 0) j["gflops"] = r.gflops;
  if (r.gbps > 0) j["gbps"] = r.gbps;
  if (r.peak_mb > 0) j["peak_mb"] = r.peak_mb;
  if (r.tokens_per_s > 0) j["tokens_per_s"] = r.tokens_per_s;
  return j.dump();
}

}  // namespace tg::launcher
