// Library matmuls (Note [library matmuls] in device.h). Two halves: which kernels
// schedule/match_matmul.h recognises as products, with their sizes and strides (no device
// needed), and, on CUDA (label gpu; skipped with the reason where the device or cuBLASLt is
// missing), products through cuBLASLt against the generated kernel and a float64 product on the
// host, over dtypes, odd shapes, transposed and batched operands and the fused bias and relu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "library_device.h"
#include "ops_util.h"
#include "test_util.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/realize.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/schedule/library_operands.h"
#include "tinygrad/schedule/match_matmul.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {
namespace {

using testutil::library_device;
using testutil::rnd;

// The spec of t's one kernel (its inputs realized), or nullopt.
std::optional<MatmulSpec> spec_of(const Tensor& t) {
  auto items = create_schedule({t.uop()});
  std::vector<const ScheduleItem*> kernels;
  for (auto& item : items)
    if (item.kind == ScheduleItem::Kind::Kernel) kernels.push_back(&item);
  EXPECT_EQ(kernels.size(), 1u);
  if (kernels.size() != 1) return std::nullopt;
  std::vector<DType> dtypes;
  for (auto& b : kernels[0]->buffers) dtypes.push_back(b->dtype());
  return match_matmul(kernels[0]->ast, dtypes);
}

Tensor input(const Shape& s, uint32_t seed, DType dt = DType::Float32) {
  return rnd(s, seed, -1, 1, dt).realize();
}

// {batch, m, n, k} and the row and column strides of a, b and out.
std::vector<int64_t> sizes(const MatmulSpec& s) { return {s.batch, s.m, s.n, s.k}; }
std::vector<int64_t> strides(const MatmulSpec& s) {
  return {s.a.stride_row, s.a.stride_col, s.b.stride_row, s.b.stride_col, s.out.stride_row, s.out.stride_col};
}

TEST(MatchMatmul, PlainProduct) {
  auto spec = spec_of(input({24, 40}, 1).matmul(input({40, 56}, 2)));
  ASSERT_TRUE(spec);
  EXPECT_EQ(sizes(*spec), (std::vector<int64_t>{1, 24, 56, 40}));
  EXPECT_EQ(strides(*spec), (std::vector<int64_t>{40, 1, 56, 1, 56, 1}));
  EXPECT_EQ(spec->out.param, 0);
  EXPECT_FALSE(spec->bias);
  EXPECT_FALSE(spec->relu);
  EXPECT_EQ(spec->name(), "matmul_float32_24x56x40");
}

TEST(MatchMatmul, TransposedOperandsAreStrides) {
  auto spec = spec_of(input({40, 24}, 1).T().matmul(input({56, 40}, 2).T()));
  ASSERT_TRUE(spec);
  EXPECT_EQ(sizes(*spec), (std::vector<int64_t>{1, 24, 56, 40}));
  EXPECT_EQ(strides(*spec), (std::vector<int64_t>{1, 24, 1, 40, 56, 1}));
}

TEST(MatchMatmul, BatchedAndBroadcastBatch) {
  auto spec = spec_of(input({3, 8, 16}, 1, DType::BFloat16).matmul(input({3, 16, 12}, 2, DType::BFloat16)));
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->batch, 3);
  EXPECT_EQ(spec->a.stride_batch, 8 * 16);
  EXPECT_EQ(spec->b.stride_batch, 16 * 12);
  EXPECT_EQ(spec->out.stride_batch, 8 * 12);
  EXPECT_EQ(spec->a.dtype, DType::BFloat16);
  // [B, T, K] x [K, N]: B and T are one row dim of a and out
  auto merged = spec_of(input({3, 8, 16}, 1).matmul(input({16, 12}, 2)));
  ASSERT_TRUE(merged);
  EXPECT_EQ(merged->batch, 1);
  EXPECT_EQ(merged->m, 24);
  // a batch read by one operand only, not mergeable with its rows: broadcast (stride 0)
  auto bcast = spec_of(input({16, 12}, 2).matmul(input({3, 12, 8}, 1)));
  ASSERT_TRUE(bcast);
  EXPECT_EQ(bcast->batch, 3);
  EXPECT_EQ(bcast->a.stride_batch + bcast->b.stride_batch, 12 * 8);
}

