// Tensor basics on each CPU compiler (this binary runs once with CPU_LLVM=0 and once with
// CPU_LLVM=1): hand-checked values, autograd, dtypes, assign.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "device_env.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/observe.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/tensor.h"
#include "tinygrad/tensor_internal.h"

using namespace tg;

namespace {
Tensor vec(std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); }
}  // namespace

// The CPU compiler this run asked for (CPU_LLVM, set per test by CTest; 1 when unset) is the
// one the CPU device compiles with: its compiler's cache key names it, and a kernel realized on
// the CPU goes through it.
TEST(Tensor, ReportsCompiler) {
  const char* env = std::getenv("CPU_LLVM");
  const bool want_llvm = built_with_llvm() && !(env && std::string(env) == "0");
  const std::string kind = cpu_compiler_kind();
  std::printf("CPU compiler: %s\n", kind.c_str());
  EXPECT_EQ(kind, want_llvm ? "llvm" : "cc") << "CPU_LLVM=" << (env ? env : "(unset)");
  Device& cpu = get_device("CPU");
  const std::string key = cpu.compiler().cache_key();
  EXPECT_EQ(key.rfind(want_llvm ? "llvm-" : "cc:", 0), 0u) << key;
  EXPECT_NE(cpu.description().find(key), std::string::npos) << cpu.description();
  const size_t compiled = cpu.compiled_count();
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, {.device = "CPU"});
  EXPECT_EQ((x * 3.0 + 0.5).to_vector<float>(), (std::vector<float>{3.5, 6.5, 9.5}));
  EXPECT_GT(cpu.compiled_count(), compiled);
}

TEST(Tensor, ElementwiseAndReduce) {
  Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ((a * 2.0 + 1.0).to_vector<float>(), (std::vector<float>{3, 5, 7, 9, 11, 13}));
  EXPECT_EQ(a.sum(0).to_vector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(a.sum(1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(a.max(1).to_vector<float>(), (std::vector<float>{3, 6}));
  EXPECT_EQ(a.argmax(1).to_vector<int32_t>(), (std::vector<int32_t>{2, 2}));
  EXPECT_FLOAT_EQ(a.mean().item<float>(), 3.5f);
}

TEST(Tensor, MatmulByHand) {
  Tensor a = vec({1, 2, 3, 4}, {2, 2}), b = vec({5, 6, 7, 8}, {2, 2});
  EXPECT_EQ(a.matmul(b).to_vector<float>(), (std::vector<float>{19, 22, 43, 50}));
}

TEST(Tensor, AutogradByHand) {
  Tensor x = vec({1, 2, 3}, {3}).requires_grad_();
  Tensor y = (x * x).sum();  // dy/dx = 2x
  y.backward();
  EXPECT_EQ(x.grad()->to_vector<float>(), (std::vector<float>{2, 4, 6}));
  // gradients accumulate
  (x * 3.0).sum().backward();
  EXPECT_EQ(x.grad()->to_vector<float>(), (std::vector<float>{5, 7, 9}));
}

TEST(Tensor, DetachAndNoGrad) {
  Tensor x = vec({1, 2}, {2}).requires_grad_();
  Tensor y = (x.detach() * x).sum();  // d/dx = detached x
  y.backward();
  EXPECT_EQ(x.grad()->to_vector<float>(), (std::vector<float>{1, 2}));
  NoGradGuard guard;
  EXPECT_FALSE((x * 2.0).requires_grad());
}

TEST(Tensor, Float16AndBFloat16) {
  Tensor a = vec({1.5f, -2.25f, 1000.0f}, {3});
  EXPECT_EQ(a.cast(DType::Float16).cast(DType::Float32).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 1000.0f}));
  Tensor h = a.cast(DType::Float16);
  EXPECT_EQ((h + h).to_vector<float>(), (std::vector<float>{3.0f, -4.5f, 2000.0f}));
  Tensor b = a.cast(DType::BFloat16);
  EXPECT_EQ((b * b.scalar_like(2)).to_vector<float>(), (std::vector<float>{3.0f, -4.5f, 2000.0f}));
  EXPECT_FLOAT_EQ(vec({1.0f / 3.0f}, {1}).cast(DType::BFloat16).item<float>(), 0.333984375f);
}

TEST(Tensor, IntegerOps) {
  Tensor a = Tensor::from_vector(std::vector<int32_t>{7, -7, 9}, {3});
  Tensor b = Tensor::from_vector(std::vector<int32_t>{2, 2, 4}, {3});
  EXPECT_EQ(a.idiv(b).to_vector<int32_t>(), (std::vector<int32_t>{3, -3, 2}));
  EXPECT_EQ(a.mod(b).to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 1}));
  EXPECT_EQ(a.sum().dtype(), DType::Int64);
  EXPECT_EQ(a.sum().item<int64_t>(), 9);
  EXPECT_EQ((a < b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0}));
}

