// LLVMRenderer + LLVM ORC JIT end to end: hand-built LinearKernels are rendered to LLVM IR,
// JIT-compiled for the host CPU with make_llvm_compiler(), run on host arrays, and checked.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "tinygrad/codegen/render_llvm.h"
#include "tinygrad/error.h"
#include "tinygrad/runtime/cpu_llvm.h"

namespace tg {
namespace {

UOpPtr global(int i, DType t) { return make_uop(Op::DEFINE_GLOBAL, t, {}, Arg{int64_t{i}}); }
UOpPtr range(int id, int64_t end) { return make_uop(Op::RANGE, dtypes::index, {kint(end)}, Arg{int64_t{id}}); }
UOpPtr endrange(const UOpPtr& r) { return make_uop(Op::ENDRANGE, dtypes::index, {r}); }
UOpPtr load(const UOpPtr& buf, const UOpPtr& idx) { return make_uop(Op::LOAD, buf->dtype, {buf, idx}); }
UOpPtr gated_load(const UOpPtr& buf, const UOpPtr& idx, const UOpPtr& gate) {
  return make_uop(Op::LOAD, buf->dtype, {buf, idx, gate});
}
UOpPtr store(const UOpPtr& buf, const UOpPtr& idx, const UOpPtr& v) { return make_uop(Op::STORE, v->dtype, {buf, idx, v}); }
UOpPtr acc(DType t, double init, int id) { return make_uop(Op::DEFINE_ACC, t, {kconst(t, init)}, Arg{int64_t{id}}); }
UOpPtr assign(const UOpPtr& a, const UOpPtr& v) { return make_uop(Op::ASSIGN, a->dtype, {a, v}); }
UOpPtr bitcast(const UOpPtr& x, DType t) { return make_uop(Op::BITCAST, t, {x}); }

LinearKernel kernel(const std::string& name, std::vector<DType> params, std::vector<UOpPtr> uops) {
  LinearKernel k;
  k.name = name;
  for (auto t : params) k.params.push_back({t, false});
  k.uops = std::move(uops);
  return k;
}

Compiler& compiler() {
  static std::unique_ptr<Compiler> c = make_llvm_compiler();
  return *c;
}

std::unique_ptr<Program> build(const LinearKernel& k, LLVMRendererOptions opt = {}) {
  std::string src = LLVMRenderer(opt).render(k);
  return compiler().compile(k.name, src);
}

void run(Program& p, std::vector<void*> bufs) { p.launch(bufs, {}, {}, true); }

// c[i] = a[i] op b[i] over one RANGE of n
LinearKernel binary_kernel(const std::string& name, Op op, DType t, int64_t n) {
  auto c = global(0, t), a = global(1, t), b = global(2, t);
  auto r = range(0, n);
  auto la = load(a, r), lb = load(b, r);
  auto v = kalu(op, la, lb);
  return kernel(name, {t, t, t}, {c, a, b, r, la, lb, v, store(c, r, v), endrange(r)});
}

TEST(LLVMRender, RendersTheEntryPointAndLiterals) {
  auto k = binary_kernel("add_f32", Op::ADD, dtypes::float32, 16);
  std::string ir = LLVMRenderer().render(k);
  EXPECT_NE(ir.find("define void @\"add_f32\"(ptr %bufs, i64 %lo, i64 %hi)"), std::string::npos) << ir;
  EXPECT_NE(ir.find("fadd nsz contract float"), std::string::npos) << ir;
  EXPECT_NE(ir.find("noalias readonly %b1"), std::string::npos) << ir;
  EXPECT_NE(ir.find("ptr noalias %b0"), std::string::npos) << ir;
  // constants: float literals are exact double-hex, half 0xH
  auto o = global(0, dtypes::float32), h = global(1, dtypes::float16);
  auto k2 = kernel("lits", {dtypes::float32, dtypes::float16},
                   {o, h, store(o, kint(0), kconst(dtypes::float32, 0.1)), store(h, kint(0), kconst(dtypes::float16, 1.0))});
  std::string ir2 = LLVMRenderer().render(k2);
  EXPECT_NE(ir2.find("0x3FB99999A0000000"), std::string::npos) << ir2;  // 0.1f as double
  EXPECT_NE(ir2.find("0xH3C00"), std::string::npos) << ir2;
}

TEST(LLVMRender, ElementwiseAddIsCorrectAndVectorized) {
  const int64_t n = 1003;
  auto k = binary_kernel("add", Op::ADD, dtypes::float32, n);
  std::vector<float> a(n), b(n), c(n, -1);
  for (int64_t i = 0; i < n; i++) a[i] = 0.5f * i, b[i] = 1000.f - i;
  run(*build(k), {c.data(), a.data(), b.data()});
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(c[i], a[i] + b[i]) << i;
  std::string opt = llvm_optimized_ir(LLVMRenderer().render(k));
  EXPECT_NE(opt.find("x float>"), std::string::npos) << "loop was not vectorized:\n" << opt;
}

TEST(LLVMRender, SameKernelNameInTwoModules) {
  const int64_t n = 8;
  auto p_add = build(binary_kernel("same", Op::ADD, dtypes::int32, n));
  auto p_mul = build(binary_kernel("same", Op::MUL, dtypes::int32, n));
  std::vector<int32_t> a(n), b(n), c1(n), c2(n);
  for (int i = 0; i < n; i++) a[i] = i, b[i] = 3;
  run(*p_add, {c1.data(), a.data(), b.data()});
  run(*p_mul, {c2.data(), a.data(), b.data()});
  for (int i = 0; i < n; i++) {
    EXPECT_EQ(c1[i], i + 3);
    EXPECT_EQ(c2[i], i * 3);
  }
}

// out[i] = sum_j a[i*m + j]: the accumulator must be re-initialised for every row
LinearKernel row_sum(const std::string& name, int64_t rows, int64_t m) {
  auto out = global(0, dtypes::float32), a = global(1, dtypes::float32);
  auto i = range(0, rows), j = range(1, m);
  auto s = acc(dtypes::float32, 0.0, 0);
  auto idx = kalu(Op::ADD, kalu(Op::MUL, i, kint(m)), j);
  auto x = load(a, idx);
  auto sum = kalu(Op::ADD, s, x);
  return kernel(name, {dtypes::float32, dtypes::float32},
                {out, a, i, s, j, idx->src[0], idx, x, sum, assign(s, sum), endrange(j), store(out, i, s), endrange(i)});
}

TEST(LLVMRender, SumReduceWithAccumulator) {
  const int64_t rows = 5, m = 37;
  std::vector<float> a(rows * m), out(rows, -1);
  for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(i % 7) - 2.f;
  for (bool fast : {false, true}) {
    LLVMRendererOptions opt;
    opt.fast_math = fast;
    run(*build(row_sum("row_sum", rows, m), opt), {out.data(), a.data()});
    for (int64_t r = 0; r < rows; r++) {
      float ref = 0;
      for (int64_t j = 0; j < m; j++) ref += a[r * m + j];
      EXPECT_FLOAT_EQ(out[r], ref) << "row " << r << " fast_math=" << fast;
    }
  }
  LLVMRendererOptions fast;
  fast.fast_math = true;
  std::string opt = llvm_optimized_ir(LLVMRenderer(fast).render(row_sum("row_sum_big", 4, 4096)));
  EXPECT_NE(opt.find("x float>"), std::string::npos) << "fast-math reduction was not vectorized";
}

TEST(LLVMRender, EmptyReduceGivesTheInitialValue) {
  std::vector<float> a(1, 5.f), out(3, -1);
  run(*build(row_sum("row_sum_empty", 3, 0)), {out.data(), a.data()});
  for (float v : out) EXPECT_EQ(v, 0.f);
}

TEST(LLVMRender, IntMaxReduce) {
  const int64_t n = 100;
  auto out = global(0, dtypes::int32), a = global(1, dtypes::int32);
  auto j = range(0, n);
  auto m = acc(dtypes::int32, dtype_min(dtypes::int32), 0);
  auto x = load(a, j);
  auto mx = kalu(Op::MAX, m, x);
  auto k = kernel("max_i32", {dtypes::int32, dtypes::int32},
                  {out, a, m, j, x, mx, assign(m, mx), endrange(j), store(out, kint(0), m)});
  std::vector<int32_t> av(n), ov(1);
  for (int i = 0; i < n; i++) av[i] = -1000 + (i * 37) % 151;
  run(*build(k), {ov.data(), av.data()});
  EXPECT_EQ(ov[0], *std::max_element(av.begin(), av.end()));
}

TEST(LLVMRender, TransposeWithDivMod) {
  const int64_t rows = 7, cols = 13;
  auto out = global(0, dtypes::float64), a = global(1, dtypes::float64);
  auto k = range(0, rows * cols);
  auto i = kalu(Op::IDIV, k, kint(cols)), j = kalu(Op::MOD, k, kint(cols));
  auto dst = kalu(Op::ADD, kalu(Op::MUL, j, kint(rows)), i);
  auto x = load(a, k);
  auto lk = kernel("transpose", {dtypes::float64, dtypes::float64},
                   {out, a, k, i, j, dst->src[0], dst, x, store(out, dst, x), endrange(k)});
  std::vector<double> av(rows * cols), ov(rows * cols, -1);
  for (size_t t = 0; t < av.size(); t++) av[t] = static_cast<double>(t);
  run(*build(lk), {ov.data(), av.data()});
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) ASSERT_EQ(ov[c * rows + r], av[r * cols + c]);
}

// A float array that ends exactly at an inaccessible page: reading past its end faults.
struct GuardedArray {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = nullptr;
  float* data = nullptr;
  explicit GuardedArray(size_t n) {
    base = static_cast<char*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base, MAP_FAILED);
    mprotect(base + page, page, PROT_NONE);
    data = reinterpret_cast<float*>(base + page) - n;
  }
  ~GuardedArray() { munmap(base, 2 * page); }
};