TEST(MatchMatmul, LinearWithBiasAndRelu) {
  // 16 rows: the CPU's scheduler would copy the transposed W for more (Note [transposed B])
  Tensor x = input({16, 20}, 1), w = input({12, 20}, 2), b = input({12}, 3);
  auto spec = spec_of(x.linear(w, b).relu());
  ASSERT_TRUE(spec);
  ASSERT_TRUE(spec->bias);
  EXPECT_TRUE(spec->relu);
  EXPECT_EQ(spec->bias->stride_col, 1);
  EXPECT_EQ(spec->bias->stride_row, 0);
  EXPECT_EQ(spec->name(), "matmul_float32_16x12x20_bias_relu");
  // relu before the bias is not the library's epilogue
  EXPECT_FALSE(spec_of(x.matmul(w.T()).relu() + b));
  // a bias along the rows is not either
  EXPECT_FALSE(spec_of(x.matmul(w.T()) + input({16, 1}, 4)));
}

TEST(MatchMatmul, Float32OperandsCastToBFloat16) {
  // the library's form, one kernel: a CPU with bf16 dot tiles would round the casts into buffers
  // of their own first (Note [bfloat16 operands in buffers] in schedule/padded_rows.cpp)
  std::optional<testutil::KnobScope<decltype(knobs::CPU_ISA)>> isa;
  if (get_device("CPU").policy().cpu.bf16_dot) isa.emplace(knobs::CPU_ISA, "avx2");
  Tensor a = input({8, 16}, 1), b = input({16, 8}, 2);
  auto spec = spec_of(a.cast(DType::BFloat16).matmul(b.cast(DType::BFloat16)).float_());
  ASSERT_TRUE(spec);
  EXPECT_TRUE(spec->inputs_bf16);
  EXPECT_EQ(spec->a.dtype, DType::Float32);
  EXPECT_EQ(spec->name(), "matmul_bfloat16_8x8x16_to_float32");
  // one operand cast, the other not: no library type pair
  EXPECT_FALSE(spec_of(a.cast(DType::BFloat16).matmul(input({16, 8}, 3, DType::BFloat16))));
}

TEST(MatchMatmul, OutputCast) {
  auto spec = spec_of(input({8, 16}, 1, DType::Float16).matmul(input({16, 8}, 2, DType::Float16)).float_());
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->a.dtype, DType::Float16);
  EXPECT_EQ(spec->out.dtype, DType::Float32);
  EXPECT_EQ(spec->name(), "matmul_float16_8x8x16_to_float32");
}

TEST(MatchMatmul, OtherKernelsAreNotProducts) {
  Tensor a = input({16, 16}, 1), b = input({16, 16}, 2);
  EXPECT_FALSE(spec_of(a * b));              // no reduce
  EXPECT_FALSE(spec_of((a * b).sum(1)));     // dot products (m = n = 1): a plain reduce
  // a computed operand (read by only 4 columns: a wider product realizes it first on the CPU,
  // Note [product operands] in schedule/schedule.cpp)
  EXPECT_FALSE(spec_of(a.exp().matmul(input({16, 4}, 3))));
  EXPECT_FALSE(spec_of(a.pad({{0, 0}, {1, 1}}).matmul(b.pad({{1, 1}, {0, 0}}))));  // gated loads
  EXPECT_FALSE(spec_of(a.flip({1}).matmul(b)));                                    // a negative stride
  EXPECT_FALSE(spec_of(a.max(1)));                                                 // not a sum
}

// The CPU has no library: products there stay generated kernels.
TEST(MatchMatmul, CpuRunsGeneratedKernels) {
  auto spec = spec_of(input({8, 8}, 1).matmul(input({8, 8}, 2)));
  ASSERT_TRUE(spec);
  EXPECT_EQ(get_device("CPU").get_matmul_program(*spec), nullptr);
}

// ---- Note [library operands] in schedule/library_operands.cpp --------------------------------

// The first MUL below `root` (depth first), or null.
UOpPtr first_mul(const UOpPtr& root) {
  if (root->op == Op::MUL) return root;
  for (auto& s : root->src)
    if (UOpPtr m = first_mul(s)) return m;
  return nullptr;
}

// `root` rebuilt with `from` replaced by `to`.
UOpPtr replaced(const UOpPtr& root, const UOp* from, const UOpPtr& to) {
  if (root.get() == from) return to;
  std::vector<UOpPtr> src = root->src;
  bool changed = false;
  for (auto& s : src)
    if (UOpPtr r = replaced(s, from, to); r != s) s = r, changed = true;
  return changed ? make_uop(root->op, root->dtype, std::move(src), root->arg, root->shape, root->device) : root;
}

