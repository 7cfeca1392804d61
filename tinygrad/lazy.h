// Builders for lazy-graph UOps with shape inference. Tensor methods check user input and then
// call these; gradient.cpp uses them directly. Preconditions are internal asserts here.
#pragma once
#include <utility>
#include <vector>

#include "tinygrad/ops.h"

namespace tg::lazy {

using Pads = std::vector<std::pair<int64_t, int64_t>>;

UOpPtr buffer(std::shared_ptr<Buffer> buf, Shape shape);
// A constant of `shape`: a scalar CONST reshaped and expanded (no memory).
UOpPtr constant(double value, DType dtype, const std::string& device, const Shape& shape);
UOpPtr const_like(const UOpPtr& x, double value);
UOpPtr alu(Op op, const UOpPtr& a);
UOpPtr alu(Op op, const UOpPtr& a, const UOpPtr& b);
UOpPtr where(const UOpPtr& c, const UOpPtr& a, const UOpPtr& b);
UOpPtr cast(const UOpPtr& x, DType dtype);
UOpPtr bitcast(const UOpPtr& x, DType dtype);
UOpPtr reduce(const UOpPtr& x, Op op, std::vector<int64_t> axes);  // keeps reduced dims as 1
UOpPtr reshape(const UOpPtr& x, const Shape& shape);
UOpPtr permute(const UOpPtr& x, const std::vector<int64_t>& order);
UOpPtr expand(const UOpPtr& x, const Shape& shape);
UOpPtr pad(const UOpPtr& x, const Pads& pads);
UOpPtr shrink(const UOpPtr& x, const Pads& bounds);  // [begin, end) per dim
UOpPtr flip(const UOpPtr& x, const std::vector<int64_t>& axes);
UOpPtr contiguous(const UOpPtr& x);
UOpPtr detach(const UOpPtr& x);
// `value` (computed from `inputs` by ordinary ops) with the gradient rule `rule` ({CustomGrad id,
// parameters...}, gradient.h) in place of differentiating its graph.
UOpPtr custom_grad(const UOpPtr& value, const std::vector<UOpPtr>& inputs, std::vector<int64_t> rule);
UOpPtr copy_to(const UOpPtr& x, const std::string& device);
// Note [gather and scatter-add] in lazy.cpp. gather: out[i] = x[i with i[axis] = index[i]] (0
// where index[i] is outside [0, x's size along axis)); index has out's shape, and x's on every
// other axis. scatter_add: a zero tensor of values' shape with `size` along `axis`, to which
// values[i] is added at i with i[axis] = index[i] (skipped outside [0, size)).
UOpPtr gather(const UOpPtr& x, const UOpPtr& index, int64_t axis);
UOpPtr scatter_add(const UOpPtr& values, const UOpPtr& index, int64_t axis, int64_t size);
// The dtype scatter_add accumulates `dtype` in (float32 for half types, int32 for narrow integers).
DType scatter_accumulator(DType dtype);

// Inverse permutation, and a CONST seen through movement ops (nullptr when x is not constant).
std::vector<int64_t> argsort(const std::vector<int64_t>& order);
const UOp* base_const(const UOpPtr& x);

}  // namespace tg::lazy