TEST(LLVMRender, GatedLoadPadsWithZeroAndStaysInBounds) {
  const int64_t n = 64, pad = 2;  // out[i] = a[i-2] + 1 for 2 <= i < n+2, else 0 + 1
  GuardedArray a(n);
  for (int64_t i = 0; i < n; i++) a.data[i] = static_cast<float>(i * i);
  auto out = global(0, dtypes::float32), ag = global(1, dtypes::float32);
  auto r = range(0, n + 2 * pad);
  auto lo = kalu(Op::CMPLT, kint(pad - 1), r), hi = kalu(Op::CMPLT, r, kint(n + pad));
  auto gate = kalu(Op::AND, lo, hi);
  auto idx = kalu(Op::ADD, r, kint(-pad));
  auto x = gated_load(ag, idx, gate);
  auto y = kalu(Op::ADD, x, kconst(dtypes::float32, 1.0));
  auto k = kernel("pad", {dtypes::float32, dtypes::float32},
                  {out, ag, r, lo, hi, gate, idx, x, y, store(out, r, y), endrange(r)});
  std::vector<float> o(n + 2 * pad, -1);
  run(*build(k), {o.data(), a.data});
  for (int64_t i = 0; i < n + 2 * pad; i++) {
    float want = (i >= pad && i < n + pad) ? a.data[i - pad] + 1.f : 1.f;
    ASSERT_EQ(o[i], want) << i;
  }
}

