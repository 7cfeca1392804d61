// Bad input gives a tg::Error whose message names the op and the operands; the process stays
// usable afterwards.
#include <gtest/gtest.h>

#include "tinygrad/device.h"
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
