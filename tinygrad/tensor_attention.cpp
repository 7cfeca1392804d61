// Scaled dot-product attention as a composition of primitives, on every device: the reference
// that a fused attention kernel is checked against, and what runs where there is none.
//
// Note [attention as a composition]: softmax(q k^T * scale + mask) v over the last two dims of
// q [..., L, E], k [..., S, E] and v [..., S, Ev], leading dims broadcast, as PyTorch's
// F.scaled_dot_product_attention. The products are matmuls (so their operands, dtypes and
// precision follow Note [half products in float32] in tensor_nn.cpp), the softmax runs in
// float32 for half inputs (a float16 score row overflows long before its exp does) and its
// result goes back to the inputs' dtype before the second product. A causal mask lets query i
// see keys j <= i, aligned at the top left (PyTorch's is_causal); a boolean mask (true: attend)
// broadcasts against [..., L, S]. A masked score is -inf, so a row whose keys are all masked
// comes out NaN, as in PyTorch. Dropout drops attention weights after the softmax and scales the
// kept ones by 1/(1-p). The [..., L, S] scores exist as an intermediate here; only a fused kernel
// avoids them.
#include <cmath>
#include <limits>

#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask) {
  const char* op = "scaled_dot_product_attention";
  TG_CHECK(q.ndim() >= 2 && k.ndim() >= 2 && v.ndim() >= 2, op, ": q, k and v need at least 2 dims [..., seq, dim] (q: ",
           q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(is_float(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
           ": q, k and v need one floating dtype (q: ", q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(q.device() == k.device() && q.device() == v.device(), op, ": q, k and v must be on one device (q: ",
           q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(q.shape().back() == k.shape().back(), op, ": q and k need the same last dim (q: ", q.describe(),
           ", k: ", k.describe(), ")");
  TG_CHECK(k.shape()[k.ndim() - 2] == v.shape()[v.ndim() - 2], op, ": k and v need the same sequence length (k: ",
           k.describe(), ", v: ", v.describe(), ")");
  if (mask) {
    TG_CHECK(mask->dtype() == DType::Bool, op, ": the mask must be bool (true: attend), got ", mask->describe());
    TG_CHECK(mask->device() == q.device(), op, ": the mask must be on q's device (mask: ", mask->describe(),
             ", q: ", q.describe(), ")");
  }
}

// [L, S] bool: key j visible from query i when j <= i.
Tensor causal_mask(int64_t l, int64_t s, const std::string& device) {
  TensorOptions ints{.dtype = DType::Int32, .device = device};
  Tensor rows = Tensor::arange(0, static_cast<double>(l), 1, ints).reshape({l, 1});
  Tensor cols = Tensor::arange(0, static_cast<double>(s), 1, ints).reshape({1, s});
  return cols.le(rows);
}

}  // namespace

// Note [attention as a composition]
Tensor Tensor::scaled_dot_product_attention(const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                            const std::optional<Tensor>& mask, std::optional<double> scale) const {
  check_attention_inputs(*this, k, v, mask);
  TG_CHECK(dropout_p >= 0 && dropout_p < 1, "scaled_dot_product_attention: dropout_p must be in [0, 1), got ",
           dropout_p);
  int64_t l = shape()[ndim() - 2], s = k.shape()[k.ndim() - 2];
  double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(shape().back())));
  DType dt = dtype(), acc = is_half(dt) ? DType::Float32 : dt;
  Tensor scores = matmul(k.transpose(-1, -2)).cast(acc) * sc;
  std::optional<Tensor> visible = mask;
  if (causal) {
    Tensor c = causal_mask(l, s, device());
    visible = visible ? (*visible).logical_and(c) : c;
  }
  if (visible) scores = visible->where(scores, scores.full_like(-std::numeric_limits<double>::infinity()));
  Tensor weights = scores.softmax(-1).cast(dt);
  if (dropout_p > 0) weights = weights.dropout(dropout_p);
  return weights.matmul(v);
}

}  // namespace tg