TEST(LLVMRender, GatedStoreWritesOnlyWhereTheGateHolds) {
  const int64_t n = 10;
  auto out = global(0, dtypes::int64);
  auto r = range(0, n);
  auto even = kalu(Op::CMPNE, kalu(Op::MOD, r, kint(2)), kint(1));
  auto st = make_uop(Op::STORE, dtypes::int64, {out, r, r, even});
  auto k = kernel("gated_store", {dtypes::int64}, {out, r, even->src[0], even, st, endrange(r)});
  std::vector<int64_t> o(n, -7);
  run(*build(k), {o.data()});
  for (int64_t i = 0; i < n; i++) EXPECT_EQ(o[i], i % 2 ? -7 : i);
}

TEST(LLVMRender, CastsFromFloat32) {
  auto a = global(0, dtypes::float32);
  std::vector<DType> outs = {dtypes::bfloat16, dtypes::float16, dtypes::int32, dtypes::uint8,
                             dtypes::bool_, dtypes::float64, dtypes::int64};
  std::vector<DType> params = {dtypes::float32};
  params.insert(params.end(), outs.begin(), outs.end());
  std::vector<float> in = {0.f, -0.f, 1.f, 1.00390625f, 1.01171875f, -2.5f, 3.7f, 200.9f, 65504.f, 123456.f,
                           1e-8f, -1.5e-3f, std::numeric_limits<float>::quiet_NaN(), 1e30f};
  const int64_t n = static_cast<int64_t>(in.size());
  auto r = range(0, n);
  std::vector<UOpPtr> uops = {a, r};
  auto x = load(a, r);
  uops.push_back(x);
  for (size_t o = 0; o < outs.size(); o++) {
    auto g = global(static_cast<int>(o + 1), outs[o]);
    auto c = kcast(x, outs[o]);
    uops.insert(uops.end(), {g, c, store(g, r, c)});
  }
  uops.push_back(endrange(r));
  auto k = kernel("casts_f32", params, uops);
  std::vector<uint16_t> bf(n), hf(n);
  std::vector<int32_t> i32(n);
  std::vector<uint8_t> u8(n), b(n);
  std::vector<double> f64(n);
  std::vector<int64_t> i64(n);
  run(*build(k), {in.data(), bf.data(), hf.data(), i32.data(), u8.data(), b.data(), f64.data(), i64.data()});
  for (int64_t i = 0; i < n; i++) {
    float v = in[i];
    EXPECT_EQ(bf[i], float_to_bfloat(v)) << v;
    EXPECT_EQ(hf[i], float_to_half(v)) << v;
    EXPECT_EQ(b[i], v != 0 ? 1 : 0) << v;
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f64[i]));
      continue;
    }
    EXPECT_EQ(f64[i], static_cast<double>(v));
    if (std::fabs(v) < 2e9f) {
      EXPECT_EQ(i32[i], static_cast<int32_t>(v)) << v;
      EXPECT_EQ(u8[i], static_cast<uint8_t>(static_cast<int32_t>(v))) << v;
      EXPECT_EQ(i64[i], static_cast<int64_t>(v)) << v;
    }
  }
  EXPECT_EQ(bf[3], 0x3f80);  // halfway rounds to even (down)
  EXPECT_EQ(bf[4], 0x3f82);  // halfway rounds to even (up)
}

