// The fused attention kernels' results in double precision, as the reference interpreter
// (runtime/reference.cpp) computes a TEMPLATE_KERNEL node: the definition the rendered templates
// (attention_kernel.cpp) are tested against.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tinygrad/codegen/attention_kernel.h"

namespace tg {

namespace {

// Column c of row r of problem h of operand x (Note [strided operands] in tensor_attention.cpp).
size_t element(const AttentionSpec& s, AttentionOperand x, int64_t h, int64_t r, int64_t c) {
  return static_cast<size_t>(s.row_start(x, h, r) + c);
}

// Row i's scaled scores over the keys of head h; -inf where masked.
std::vector<double> scores(const AttentionSpec& s, const std::vector<double>& q, const std::vector<double>& k, int64_t h,
                           int64_t i) {
  std::vector<double> x(static_cast<size_t>(s.s), -std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < s.s; j++) {
    if (s.causal && j > i) continue;
    double dot = 0;
    for (int64_t d = 0; d < s.e; d++)
      dot += q[element(s, AttentionOperand::Q, h, i, d)] * k[element(s, AttentionOperand::K, h, j, d)];
    x[static_cast<size_t>(j)] = dot * s.scale;
  }
  return x;
}

double logsumexp(const std::vector<double>& x) {
  double mx = *std::max_element(x.begin(), x.end()), sum = 0;
  for (double v : x) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

// v rounded to a half type t (Note [the forward's output] in attention_kernel.cpp).
double rounded(DType t, double v) {
  const auto f = static_cast<float>(v);
  return t == DType::BFloat16 ? bfloat_to_float(float_to_bfloat(f)) : half_to_float(float_to_half(f));
}

// The weights exp(x - lse) of scores x.
std::vector<double> weights(std::vector<double> x, double lse) {
  for (double& v : x) v = std::exp(v - lse);
  return x;
}

}  // namespace

// Note [fused attention]: the three kernels' results, from the same inputs (the backward ones
// read L and D as given, in [batch, L, heads] order: Note [the forward's output]).
std::vector<double> template_kernel_reference(const std::vector<int64_t>& arg,
                                              const std::vector<const std::vector<double>*>& in) {
  AttentionSpec s = AttentionSpec::decode(arg);
  const std::vector<double>&q = *in.at(0), &k = *in.at(1), &v = *in.at(2);
  std::vector<double> out(static_cast<size_t>(prod(s.output_shape())), 0.0);
  auto at = [](int64_t row, int64_t width, int64_t col) { return static_cast<size_t>(row * width + col); };
  for (int64_t h = 0; h < s.bh; h++)
    for (int64_t i = 0; i < s.l; i++) {
      const int64_t row = h * s.l + i;
      if (s.kernel == TemplateKernel::AttentionForward) {
        std::vector<double> x = scores(s, q, k, h, i);
        double lse = logsumexp(x);
        std::vector<double> p = weights(x, lse);
        const auto o = static_cast<size_t>(s.output_row_start(h, i)),
                   l = static_cast<size_t>(s.lse_start(h, i));
        for (int64_t d = 0; d < s.ev; d++)
          for (int64_t j = 0; j < s.s; j++)
            out[o + static_cast<size_t>(d)] +=
                p[static_cast<size_t>(j)] * v[element(s, AttentionOperand::V, h, j, d)];
        out[l] = lse;
        if (s.lse_slots() == 2) out[l + 1] = lse - rounded(s.dtype, lse);
        continue;
      }
      const std::vector<double>&lses = *in.at(3), &dout = *in.at(4), &dsum = *in.at(5);
      const auto stat = static_cast<size_t>(s.stat_index(h, i));
      std::vector<double> p = weights(scores(s, q, k, h, i), lses[stat]);
      for (int64_t j = 0; j < s.s; j++) {
        double dp = 0, pj = p[static_cast<size_t>(j)];
        for (int64_t d = 0; d < s.ev; d++)
          dp += dout[element(s, AttentionOperand::OutputGrad, h, i, d)] *
                v[element(s, AttentionOperand::V, h, j, d)];
        double ds = pj * (dp - dsum[stat]) * s.scale;
        if (s.kernel == TemplateKernel::AttentionBackwardQ) {
          for (int64_t d = 0; d < s.e; d++)
            out[at(row, s.e, d)] += ds * k[element(s, AttentionOperand::K, h, j, d)];
          continue;
        }
        const int64_t key = h * s.s + j;
        for (int64_t d = 0; d < s.e; d++)
          out[at(key, s.e + s.ev, d)] += ds * q[element(s, AttentionOperand::Q, h, i, d)];
        for (int64_t d = 0; d < s.ev; d++)
          out[at(key, s.e + s.ev, s.e + d)] += pj * dout[element(s, AttentionOperand::OutputGrad, h, i, d)];
      }
    }
  return out;
}

}  // namespace tg
