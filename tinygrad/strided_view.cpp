// Movement ops as strides (strided_view.h).
//
// Note [strided views]: reshapes, permutes, shrinks and expands only move elements around, so a
// chain of them over a node is that node's buffer read with an offset and a stride per dim: a
// permute reorders the strides, a shrink moves the offset, an expand gives stride 0, and a
// reshape keeps the strides of the dims it leaves alone and splits or merges the others. A merge
// is a stride only where the merged dims are laid out as one (each dim's stride is the next one's
// times its size, as in a row-major block); a reshape that merges dims a permute has separated
// is a copy, and the chain is not a strided view. Pads and flips are not followed: their base
// is the pad or flip itself. Hand-written kernels (fused attention, Note [strided operands] in
// tensor_attention.cpp) read their operands through such views instead of from copies.
#include "tinygrad/strided_view.h"

namespace tg {

namespace {

std::vector<int64_t> row_major(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) strides[i] = s, s *= shape[i];
  return strides;
}

bool is_movement(Op op) {
  return op == Op::RESHAPE || op == Op::PERMUTE || op == Op::SHRINK || op == Op::EXPAND;
}

}  // namespace

// Note [strided views]: runs of dims of equal size on both sides are matched from the outside
// in, and each run of `from` must be laid out as one.
std::optional<std::vector<int64_t>> reshaped_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                     const Shape& to) {
  if (prod(from) == 0) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride) of from's dims, size-1 ones dropped
  for (size_t i = 0; i < from.size(); i++)
    if (from[i] != 1) dims.emplace_back(from[i], strides[i]);
  std::vector<int64_t> out(to.size(), 0);
  size_t d = 0;
  for (size_t n = 0; n < to.size();) {
    if (to[n] == 1) {
      n++;
      continue;
    }
    size_t d_end = d + 1, n_end = n + 1;
    int64_t from_size = dims[d].first, to_size = to[n];
    while (from_size != to_size) {
      if (from_size < to_size)
        from_size *= dims[d_end++].first;
      else
        to_size *= to[n_end++];
    }
    for (size_t i = d; i + 1 < d_end; i++)
      if (dims[i].second != dims[i + 1].second * dims[i + 1].first) return std::nullopt;
    int64_t s = dims[d_end - 1].second;
    for (size_t j = n_end; j-- > n;) out[j] = s, s *= to[j];
    d = d_end, n = n_end;
  }
  return out;
}

std::optional<StridedView> strided_view(const UOpPtr& x) {
  if (x->realized || !is_movement(x->op)) return StridedView{x, 0, row_major(x->shape)};
  std::optional<StridedView> v = strided_view(x->src[0]);
  if (!v) return std::nullopt;
  const Shape& in = x->src[0]->shape;
  switch (x->op) {
    case Op::PERMUTE: {
      std::vector<int64_t> strides;
      for (int64_t axis : x->arg_ints()) strides.push_back(v->strides[static_cast<size_t>(axis)]);
      v->strides = std::move(strides);
      return v;
    }
    case Op::SHRINK:
      for (size_t i = 0; i < in.size(); i++) v->offset += x->arg_ints()[2 * i] * v->strides[i];
      return v;
    case Op::EXPAND:
      for (size_t i = 0; i < in.size(); i++)
        if (in[i] != x->shape[i]) v->strides[i] = 0;
      return v;
    default: {
      auto strides = reshaped_strides(in, v->strides, x->shape);
      if (!strides) return std::nullopt;
      v->strides = std::move(*strides);
      return v;
    }
  }
}

}  // namespace tg
