// Contiguous copies of the operands a matmul library cannot read (library_operands.h).
//
// Note [library operands]: a library matmul (cuBLASLt) reads each operand as a strided matrix,
// batched at most once (Note [matching a matmul kernel] in match_matmul.cpp). A view that merges
// dims which are not adjacent in memory has no such strides: GPT-2's attention output is
// [B, H, T, D] in memory and its projection reads it as [B*T, H*D] through a permute and a
// reshape; the gradient of its fused q, k, v is a sum over [3, B, H, T, D] read as [B*T, 3*H*D].
// Those products fell back to generated tensor-core kernels at 7 TFLOP/s on an H200, 2.7 ms
// each, against 0.1-0.4 ms in the library. So on a device whose products run through its
// library, each product operand is followed from the product's MUL down through its views and
// casts to the node they view, and its strides are carried back up: the source of the first
// reshape that merges dims the strides cannot merge is replaced by a contiguous copy of it (the
// scheduler's layout rewrite replaces the node itself, so that every reader of it shares the
// copy: a projection and its weight gradient, each through a reshape of its own, and the column
// sum of a bias gradient, which would otherwise recompute a computed operand through the same
// strided view). A computed operand is computed into the copy, in the
// permuted order, so the copy takes the place of its own buffer rather than adding one. One pass
// over the operand against a product of at least MIN_REUSE times as many multiplies. Operands
// below a PAD or a FLIP, or with a gather, are left as they are: the library does not take
// masked or reversed reads either way, and their products stay generated kernels. So are views
// that repeat elements before the reshape (a convolution's sliding windows): their copy would
// write out every window, and the CNN step on an H100 took 1.80 ms instead of 1.12 with it.
#include "tinygrad/schedule/library_operands.h"

#include <optional>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/knobs.h"
#include "tinygrad/strided_view.h"

namespace tg {

namespace {

using Strides = std::vector<int64_t>;

// Note [library operands]: the operand's elements must be reused at least this many times.
constexpr int64_t MIN_REUSE = 32;

Strides contiguous_strides(const Shape& shape) {
  Strides st(shape.size(), 0);
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = shape[i] == 1 ? 0 : s;
    s *= shape[i];
  }
  return st;
}

// The strides of view `v` from those of its source.
std::optional<Strides> strides_above(const UOp& v, const Strides& below) {
  switch (v.op) {
    case Op::CAST:
    case Op::SHRINK:
      return below;
    case Op::PERMUTE: {
      Strides st(below.size());
      for (size_t i = 0; i < st.size(); i++) st[i] = below[static_cast<size_t>(v.arg_ints()[i])];
      return st;
    }
    case Op::EXPAND: {
      Strides st = below;
      for (size_t i = 0; i < st.size(); i++)
        if (v.src[0]->shape[i] != v.shape[i]) st[i] = 0;
      return st;
    }
    case Op::RESHAPE:
      return reshaped_strides(v.src[0]->shape, below, v.shape);  // Note [strided views] in strided_view.cpp
    default:
      return std::nullopt;
  }
}

// Whether a view with strides `st` repeats elements (a stride 0 along a dim longer than 1): a
// convolution's input repeated and then cut into sliding windows, which stays fused (Note
// [product operands] in schedule.cpp); a copy would write every window out.
bool repeated(const Strides& st, const Shape& shape) {
  for (size_t i = 0; i < st.size(); i++)
    if (st[i] == 0 && shape[i] != 1) return true;
  return false;
}

bool is_view(const UOp& u) { return !u.realized && (u.op == Op::CAST || op_group(u.op) == OpGroup::Movement); }

}  // namespace

bool runs_library_products(const std::string& device) {
  return knobs::MATMUL_LIB.get() && get_device(device).supports(Feature::MatmulLibrary);
}

const UOp* library_copy_point(const UOpPtr& side) {
  std::vector<const UOp*> chain;  // from side down to the node above the viewed one
  const UOp* n = side.get();
  for (; is_view(*n); n = n->src[0].get()) {
    if (n->op == Op::PAD || n->op == Op::FLIP) return nullptr;
    chain.push_back(n);
  }
  if (n->op == Op::GATHER || prod(side->shape) < MIN_REUSE * prod(n->shape)) return nullptr;
  Strides st = contiguous_strides(n->shape);
  for (size_t k = chain.size(); k-- > 0;) {
    auto above = strides_above(*chain[k], st);
    if (!above) return repeated(st, chain[k]->src[0]->shape) ? nullptr : chain[k]->src[0].get();
    st = *above;
  }
  return nullptr;
}

}  // namespace tg