// The specs of the products among the kernels that compute `roots` (their inputs realized).
std::vector<MatmulSpec> product_specs(const std::vector<UOpPtr>& roots) {
  std::vector<MatmulSpec> specs;
  for (auto& item : create_schedule(roots)) {
    if (item.kind != ScheduleItem::Kind::Kernel) continue;
    std::vector<DType> dtypes;
    for (auto& b : item.buffers) dtypes.push_back(b->dtype());
    if (auto spec = match_matmul(item.ast, dtypes)) specs.push_back(*spec);
  }
  return specs;
}

// Attention's output [B, H, T, D] read as [B*T, H*D] by its projection has no strides: the
// permuted view below the reshape is replaced by a contiguous copy (in [B, T, H, D] order), after
// which the product is a library product with the same values. A transposed weight keeps its
// strided read.
TEST(LibraryOperands, MergedDimsThatAreNotOneBlockAreCopied) {
  Tensor y = input({2, 4, 64, 16}, 1), w = input({48, 64}, 2);
  Tensor rows = y.permute({0, 2, 1, 3}).reshape({128, 64});
  Tensor out = rows.matmul(w.T());
  EXPECT_TRUE(product_specs({out.uop()}).empty());
  UOpPtr mul = first_mul(out.uop());
  ASSERT_TRUE(mul);
  const UOpPtr& permuted = rows.uop()->src[0];
  EXPECT_EQ(library_copy_point(mul->src[0]), permuted.get());
  EXPECT_EQ(library_copy_point(mul->src[1]), nullptr);  // W^T is a strided view
  UOpPtr rewritten = replaced(out.uop(), permuted.get(), lazy::contiguous(permuted));
  auto specs = product_specs({rewritten});
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(sizes(specs[0]), (std::vector<int64_t>{1, 128, 48, 64}));
  EXPECT_EQ(Tensor(rewritten).to_vector<float>(), out.to_vector<float>());
  // the weight gradient's product copies the same node
  Tensor grad = rows.T().matmul(input({128, 48}, 3));
  EXPECT_EQ(library_copy_point(first_mul(grad.uop())->src[0]), permuted.get());
  // a convolution's sliding windows (its input repeated, then cut) are never copied
  Tensor windows = input({2, 4, 12, 12}, 11).conv2d(input({8, 4, 3, 3}, 12));
  for (auto& side : first_mul(windows.uop())->src) EXPECT_EQ(library_copy_point(side), nullptr);
  // plain, transposed and batched operands are strided views already
  for (const Tensor& t : {input({32, 64}, 4).matmul(w.T()), input({3, 32, 64}, 5).matmul(input({3, 64, 40}, 6))})
    for (auto& side : first_mul(t.uop())->src) EXPECT_EQ(library_copy_point(side), nullptr);
}

// A fused q, k, v gradient: the sum of three parts [3, B, H, T, D] read as [B*T, 3*H*D] is
// computed into the copy in the product's order; small products (each element of the operand
// used fewer than 32 times) keep their reads.
TEST(LibraryOperands, ComputedOperandsAreComputedIntoTheCopy) {
  Tensor parts = input({3, 2, 4, 64, 16}, 7), w = input({192, 64}, 8);
  Tensor rows = (parts + parts.exp()).permute({1, 3, 0, 2, 4}).reshape({128, 192});
  Tensor grad_in = rows.matmul(w);
  const UOpPtr& permuted = rows.uop()->src[0];
  ASSERT_EQ(library_copy_point(first_mul(grad_in.uop())->src[0]), permuted.get());
  EXPECT_EQ(permuted->shape, (Shape{2, 64, 3, 4, 16}));
  UOpPtr rewritten = replaced(grad_in.uop(), permuted.get(), lazy::contiguous(permuted));
  EXPECT_EQ(product_specs({rewritten}).size(), 1u);
  std::vector<float> a = Tensor(rewritten).to_vector<float>(), b = grad_in.to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(b[i]))) << i;
  Tensor small = input({2, 4, 8, 16}, 9).permute({0, 2, 1, 3}).reshape({16, 64}).matmul(input({64, 8}, 10));
  EXPECT_EQ(library_copy_point(first_mul(small.uop())->src[0]), nullptr);
}

// ---- Note [mixed library operands] in schedule/rounded_values.cpp ----------------------------