TEST(LLVMRender, CastsToFloat32AndBFloat16Arithmetic) {
  // params: 0 bf16 in, 1 half in, 2 int32 in, 3 uint8 in, 4 bool in, 5 int64 in, 6 double in, out 7.. float32 x6,
  // 13 half out (from double), 14 bf16 out (bf16 + bf16), 15 int32 out (from uint8), 16 uint8 out (from int32)
  const int64_t n = 6;
  std::vector<DType> ins = {dtypes::bfloat16, dtypes::float16, dtypes::int32, dtypes::uint8,
                            dtypes::bool_, dtypes::int64, dtypes::float64};
  std::vector<DType> params = ins;
  for (int i = 0; i < 6; i++) params.push_back(dtypes::float32);
  params.insert(params.end(), {dtypes::float16, dtypes::bfloat16, dtypes::int32, dtypes::uint8});
  auto r = range(0, n);
  std::vector<UOpPtr> uops = {r}, loads;
  for (size_t i = 0; i < ins.size(); i++) {
    loads.push_back(load(global(static_cast<int>(i), ins[i]), r));
    uops.push_back(loads.back());
  }
  auto put = [&](int param, const UOpPtr& v) {
    uops.push_back(v);
    uops.push_back(store(global(param, params[param]), r, v));
  };
  for (int i = 0; i < 6; i++) put(7 + i, kcast(loads[i], dtypes::float32));
  put(13, kcast(loads[6], dtypes::float16));
  auto bsum = kalu(Op::ADD, loads[0], loads[0]);
  put(14, bsum);
  put(15, kcast(loads[3], dtypes::int32));
  put(16, kcast(loads[2], dtypes::uint8));
  uops.push_back(endrange(r));
  auto k = kernel("casts_to_f32", params, uops);

  std::vector<uint16_t> bf = {float_to_bfloat(1.5f), float_to_bfloat(-3.25f), float_to_bfloat(0.f),
                              float_to_bfloat(1e20f), float_to_bfloat(1.0078125f), float_to_bfloat(-0.001f)};
  std::vector<uint16_t> hf = {float_to_half(0.5f), float_to_half(-2.f), float_to_half(65504.f),
                              float_to_half(6e-8f), float_to_half(1.f / 3), 0x7c00};
  std::vector<int32_t> i32 = {0, -1, 300, 2147483647, -2147483647 - 1, 255};
  std::vector<uint8_t> u8 = {0, 1, 127, 128, 200, 255}, bl = {0, 1, 1, 0, 1, 0};
  std::vector<int64_t> i64 = {0, -5, int64_t{1} << 40, 7, -(int64_t{1} << 50), 3};
  std::vector<double> f64 = {0.1, -1e-5, 65519.0, 1e10, 1.0 / 3, 2.0};
  std::vector<std::vector<float>> f(6, std::vector<float>(n));
  std::vector<uint16_t> h_out(n), bf_out(n);
  std::vector<int32_t> i_out(n);
  std::vector<uint8_t> u_out(n);
  std::vector<void*> bufs = {bf.data(), hf.data(), i32.data(), u8.data(), bl.data(), i64.data(), f64.data()};
  for (auto& v : f) bufs.push_back(v.data());
  bufs.insert(bufs.end(), {h_out.data(), bf_out.data(), i_out.data(), u_out.data()});
  run(*build(k), bufs);
  for (int64_t i = 0; i < n; i++) {
    EXPECT_EQ(f[0][i], bfloat_to_float(bf[i]));
    EXPECT_EQ(f[1][i], half_to_float(hf[i]));
    EXPECT_EQ(f[2][i], static_cast<float>(i32[i]));
    EXPECT_EQ(f[3][i], static_cast<float>(u8[i]));
    EXPECT_EQ(f[4][i], bl[i] ? 1.f : 0.f);
    EXPECT_EQ(f[5][i], static_cast<float>(i64[i]));
    EXPECT_EQ(h_out[i], float_to_half(static_cast<float>(f64[i]))) << f64[i];
    EXPECT_EQ(bf_out[i], float_to_bfloat(bfloat_to_float(bf[i]) * 2.f));
    EXPECT_EQ(i_out[i], static_cast<int32_t>(u8[i]));
    EXPECT_EQ(u_out[i], static_cast<uint8_t>(i32[i]));
  }
}

