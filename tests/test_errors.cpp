// Bad input gives a tg::Error whose message names the op and the operands; the process stays
// usable afterwards. Generated code that a compiler refuses is a CompileError, an internal error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/tensor.h"
#include "test_util.h"

using namespace tg;

namespace {
using testutil::error_of;
void expect_has(const std::string& msg, const std::string& part) { EXPECT_HAS(msg, part); }
}  // namespace

TEST(Errors, BroadcastMismatchNamesBothOperands) {
  Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({4});
  auto m = error_of([&] { a + b; });
  expect_has(m, "add");
  expect_has(m, "float32[2,3] on CPU");
  expect_has(m, "float32[4] on CPU");
}

TEST(Errors, MatmulInnerDims) {
  Tensor a = Tensor::ones({4, 768}), b = Tensor::ones({1024, 8});
  auto m = error_of([&] { a.matmul(b); });
  expect_has(m, "matmul: a.shape[-1]=768 != b.shape[-2]=1024");
  expect_has(m, "a: float32[4,768] on CPU");
}

TEST(Errors, BadReshape) {
  auto m = error_of([] { Tensor::ones({2, 3}).reshape({4}); });
  expect_has(m, "reshape");
  expect_has(m, "float32[2,3]");
  expect_has(m, "[4]");
  expect_has(error_of([] { Tensor::ones({6}).reshape({-1, -1}); }), "only one dimension can be -1");
}

TEST(Errors, AxisOutOfRange) {
  auto m = error_of([] { Tensor::ones({2, 3}).sum(2); });
  expect_has(m, "sum: axis 2 is out of range");
  expect_has(error_of([] { Tensor::ones({2, 3}).permute({0, 0}); }), "permute: axis 0 repeats");
  expect_has(error_of([] { Tensor::ones({2, 3}).transpose(0, 5); }), "axis 5");
}

TEST(Errors, IndexOutOfRange) {
  auto m = error_of([] { Tensor::ones({3, 2})[{5}]; });
  expect_has(m, "index 5 is out of bounds for dim 0 with size 3");
}

TEST(Errors, DtypeMistakes) {
  expect_has(error_of([] { Tensor::ones({3}, {.dtype = DType::Int32}).requires_grad_(); }),
             "only floating-point tensors can require gradients");
  expect_has(error_of([] { Tensor::ones({3}).idiv(Tensor::ones({3})); }), "idiv");
  expect_has(error_of([] { Tensor::ones({2, 3}).sparse_categorical_crossentropy(Tensor::ones({2})); }),
             "labels must be integer");
  expect_has(error_of([] { dtype_from_name("float17"); }), "unknown dtype 'float17'");
}

TEST(Errors, Devices) {
  expect_has(error_of([] { Tensor::ones({2}).to("NOPE"); }), "unknown device 'NOPE'");
  expect_has(error_of([] { Tensor::ones({2}, {.device = "NOPE:1"}).realize(); }), "unknown device");
}

TEST(Errors, ConvShapes) {
  Tensor x = Tensor::ones({1, 3, 8, 8});
  expect_has(error_of([&] { x.conv2d(Tensor::ones({4, 2, 3, 3})); }), "conv2d: weight float32[4,2,3,3] on CPU expects 2");
  expect_has(error_of([&] { Tensor::ones({3, 8, 8}).conv2d(Tensor::ones({4, 3, 3, 3})); }), "input must be [N, C, H, W]");
}

TEST(Errors, BackwardNeedsScalar) {
  Tensor w = Tensor::ones({3}).requires_grad_();
  expect_has(error_of([&] { (w * 2.0).backward(); }), "implicit gradient needs a scalar");
}

TEST(Errors, ProcessStaysUsable) {
  EXPECT_THROW(Tensor::ones({2, 3}) + Tensor::ones({5}), Error);
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  EXPECT_FLOAT_EQ((a * 2.0).sum().item<float>(), 12.0f);
}

namespace {
int fail_with_code(int code) {
  if (code > 0) return code;
  TG_FAIL("code must be positive, got ", code, " (", 1.5, ")");  // no return after: TG_FAIL does not return
}

// Sets an environment variable for one scope and restores what it was.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvScope() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A CPU device built with CPU_LLVM=llvm (the knob restored after).
std::unique_ptr<Device> cpu_device_with(int llvm) {
  int saved = knobs::CPU_LLVM.get();
  knobs::CPU_LLVM.set(llvm);
  auto dev = make_cpu_device("CPU");
  knobs::CPU_LLVM.set(saved);
  return dev;
}
}  // namespace

TEST(Errors, FailThrowsTheConcatenatedMessage) {
  EXPECT_EQ(fail_with_code(3), 3);
  EXPECT_EQ(error_of([] { fail_with_code(-2); }), "code must be positive, got -2 (1.5)");
}

TEST(Errors, BrokenGeneratedKernelIsAnInternalCompileError) {
  std::vector<int> kinds = {0};
  if (built_with_llvm()) kinds.push_back(1);
  for (int llvm : kinds) {
    SCOPED_TRACE(llvm ? "LLVM" : "C compiler");
    auto dev = cpu_device_with(llvm);
    const std::string source = "this is not a kernel {\n  tg_broken_marker(;\n";
    try {
      dev->compiler().compile("tg_broken_kernel", source);
      ADD_FAILURE() << "expected CompileError";
    } catch (const CompileError& e) {
      EXPECT_EQ(e.kernel(), "tg_broken_kernel");
      EXPECT_EQ(e.source(), source);
      std::string m = e.what();
      const std::string head =
          "internal error, please report: generated kernel 'tg_broken_kernel' does not compile";
      EXPECT_EQ(m.rfind(head, 0), 0u) << m;
      expect_has(m, "source of kernel 'tg_broken_kernel':\n   1| this is not a kernel {\n");
      expect_has(m, "\n   2|   tg_broken_marker(;\n");
      expect_has(m, llvm ? "LLVM: cannot parse kernel tg_broken_kernel" : "failed to compile with");
      expect_has(m, llvm ? "expected top-level entity" : "error");  // the compiler's own log
    }
  }
}

TEST(Errors, AMissingCCompilerIsTheUsersMistake) {
  auto dev = cpu_device_with(0);
  std::string saved = knobs::CC.get();
  knobs::CC.set("/nonexistent/tg-cc");
  std::string m;
  bool internal = false;
  try {
    dev->compiler().compile("tg_cc_missing", "void tg_cc_missing(void** b, long long lo, long long hi) {}\n");
  } catch (const CompileError&) {
    internal = true;
  } catch (const Error& e) {
    m = e.what();
  }
  knobs::CC.set(saved);
  EXPECT_FALSE(internal);
  expect_has(m, "CC='/nonexistent/tg-cc': the C compiler cannot be run");
}

TEST(Errors, RankLabelNamesTheMpiRank) {
  {
    EnvScope unset("OMPI_COMM_WORLD_RANK", nullptr);
    EXPECT_EQ(process_rank_label(), "");
  }
  {
    EnvScope rank("OMPI_COMM_WORLD_RANK", "3");
    EXPECT_EQ(process_rank_label(), " (rank 3)");
    try {
      throw CompileError("k", "x", "log");
    } catch (const CompileError& e) {
      expect_has(e.what(), "generated kernel 'k' does not compile (rank 3): log");
    }
  }
}