// How many of the kernels that compute `roots` a library takes.
int library_products(const Tensors& roots) {
  std::vector<UOpPtr> uops;
  for (auto& r : roots) uops.push_back(r.uop());
  return static_cast<int>(product_specs(uops).size());
}

// A cast back to the dtype a value was widened from is the value (Note [round trips through a
// wider float] in lazy.cpp); a rounding and a widening back are not.
TEST(LibraryOperands, WideningRoundTripsAreFolded) {
  Tensor b = input({4, 8}, 1, DType::BFloat16), f = input({4, 8}, 2);
  EXPECT_TRUE(b.float_().cast(DType::BFloat16).uop() == b.uop());
  EXPECT_EQ(input({4, 8}, 3, DType::Float16).float_().cast(DType::Float16).uop()->op, Op::BUFFER);
  EXPECT_EQ(f.cast(DType::BFloat16).float_().uop()->op, Op::CAST);
}

// GPT-2's projection of attention's output under bfloat16 autocast: the heads are rounded to
// bfloat16 inside the copy the library needs of them ([B, H, T, D] read as [B*T, H*D]), the
// float32 weight and the incoming gradient in the product. Without the rule the forward product
// and the weight gradient paired a bfloat16 buffer with a rounded float32 operand, which no
// library takes, and both ran as generated kernels.
TEST(LibraryOperands, MixedPrecisionProductsReadTwoBFloat16Buffers) {
  const std::string& dev = library_device();
  Tensor heads = input({2, 4, 64, 16}, 1).to(dev).realize(), w = input({64, 64}, 2).to(dev).realize();
  w.requires_grad_();
  Tensor rows = heads.cast(DType::BFloat16).permute({0, 2, 1, 3}).reshape({2, 64, 64}).float_();
  Tensor out = rows.cast(DType::BFloat16).matmul(w.cast(DType::BFloat16).T()).float_();
  Tensor loss = (out * input({2, 64, 64}, 3).to(dev)).sum();
  EXPECT_EQ(library_products({loss, loss.gradients({w})[0]}), 2);  // the forward product and dW
}

// Note [rounded products stay with the library] in schedule.cpp: a Linear under a bfloat16
// compute dtype, its float32 bias added after the product's rounding and the sum rounded again
// into a buffer of its own (fused attention reads GPT's q, k and v from one): the product is the
// library's, stored rounded, and the bias a kernel of its own. Joined into that kernel, the
// product was a generated one.
TEST(LibraryOperands, RoundedProductUnderAFloat32BiasStaysTheLibrarys) {
  const std::string& dev = library_device();
  Tensor x = input({64, 80}, 1, DType::BFloat16).to(dev).realize();
  Tensor w = input({48, 80}, 2, DType::BFloat16).to(dev).realize();
  Tensor bias = input({48}, 3).to(dev).realize();
  Tensor out = (x.linear(w).float_() + bias).cast(DType::BFloat16);
  EXPECT_EQ(create_schedule({out.uop()}).size(), 2u);
  EXPECT_EQ(library_products({out}), 1);
}

// A half product with its bias and relu is one kernel that the library runs (the epilogue
// fused), its sum never stored by itself (Note [values stored rounded] leaves it there).
TEST(LibraryOperands, HalfProductWithBiasAndReluStaysOneKernel) {
  const std::string& dev = library_device();
  Tensor a = input({64, 80}, 1, DType::BFloat16).to(dev).realize();
  Tensor b = input({48, 80}, 2, DType::BFloat16).to(dev).realize();
  Tensor bias = input({48}, 3, DType::BFloat16).to(dev).realize();
  Tensor out = (a.matmul(b.T()) + bias).relu();
  EXPECT_EQ(create_schedule({out.uop()}).size(), 1u);
  EXPECT_EQ(library_products({out}), 1);
  Tensor from_f32 = input({96, 160}, 4).to(dev).realize(), w = input({64, 160}, 5).to(dev).realize();
  Tensor b32 = input({64}, 6).to(dev).realize();
  Tensor out32 = from_f32.cast(DType::BFloat16).matmul(w.cast(DType::BFloat16).T()).float_() + b32;
  EXPECT_EQ(create_schedule({out32.uop()}).size(), 1u);
  EXPECT_EQ(library_products({out32}), 1);
}

// ---- CUDA ------------------------------------------------------------------------------------

struct Case {
  int64_t batch, m, n, k;
  bool ta, tb;  // operands stored transposed
  DType dtype;
  bool tf32 = false, bias = false, relu = false;
  bool from_f32 = false;  // float32 buffers cast to dtype in the kernel, the result cast to float32
};