TEST(LLVMRender, ComparisonsAndWhere) {
  const int64_t n = 8;
  auto fa = global(0, dtypes::float32), fb = global(1, dtypes::float32), ia = global(2, dtypes::int32),
       ua = global(3, dtypes::uint8), wout = global(4, dtypes::float32), lt = global(5, dtypes::bool_),
       ne = global(6, dtypes::bool_), ilt = global(7, dtypes::bool_), ult = global(8, dtypes::bool_);
  auto r = range(0, n);
  auto a = load(fa, r), b = load(fb, r), i = load(ia, r), u = load(ua, r);
  auto c = kalu(Op::CMPLT, a, b);
  auto w = kwhere(c, a, kalu(Op::MUL, b, kconst(dtypes::float32, 2)));
  auto cne = kalu(Op::CMPNE, a, b);
  auto ci = kalu(Op::CMPLT, i, kconst(dtypes::int32, -1));
  auto cu = kalu(Op::CMPLT, u, kconst(dtypes::uint8, 100));
  auto k = kernel("cmp", {dtypes::float32, dtypes::float32, dtypes::int32, dtypes::uint8, dtypes::float32,
                          dtypes::bool_, dtypes::bool_, dtypes::bool_, dtypes::bool_},
                  {r, a, b, i, u, c, w->src[2], w, store(wout, r, w), store(lt, r, c), cne, store(ne, r, cne), ci,
                   store(ilt, r, ci), cu, store(ult, r, cu), endrange(r)});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> av = {1, 2, 3, -1, nan, 0, -0.f, 5}, bv = {2, 2, 1, -2, 1, nan, 0.f, 5.5};
  std::vector<int32_t> iv = {-5, -1, 0, 7, -2, 3, -100, 1};
  std::vector<uint8_t> uv = {0, 99, 100, 200, 255, 1, 50, 150};
  std::vector<float> wv(n);
  std::vector<uint8_t> ltv(n), nev(n), iltv(n), ultv(n);
  run(*build(k), {av.data(), bv.data(), iv.data(), uv.data(), wv.data(), ltv.data(), nev.data(), iltv.data(), ultv.data()});
  for (int64_t t = 0; t < n; t++) {
    bool want_lt = av[t] < bv[t];
    EXPECT_EQ(ltv[t], want_lt ? 1 : 0) << t;
    EXPECT_EQ(nev[t], av[t] != bv[t] ? 1 : 0) << t;  // NaN != x is true
    float want_w = want_lt ? av[t] : bv[t] * 2;
    if (std::isnan(want_w)) EXPECT_TRUE(std::isnan(wv[t]));
    else EXPECT_EQ(wv[t], want_w) << t;
    EXPECT_EQ(iltv[t], iv[t] < -1 ? 1 : 0) << t;
    EXPECT_EQ(ultv[t], uv[t] < 100 ? 1 : 0) << t;
  }
}

