// Helpers shared by the backend op tests (test_ops*.cpp) and the gradient checks: deterministic
// inputs, per-dtype tolerances, and the comparison of a tensor realized on its device against
// the float64 reference interpreter evaluating the same lazy graph.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "device_env.h"
#include "tinygrad/runtime/reference.h"
#include "tinygrad/tensor.h"

namespace tg {
// gtest prints dtypes by name.
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace tg

namespace tg::testutil {

// Deterministic uniform values in [lo, hi) from std::mt19937 (not the engine's generator).
inline std::vector<float> rnd_values(int64_t n, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(d(gen));
  return v;
}
inline Tensor rnd(const Shape& s, uint32_t seed, double lo = -2, double hi = 2, DType dt = DType::Float32) {
  return Tensor::from_vector(rnd_values(prod(s), seed, lo, hi), s, {.dtype = dt});
}
inline Tensor rnd_int(const Shape& s, uint32_t seed, int lo, int hi, DType dt = DType::Int32) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(prod(s)));
  for (auto& x : v) x = d(gen);
  return Tensor::from_vector(v, s, {.dtype = dt});
}
// Values whose pairwise differences exceed 1e-3: no near-ties for max/min/argmax/sort-like ops.
inline Tensor distinct(const Shape& s, uint32_t seed, DType dt = DType::Float32) {
  int64_t n = prod(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[i] = static_cast<float>(i - n / 2) * 0.25f;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return Tensor::from_vector(v, s, {.dtype = dt});
}

struct Tol {
  double rtol, atol;
};
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::Float16: return {5e-3, 5e-3};
    case DType::BFloat16: return {3e-2, 3e-2};
    case DType::Float32: return {2e-5, 2e-5};
    case DType::Float64: return {1e-12, 1e-12};
    default: return {0, 0};  // integers and bool: exact
  }
}

inline bool close(double dev, double ref, Tol tol) {
  if (std::isnan(ref)) return std::isnan(dev);
  if (std::isinf(ref)) return dev == ref;
  return std::fabs(dev - ref) <= tol.atol + tol.rtol * std::fabs(ref);
}

// True when the graph of t casts a float64 value down to a narrower float (compositions must
// keep float64 inputs in float64; see test_ops.cpp FloatDtypeIsKept).
inline bool narrows_float64(const Tensor& t) {
  for (auto& u : toposort({t.uop()}))
    if (u->op == Op::CAST && u->src[0]->dtype == DType::Float64 && is_float(u->dtype) && u->dtype != DType::Float64)
      return true;
  return false;
}

// Compares each tensor, realized on its device, with reference_eval of its graph. The
// references are taken before realizing and recompute realized nodes, so they never read the
// device's own results back.
inline ::testing::AssertionResult match_all(const Tensors& ts, std::optional<Tol> tol = std::nullopt) {
  std::vector<RefArray> refs;
  for (auto& t : ts) refs.push_back(reference_eval(t.uop(), {.use_realized = false}));
  Tensor::realize_all(ts);
  std::ostringstream err;
  bool ok = true;
  for (size_t k = 0; k < ts.size(); k++) {
    const Tensor& t = ts[k];
    const RefArray& r = refs[k];
    if (r.shape != t.shape() || r.dtype != t.dtype()) {
      err << "[" << k << "] " << t.describe() << ": reference is " << dtype_name(r.dtype) << shape_str(r.shape) << "\n";
      ok = false;
      continue;
    }
    auto dev = t.to_vector<double>();
    Tol tl = tol.value_or(tol_for(t.dtype()));
    int shown = 0;
    for (size_t i = 0; i < dev.size(); i++) {
      // the device stores its result in the output dtype (float32 overflows to inf at 3.4e38)
      uint8_t slot[8];
      store_as(t.dtype(), slot, r.data[i]);
      if (close(dev[i], load_as(t.dtype(), slot), tl)) continue;
      if (ok || shown < 5) {
        err << "[" << k << "] " << t.describe() << " at flat " << i << ": device " << dev[i] << ", reference "
            << r.data[i] << "\n";
        shown++;
      }
      ok = false;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << err.str();
}
inline ::testing::AssertionResult match(const Tensor& t, std::optional<Tol> tol = std::nullopt) {
  return match_all({t}, tol);
}

// Forward and backward of f on the inputs: the output and d(sum(out * w))/d(input) for every
// float input, each against the reference of its own graph (w: fixed weights, so the seed is
// not all ones). Integer inputs are passed through without gradients.
inline ::testing::AssertionResult check_fwd_bwd(const std::function<Tensor(const Tensors&)>& f, Tensors inputs,
                                                std::optional<Tol> tol = std::nullopt, bool backward = true) {
  for (auto& x : inputs)
    if (is_float(x.dtype())) x.requires_grad_(true);
  Tensor out = f(inputs);
  Tensors checks{out};
  if (backward && is_float(out.dtype())) {
    Tensors wrt;
    for (auto& x : inputs)
      if (is_float(x.dtype())) wrt.push_back(x);
    Tensor w = rnd(out.shape(), 1234, 0.5, 1.5).cast(out.dtype());
    Tensor loss = (out * w).sum();
    for (auto& g : loss.gradients(wrt)) checks.push_back(g);
  }
  return match_all(checks, tol);
}

}  // namespace tg::testutil