std::string case_name(const Case& c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %lldx%lldx%lldx%lld%s%s%s%s%s%s", dtype_name(c.dtype),
                static_cast<long long>(c.batch), static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), c.ta ? " a^T" : "", c.tb ? " b^T" : "", c.tf32 ? " tf32" : "",
                c.bias ? " bias" : "", c.relu ? " relu" : "", c.from_f32 ? " from float32" : "");
  return buf;
}

class CudaMatmul : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      dev_ = &get_device("CUDA");
    } catch (const Error& e) {
      GTEST_SKIP() << "CUDA is not available here: " << e.what();
    }
    if (dev_->description().find("no cuBLASLt") != std::string::npos)
      GTEST_SKIP() << "cuBLASLt is not available here: " << dev_->description();
  }
  // The tests switch these; each is back to the value it had when the test ends (Note [knobs in tests]).
  testutil::KnobScope<IntKnob> matmul_lib_{knobs::MATMUL_LIB, knobs::MATMUL_LIB.get()};
  testutil::KnobScope<IntKnob> tf32_{knobs::TF32, knobs::TF32.get()};

  // Realizes the case on CUDA with the library (or not), recording the names of the kernels run.
  std::vector<float> run(const Case& c, bool library, std::vector<std::string>& names) {
    matmul_lib_.set(library ? 1 : 0);
    tf32_.set(c.tf32 ? 2 : 0);  // Note [float32 precision policy]: 2 lets library matmuls use tf32
    Tensor r = expr(c);
    ExecRecorder rec = [&](const ExecItem& e) { names.push_back(e.launch.name); };
    ExecRecorder* prev = set_exec_recorder(&rec);
    r.realize();
    set_exec_recorder(prev);
    return r.float_().to_vector<float>();
  }

  Tensor expr(const Case& c) const {
    Shape sa = c.ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k};
    Shape sb = c.tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n};
    DType stored = c.from_f32 ? DType::Float32 : c.dtype;
    Tensor a = rnd(sa, 11, -1, 1, stored).to("CUDA").realize();
    Tensor b = rnd(sb, 12, -1, 1, stored).to("CUDA").realize();
    if (c.from_f32) a = a.cast(c.dtype), b = b.cast(c.dtype);
    if (c.ta) a = a.transpose(-1, -2);
    if (c.tb) b = b.transpose(-1, -2);
    if (c.batch == 1) a = a.reshape({c.m, c.k}), b = b.reshape({c.k, c.n});
    Tensor r = a.matmul(b);
    if (c.from_f32) r = r.float_();
    if (c.bias) r = r + rnd({c.n}, 13, -1, 1, r.dtype()).to("CUDA").realize();
    return c.relu ? r.relu() : r;
  }

  // Bound on |library result - exact| per element: rounding of the output, of tf32 or bfloat16
  // inputs, and float32 accumulation over k terms of sum |a||b|.
  static double out_eps(const Case& c) {
    return c.dtype == DType::BFloat16 ? 1.0 / 128 : c.dtype == DType::Float16 ? 1.0 / 1024 : 1e-6;
  }
  static double tolerance(const Case& c, double exact, double abs_sum) {
    double in_eps = c.from_f32 ? 1.0 / 128 : c.tf32 ? 1.0 / 512 : 0;
    return 2 * out_eps(c) * std::fabs(exact) + (in_eps + 1e-5) * abs_sum + 1e-6;
  }
  // The generated kernel with a half-type result also rounds inside the sum (on an H200 its error
  // reached 0.2 * eps * sum |a||b| where the library's stayed within a fifth of the bound above):
  // it is held to a bound that grows with sqrt(k).
  static double generated_tolerance(const Case& c, double exact, double abs_sum) {
    bool half_out = c.dtype != DType::Float32 && !c.from_f32;
    double rounding_in_sum = half_out ? out_eps(c) * std::sqrt(static_cast<double>(c.k)) * abs_sum : 0;
    return tolerance(c, exact, abs_sum) + rounding_in_sum;
  }

  // Realizes `outs` together, recording the names of the kernels run, and returns their values
  // one after the other.
  static std::vector<float> realize_recorded(const Tensors& outs, std::vector<std::string>& names) {
    ExecRecorder rec = [&](const ExecItem& e) { names.push_back(e.launch.name); };
    ExecRecorder* prev = set_exec_recorder(&rec);
    Tensor::realize_all(outs);
    set_exec_recorder(prev);
    std::vector<float> all;
    for (auto& t : outs)
      for (float v : t.to_vector<float>()) all.push_back(v);
    return all;
  }
  static int named(const std::vector<std::string>& names, const std::string& prefix) {
    int n = 0;
    for (auto& name : names) n += name.rfind(prefix, 0) == 0;
    return n;
  }
  static void expect_same_gradients(const std::vector<float>& lib, const std::vector<float>& gen) {
    ASSERT_EQ(lib.size(), gen.size());
    for (size_t i = 0; i < lib.size(); i++)
      ASSERT_NEAR(lib[i], gen[i], 1e-4 * (1 + std::fabs(gen[i]))) << "gradient element " << i;
  }

  void check(const Case& c) {
    SCOPED_TRACE(case_name(c));
    std::vector<std::string> lib_names, gen_names;
    std::vector<float> lib = run(c, true, lib_names), gen = run(c, false, gen_names);
    ASSERT_EQ(lib_names.size(), 1u);
    EXPECT_EQ(lib_names[0].rfind("matmul_", 0), 0u) << lib_names[0];
    ASSERT_EQ(gen_names.size(), 1u);
    EXPECT_NE(gen_names[0].rfind("matmul_", 0), 0u) << gen_names[0];
    // float64 product of the same (rounded) inputs on the host
    matmul_lib_.set(1);
    Shape sa = c.ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k};
    Shape sb = c.tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n};
    std::vector<float> av = rnd(sa, 11, -1, 1, c.dtype).float_().to_vector<float>();
    std::vector<float> bv = rnd(sb, 12, -1, 1, c.dtype).float_().to_vector<float>();
    std::vector<float> biasv = rnd({c.n}, 13, -1, 1, c.dtype).float_().to_vector<float>();
    ASSERT_EQ(lib.size(), static_cast<size_t>(c.batch * c.m * c.n));
    int bad = 0;
    for (int64_t q = 0; q < c.batch; q++)
      for (int64_t i = 0; i < c.m; i++)
        for (int64_t j = 0; j < c.n; j++) {
          double exact = 0, abs_sum = 0;
          for (int64_t p = 0; p < c.k; p++) {
            double x = av[q * c.m * c.k + (c.ta ? p * c.m + i : i * c.k + p)];
            double y = bv[q * c.k * c.n + (c.tb ? j * c.k + p : p * c.n + j)];
            exact += x * y;
            abs_sum += std::fabs(x * y);
          }
          if (c.bias) exact += biasv[j], abs_sum += std::fabs(biasv[j]);
          if (c.relu) exact = std::max(exact, 0.0);
          size_t at = static_cast<size_t>((q * c.m + i) * c.n + j);
          double tol = tolerance(c, exact, abs_sum), gen_tol = generated_tolerance(c, exact, abs_sum);
          if (bad < 5 && (std::fabs(lib[at] - exact) > tol || std::fabs(gen[at] - exact) > gen_tol)) {
            ADD_FAILURE() << "[" << q << "," << i << "," << j << "]: library " << lib[at] << " (tolerance "
                          << tol << "), generated " << gen[at] << " (tolerance " << gen_tol << "), exact "
                          << exact;
            bad++;
          }
        }
  }

  Device* dev_ = nullptr;
};