template <class T>
void check_unary_math(DType t, const std::string& name) {
  std::vector<Op> ops = {Op::EXP2, Op::LOG2, Op::SIN, Op::SQRT, Op::RECIP, Op::TRUNC, Op::NEG};
  std::vector<DType> params(ops.size() + 2, t);
  auto in = global(0, t), other = global(1, t);
  auto r = range(0, 6);
  auto x = load(in, r), y = load(other, r);
  std::vector<UOpPtr> uops = {r, x, y};
  for (size_t o = 0; o < ops.size(); o++) {
    auto v = kalu(ops[o], x);
    uops.insert(uops.end(), {v, store(global(static_cast<int>(o + 2), t), r, v)});
  }
  auto mx = kalu(Op::MAX, x, y);
  params.push_back(t);
  uops.insert(uops.end(), {mx, store(global(static_cast<int>(params.size() - 1), t), r, mx), endrange(r)});
  std::vector<T> xs = {0.5, 2.0, -1.75, 0.0, 10.25, 3.0}, ys = {1, 1, -2, -0.0, 11, 2};
  std::vector<std::vector<T>> outs(ops.size() + 1, std::vector<T>(6));
  std::vector<void*> bufs = {xs.data(), ys.data()};
  for (auto& o : outs) bufs.push_back(o.data());
  run(*build(kernel(name, params, uops)), bufs);
  auto close = [](T got, T want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= 1e-6 * std::max<T>(1, std::fabs(want));
  };
  for (size_t i = 0; i < xs.size(); i++) {
    T v = xs[i];
    T want[] = {std::exp2(v), std::log2(v), std::sin(v), std::sqrt(v), T(1) / v, std::trunc(v), -v,
                std::max(v, ys[i])};
    for (size_t o = 0; o < outs.size(); o++)
      EXPECT_TRUE(close(outs[o][i], want[o])) << name << " op " << o << " x=" << v << " got " << outs[o][i]
                                              << " want " << want[o];
  }
}

TEST(LLVMRender, UnaryMathFloat32) { check_unary_math<float>(dtypes::float32, "math_f32"); }
TEST(LLVMRender, UnaryMathFloat64) { check_unary_math<double>(dtypes::float64, "math_f64"); }