TEST(Tensor, AssignReplacesValue) {
  Tensor w = vec({1, 2}, {2});
  w.assign(w * 10.0);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{10, 20}));
  EXPECT_EQ(w.uop()->op, Op::BUFFER);
}

// Note [tensor observers] in engine/observe.h: a registered observer is told of every assign
// (with the buffers before and after) and host read; once removed, of nothing.
TEST(Tensor, AssignsAndHostReadsReachObservers) {
  struct Log final : TensorObserver {
    std::vector<std::pair<Buffer*, Buffer*>> assigns;
    std::vector<Shape> reads;
    void on_assign(const Tensor&, const std::shared_ptr<Buffer>& before,
                   const std::shared_ptr<Buffer>& after) override {
      assigns.emplace_back(before.get(), after.get());
    }
    void on_host_read(const Tensor& t) override { reads.push_back(t.shape()); }
  } seen;
  struct Registered {
    TensorObserver* o;
    ~Registered() { remove_tensor_observer(o); }
  };
  Tensor w = vec({1, 2}, {2});
  w.realize();
  auto before = TensorAccess::buffer(w);
  {
    add_tensor_observer(&seen);
    Registered scope{&seen};
    w.assign(w * 10.0);
    EXPECT_FLOAT_EQ(w.sum().item<float>(), 30.0f);
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{10, 20}));  // not observed
  ASSERT_EQ(seen.assigns.size(), 1u);
  EXPECT_EQ(seen.assigns[0].first, before.get());
  EXPECT_EQ(seen.assigns[0].second, TensorAccess::buffer(w).get());
  EXPECT_NE(seen.assigns[0].first, seen.assigns[0].second);
  EXPECT_EQ(seen.reads, (std::vector<Shape>{Shape{}}));
}

TEST(Tensor, EmptyTensors) {
  Tensor e = Tensor::zeros({0, 3});
  EXPECT_EQ((e + 1.0).to_vector<float>().size(), 0u);
  EXPECT_EQ(e.sum(0).to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Tensor, Conv2dByHand) {
  // 1x1x3x3 input, 1x1x2x2 ones kernel: each output is the sum of a 2x2 window
  Tensor x = vec({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = Tensor::ones({1, 1, 2, 2});
  EXPECT_EQ(x.conv2d(w).to_vector<float>(), (std::vector<float>{12, 16, 24, 28}));
  EXPECT_EQ(x.max_pool2d({2}, {1}).to_vector<float>(), (std::vector<float>{5, 6, 8, 9}));
}

TEST(Tensor, RandomIsSeeded) {
  Tensor::manual_seed(42);
  auto a = Tensor::rand({100}).to_vector<float>();
  Tensor::manual_seed(42);
  auto b = Tensor::rand({100}).to_vector<float>();
  EXPECT_EQ(a, b);
  double mean = 0;
  for (float v : a) {
    mean += v;
    EXPECT_TRUE(v >= 0 && v < 1);
  }
  EXPECT_NEAR(mean / 100, 0.5, 0.1);
}