TEST_F(CudaMatmul, HalfTypesAcrossShapes) {
  for (DType t : {DType::BFloat16, DType::Float16}) {
    check({1, 128, 128, 128, false, false, t});
    check({1, 67, 45, 131, false, false, t});  // no dim a multiple of 16 (nor of 2, for k)
    check({1, 33, 17, 9, true, false, t});
    check({1, 40, 72, 24, false, true, t});
    check({1, 31, 29, 37, true, true, t});
    check({4, 24, 40, 56, false, false, t});
    check({3, 17, 23, 19, true, true, t});
    check({1, 1, 64, 96, false, false, t});  // a row vector times a matrix
    check({1, 64, 1, 96, false, false, t});  // a matrix times a column vector
  }
}

TEST_F(CudaMatmul, Float32WithAndWithoutTf32) {
  check({1, 96, 80, 200, false, false, DType::Float32});
  check({1, 53, 71, 45, true, true, DType::Float32});
  check({1, 96, 80, 200, false, false, DType::Float32, true});
  check({2, 53, 71, 45, false, true, DType::Float32, true});
}

TEST_F(CudaMatmul, FusedBiasAndRelu) {
  check({1, 64, 48, 80, false, true, DType::BFloat16, false, true, false});
  check({1, 64, 48, 80, false, true, DType::BFloat16, false, true, true});
  check({1, 37, 19, 23, false, true, DType::Float32, false, true, true});
  check({1, 37, 19, 23, false, false, DType::Float16, false, false, true});
}