TEST(LLVMRender, IntegerOps) {
  const int64_t n = 6;
  std::vector<Op> ops = {Op::IDIV, Op::MOD, Op::SHL, Op::SHR, Op::AND, Op::OR, Op::XOR, Op::ADD, Op::MUL, Op::MAX};
  auto run_ops = [&](DType t, auto a, auto b) {
    using T = typename decltype(a)::value_type;
    std::vector<DType> params(ops.size() + 2, t);
    auto ga = global(0, t), gb = global(1, t);
    auto r = range(0, n);
    auto x = load(ga, r), y = load(gb, r);
    std::vector<UOpPtr> uops = {r, x, y};
    auto shamt = kalu(Op::AND, y, kconst(t, 7));  // shifts by >= the bit width are poison
    uops.push_back(shamt);
    for (size_t o = 0; o < ops.size(); o++) {
      bool shift = ops[o] == Op::SHL || ops[o] == Op::SHR;
      auto v = kalu(ops[o], x, shift ? shamt : y);
      uops.insert(uops.end(), {v, store(global(static_cast<int>(o + 2), t), r, v)});
    }
    uops.push_back(endrange(r));
    std::vector<std::vector<T>> outs(ops.size(), std::vector<T>(n));
    std::vector<void*> bufs = {a.data(), b.data()};
    for (auto& o : outs) bufs.push_back(o.data());
    run(*build(kernel(std::string("int_ops_") + dtype_name(t), params, uops)), bufs);
    for (int64_t i = 0; i < n; i++) {
      T p = a[i], q = b[i];
      T want[] = {q ? T(p / q) : T(0), q ? T(p % q) : T(0), T(p << (q & 7)), T(p >> (q & 7)), T(p & q), T(p | q), T(p ^ q),
                  T(p + q), T(p * q), std::max(p, q)};
      for (size_t o = 0; o < ops.size(); o++)
        EXPECT_EQ(outs[o][i], want[o]) << dtype_name(t) << " " << op_name(ops[o]) << " " << +p << ", " << +q;
    }
  };
  run_ops(dtypes::int32, std::vector<int32_t>{-7, 7, -8, 100, 5, 1 << 20}, std::vector<int32_t>{2, -2, 1, 0, 3, 4});
  run_ops(dtypes::int64, std::vector<int64_t>{-7, int64_t{1} << 40, -8, 100, 5, -1},
          std::vector<int64_t>{2, 3, 1, 0, 3, 62});
  run_ops(dtypes::uint8, std::vector<uint8_t>{200, 7, 255, 100, 5, 128}, std::vector<uint8_t>{7, 2, 1, 0, 3, 7});
}

TEST(LLVMRender, BoolLogic) {
  const int64_t n = 4;
  std::vector<Op> ops = {Op::AND, Op::OR, Op::XOR, Op::ADD, Op::MUL, Op::CMPNE, Op::CMPLT};
  auto ga = global(0, dtypes::bool_), gb = global(1, dtypes::bool_);
  std::vector<DType> params(ops.size() + 3, dtypes::bool_);
  auto r = range(0, n);
  auto x = load(ga, r), y = load(gb, r);
  std::vector<UOpPtr> uops = {r, x, y};
  for (size_t o = 0; o < ops.size(); o++) {
    auto v = kalu(ops[o], x, y);
    uops.insert(uops.end(), {v, store(global(static_cast<int>(o + 2), dtypes::bool_), r, v)});
  }
  auto notx = kalu(Op::NEG, x);
  uops.insert(uops.end(), {notx, store(global(static_cast<int>(ops.size() + 2), dtypes::bool_), r, notx), endrange(r)});
  std::vector<uint8_t> a = {0, 0, 1, 1}, b = {0, 1, 0, 1};
  std::vector<std::vector<uint8_t>> outs(ops.size() + 1, std::vector<uint8_t>(n, 77));
  std::vector<void*> bufs = {a.data(), b.data()};
  for (auto& o : outs) bufs.push_back(o.data());
  run(*build(kernel("bool_logic", params, uops)), bufs);
  for (int64_t i = 0; i < n; i++) {
    bool p = a[i], q = b[i];
    bool want[] = {p && q, p || q, p != q, p || q, p && q, p != q, !p && q, !p};
    for (size_t o = 0; o < outs.size(); o++) EXPECT_EQ(outs[o][i], want[o] ? 1 : 0) << o << " " << p << q;
  }
}

