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

// Inverse permutation, and a CONST seen through movement ops (nullptr when x is not constant).
std::vector<int64_t> argsort(const std::vector<int64_t>& order);
const UOp* base_const(const UOpPtr& x);

}  // namespace tg::lazy