// Mixed precision: float32 buffers cast to bfloat16 inside the matmul kernel, the result back to
// float32: cuBLASLt rounds the operands itself (CUBLAS_COMPUTE_32F_FAST_16BF).
TEST_F(CudaMatmul, Float32CastToBFloat16InTheKernel) {
  check({1, 96, 64, 160, false, true, DType::BFloat16, false, false, false, true});
  check({1, 96, 64, 160, false, true, DType::BFloat16, false, true, false, true});
  check({2, 33, 45, 27, true, false, DType::BFloat16, false, false, false, true});
}

// A product through the library is captured by the JIT's record like any kernel, and DEBUG=2
// times it with events.
TEST_F(CudaMatmul, Debug2TimesLibraryKernels) {
  testutil::KnobScope debug(knobs::DEBUG, 2);
  testing::internal::CaptureStderr();
  Case c{1, 256, 256, 256, false, false, DType::BFloat16};
  std::vector<std::string> names;
  run(c, true, names);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("matmul_bfloat16_256x256x256"), std::string::npos) << err;
}

// A two-layer perceptron's step (Note [product operands]): relu(h) entering the second
// layer and the masked gradient dz * (h > 0) are written by elementwise kernels, so all five
// products (two forward, three backward) run through the library, with the same gradients as the
// generated kernels.
TEST_F(CudaMatmul, ComputedOperandsOfATrainingStepAreBuffers) {
  auto step = [this](bool library, std::vector<std::string>& names) {
    matmul_lib_.set(library ? 1 : 0);
    Tensor x = rnd({64, 48}, 21, -1, 1).to("CUDA").realize(), t = rnd({64, 24}, 22, -1, 1).to("CUDA").realize();
    Tensor w1 = rnd({40, 48}, 23, -0.3, 0.3).to("CUDA").realize(), b1 = rnd({40}, 24, -0.3, 0.3).to("CUDA").realize();
    Tensor w2 = rnd({24, 40}, 25, -0.3, 0.3).to("CUDA").realize();
    for (Tensor* p : {&w1, &b1, &w2}) p->requires_grad_();
    Tensor loss = (x.linear(w1, b1).relu().linear(w2) * t).sum();
    Tensors grads = loss.gradients({w1, b1, w2});
    grads.push_back(loss);
    return realize_recorded(grads, names);
  };
  std::vector<std::string> lib_names, gen_names;
  std::vector<float> lib = step(true, lib_names), gen = step(false, gen_names);
  EXPECT_EQ(named(lib_names, "matmul_"), 5) << ::testing::PrintToString(lib_names);
  expect_same_gradients(lib, gen);
}

// Note [operands at any alignment] in runtime/cublaslt.cpp: a product stored into a concatenation
// 16 bytes from its start (Note [concatenations stored in place], as a weight gradient is stored
// into its bucket) still runs in the library, through an algorithm that takes that alignment, and
// equals the generated kernels' result. One more kernel writes the 4-element head, which is a
// buffer already; no kernel copies the product.
TEST_F(CudaMatmul, ProductStoredIntoAConcatenationAtA16ByteOffset) {
  tf32_.set(0);
  auto concat = [this](bool library, std::vector<std::string>& names) {
    matmul_lib_.set(library ? 1 : 0);
    Tensor head = rnd({4}, 31, -1, 1).to("CUDA").realize();
    Tensor x = rnd({64, 48}, 32, -1, 1).to("CUDA").realize(), w = rnd({40, 48}, 33, -0.3, 0.3).to("CUDA").realize();
    return realize_recorded({Tensor::cat({head, x.matmul(w.transpose(0, 1)).reshape({-1})}, 0)}, names);
  };
  std::vector<std::string> lib_names, gen_names;
  std::vector<float> lib = concat(true, lib_names), gen = concat(false, gen_names);
  EXPECT_EQ(lib_names.size(), 2u) << ::testing::PrintToString(lib_names);
  EXPECT_EQ(named(lib_names, "matmul_"), 1) << ::testing::PrintToString(lib_names);
  EXPECT_EQ(named(lib_names, "E_4"), 1) << "the head's own kernel, not one over the whole concatenation: "
                                        << ::testing::PrintToString(lib_names);
  expect_same_gradients(lib, gen);
}