TEST(LLVMRender, HalfArithmeticAndBitcast) {
  const int64_t n = 5;
  auto ga = global(0, dtypes::float16), gb = global(1, dtypes::float16), go = global(2, dtypes::float16),
       gbits = global(3, dtypes::int32), gf = global(4, dtypes::float32);
  auto r = range(0, n);
  auto a = load(ga, r), b = load(gb, r), f = load(gf, r);
  auto v = kalu(Op::ADD, kalu(Op::MUL, a, b), kconst(dtypes::float16, 0.25));
  auto bits = bitcast(f, dtypes::int32);
  auto k = kernel("half_math", {dtypes::float16, dtypes::float16, dtypes::float16, dtypes::int32, dtypes::float32},
                  {r, a, b, f, v->src[0], v, store(go, r, v), bits, store(gbits, r, bits), endrange(r)});
  std::vector<float> af = {0.5f, 1.5f, -2.f, 100.f, 3.f}, bfv = {2.f, 1.5f, 0.125f, 100.f, 1.f / 3};
  std::vector<uint16_t> ah(n), bh(n), oh(n);
  for (int64_t i = 0; i < n; i++) ah[i] = float_to_half(af[i]), bh[i] = float_to_half(bfv[i]);
  std::vector<int32_t> ob(n);
  run(*build(k), {ah.data(), bh.data(), oh.data(), ob.data(), af.data()});
  for (int64_t i = 0; i < n; i++) {
    float prod = half_to_float(float_to_half(half_to_float(ah[i]) * half_to_float(bh[i])));
    float want_fused = half_to_float(float_to_half(half_to_float(ah[i]) * half_to_float(bh[i]) + 0.25f));
    float want = half_to_float(float_to_half(prod + 0.25f));
    float got = half_to_float(oh[i]);
    EXPECT_TRUE(got == want || got == want_fused) << i << ": " << got << " vs " << want;  // contract may fuse
    int32_t want_bits;
    std::memcpy(&want_bits, &af[i], 4);
    EXPECT_EQ(ob[i], want_bits);
  }
}

TEST(LLVMRender, ErrorsNameTheProblem) {
  try {
    compiler().compile("broken", "define void @broken(ptr %bufs) {\n  ret i32 0\n}\n");
    FAIL() << "expected tg::CompileError";
  } catch (const CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("internal error, please report: generated kernel 'broken'"), std::string::npos) << m;
    EXPECT_NE(m.find("LLVM: cannot parse kernel broken"), std::string::npos) << m;
    EXPECT_NE(m.find("source of kernel 'broken':\n   1| define void @broken"), std::string::npos) << m;
  }
  std::string src = LLVMRenderer().render(binary_kernel("named_k", Op::ADD, dtypes::float32, 4));
  EXPECT_THROW(compiler().compile("not_there", src), CompileError);
  // unclosed RANGE and an op the CPU cannot render
  auto out = global(0, dtypes::float32);
  auto r = range(0, 4);
  EXPECT_THROW(LLVMRenderer().render(kernel("open", {dtypes::float32}, {out, r})), Error);
  auto sp = make_uop(Op::SPECIAL, dtypes::index, {kint(4)}, Arg{int64_t{0}});
  auto k2 = kernel("special", {dtypes::float32}, {out, sp, store(out, sp, kconst(dtypes::float32, 1))});
  EXPECT_THROW(LLVMRenderer().render(k2), Error);
  EXPECT_THROW(LLVMRenderer().render(kernel("bad name", {}, {})), Error);
}

TEST(LLVMRender, ConcurrentCompiles) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; t++)
    threads.emplace_back([t, &ok] {
      const int64_t n = 100 + t;
      auto p = build(binary_kernel("threaded", Op::ADD, dtypes::int64, n));
      std::vector<int64_t> a(n, t), b(n, 10), c(n);
      run(*p, {c.data(), a.data(), b.data()});
      ok[t] = std::all_of(c.begin(), c.end(), [t](int64_t v) { return v == t + 10; });
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; t++) EXPECT_TRUE(ok[t]) << t;
}

TEST(LLVMRender, TimingAndCacheKey) {
  auto p = build(binary_kernel("timed", Op::ADD, dtypes::float32, 4));
  std::vector<float> a(4, 1), b(4, 2), c(4);
  auto t = p->launch({c.data(), a.data(), b.data()}, {}, {}, true);
  ASSERT_TRUE(t.has_value());
  EXPECT_GE(*t, 0.0);
  EXPECT_FALSE(p->launch({c.data(), a.data(), b.data()}, {}, {}, false).has_value());
  std::string key = compiler().cache_key();
  EXPECT_EQ(key.rfind("llvm-" + llvm_version() + "-", 0), 0u) << key;
  // a program outlives its compiler
  auto own = make_llvm_compiler();
  auto survivor = own->compile("timed", LLVMRenderer().render(binary_kernel("timed", Op::MUL, dtypes::float32, 4)));
  own.reset();
  survivor->launch({c.data(), a.data(), b.data()}, {}, {}, true);
  EXPECT_EQ(c[3], 2.f);
}

}  // namespace
}  // namespace tg