// GPT-2's attention around the products (Note [library operands]): the projection reads the
// attention output [B, H, T, D] as [B*T, H*D], and the fused q, k, v projection's gradients read
// the sum of the three heads' gradients the same way. Every product of the step (two forward,
// three backward: x needs no gradient) runs through the library, with the generated kernels'
// gradients, and the q, k, v bias's gradient (a column sum of the same view) reads the copy too.
TEST_F(CudaMatmul, AttentionLayoutOperandsAreCopiedForTheLibrary) {
  auto step = [this](bool library, std::vector<std::string>& names) {
    matmul_lib_.set(library ? 1 : 0);
    Tensor x = rnd({2, 64, 64}, 31, -1, 1).to("CUDA").realize();
    Tensor w_qkv = rnd({192, 64}, 32, -0.3, 0.3).to("CUDA").realize();
    Tensor w_proj = rnd({64, 64}, 33, -0.3, 0.3).to("CUDA").realize();
    Tensor b_qkv = rnd({192}, 34, -0.3, 0.3).to("CUDA").realize();
    for (Tensor* p : {&w_qkv, &w_proj, &b_qkv}) p->requires_grad_();
    Tensors qkv = x.linear(w_qkv, b_qkv).reshape({2, 64, 3, 4, 16}).permute({2, 0, 3, 1, 4}).chunk(3, 0);
    Tensor heads = qkv[0].squeeze(0) * qkv[1].squeeze(0).tanh() + qkv[2].squeeze(0);  // [B, H, T, D]
    Tensor loss = heads.permute({0, 2, 1, 3}).reshape({2, 64, 64}).linear(w_proj).square().sum();
    Tensors grads = loss.gradients({w_qkv, w_proj, b_qkv});
    grads.push_back(loss);
    return realize_recorded(grads, names);
  };
  std::vector<std::string> lib_names, gen_names;
  std::vector<float> lib = step(true, lib_names), gen = step(false, gen_names);
  EXPECT_EQ(named(lib_names, "matmul_"), 5) << ::testing::PrintToString(lib_names);
  // the attention output's copy and the q, k, v gradient's, computed into it, and no more
  EXPECT_LE(named(lib_names, "E_"), 3) << ::testing::PrintToString(lib_names);
  expect_same_gradients(lib, gen);
}

// Note [mixed library operands]: attention's output rounded to bfloat16 (in the copy the library
// needs of its [B, H, T, D] layout), projected by a float32 weight rounded to bfloat16, as GPT-2
// under bfloat16 autocast. The forward product and the weight gradient run through the library
// (each reads two bfloat16 buffers), with the generated kernels' values within bfloat16 rounding of
// the outputs (the products' results are rounded to bfloat16).
TEST_F(CudaMatmul, MixedPrecisionProjectionRunsInTheLibrary) {
  auto step = [this](bool library, std::vector<std::string>& names) {
    matmul_lib_.set(library ? 1 : 0);
    Tensor x = rnd({2, 4, 64, 16}, 41, -1, 1).to("CUDA").realize();
    Tensor w = rnd({64, 64}, 42, -0.3, 0.3).to("CUDA").realize(), t = rnd({2, 64, 64}, 43, -1, 1).to("CUDA").realize();
    w.requires_grad_();
    Tensor rows = x.tanh().cast(DType::BFloat16).permute({0, 2, 1, 3}).reshape({2, 64, 64}).float_();
    Tensor out = rows.cast(DType::BFloat16).matmul(w.cast(DType::BFloat16).T()).float_();
    Tensor loss = (out * t).sum();
    return realize_recorded({loss.gradients({w})[0], out}, names);
  };
  std::vector<std::string> lib_names, gen_names;
  std::vector<float> lib = step(true, lib_names), gen = step(false, gen_names);
  EXPECT_EQ(named(lib_names, "matmul_bfloat16"), 2) << ::testing::PrintToString(lib_names);
  ASSERT_EQ(lib.size(), gen.size());
  for (size_t i = 0; i < lib.size(); i++) ASSERT_NEAR(lib[i], gen[i], 1e-2 * (1 + std::fabs(gen[i]))) << i;
}

}  // namespace
}  // namespace tg
