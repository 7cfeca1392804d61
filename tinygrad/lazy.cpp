// Lazy-graph builders: shape inference and the trivial simplifications (identity movement ops,
// merged reshapes, a shrink that undoes a pad) that keep graphs small.
#include "tinygrad/lazy.h"

#include <algorithm>

#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg::lazy {

namespace {
std::vector<int64_t> flatten_pairs(const Pads& p) {
  std::vector<int64_t> out;
  for (auto& [a, b] : p) out.push_back(a), out.push_back(b);
  return out;
}

// Whether every value of `from` is exactly a value of `to` (a float widened to a wider float), so
// that a cast to `to` and back gives the value unchanged.
bool widens_exactly(DType from, DType to) {
  return is_float(from) && is_float(to) && itemsize(to) > itemsize(from);
}
}  // namespace

UOpPtr buffer(std::shared_ptr<Buffer> buf, Shape shape) {
  TG_ASSERT(prod(shape) == buf->numel(), "buffer shape ", shape_str(shape), " for ", buf->numel(), " elements");
  DType dt = buf->dtype();
  std::string dev = buf->device();
  return make_uop(Op::BUFFER, dt, {}, Arg{std::move(buf)}, std::move(shape), std::move(dev));
}

UOpPtr constant(double value, DType dtype, const std::string& device, const Shape& shape) {
  Arg arg = is_float(dtype) ? Arg{value} : Arg{static_cast<int64_t>(dtype == DType::Bool ? value != 0 : value)};
  auto c = make_uop(Op::CONST, dtype, {}, std::move(arg), {}, device);
  if (shape.empty()) return c;
  return expand(reshape(c, Shape(shape.size(), 1)), shape);
}

UOpPtr const_like(const UOpPtr& x, double value) { return constant(value, x->dtype, x->device, x->shape); }

UOpPtr alu(Op op, const UOpPtr& a) {
  TG_ASSERT(op_group(op) == OpGroup::Unary && op != Op::CAST && op != Op::BITCAST, "alu1 ", op_name(op));
  return make_uop(op, a->dtype, {a}, {}, a->shape, a->device);
}

UOpPtr alu(Op op, const UOpPtr& a, const UOpPtr& b) {
  TG_ASSERT(op_group(op) == OpGroup::Binary, "alu2 ", op_name(op));
  TG_ASSERT(a->shape == b->shape && a->dtype == b->dtype && a->device == b->device, op_name(op), " operands differ: ",
            a->str(0), " vs ", b->str(0));
  DType out = is_comparison(op) ? DType::Bool : a->dtype;
  return make_uop(op, out, {a, b}, {}, a->shape, a->device);
}

UOpPtr where(const UOpPtr& c, const UOpPtr& a, const UOpPtr& b) {
  TG_ASSERT(c->dtype == DType::Bool && a->shape == b->shape && c->shape == a->shape && a->dtype == b->dtype,
            "where operands: ", c->str(0), ", ", a->str(0), ", ", b->str(0));
  return make_uop(Op::WHERE, a->dtype, {c, a, b}, {}, a->shape, a->device);
}

// Note [round trips through a wider float]: a cast back to the dtype a value was widened from
// is the value itself (bfloat16 -> float32 -> bfloat16). Mixed precision makes such pairs at
// every boundary between a bfloat16 result and a float32 interface that is cast down again (the
// attention output handed to the next Linear); folded here, the product that reads it sees a
// bfloat16 buffer, which a matmul library takes, instead of a computed cast, which it does not.
UOpPtr cast(const UOpPtr& x, DType dtype) {
  if (x->dtype == dtype) return x;
  if (auto* c = base_const(x)) return constant(c->const_value(), dtype, x->device, x->shape);
  if (x->op == Op::CAST && !x->realized && x->src[0]->dtype == dtype && widens_exactly(dtype, x->dtype))
    return x->src[0];
  return make_uop(Op::CAST, dtype, {x}, {}, x->shape, x->device);
}

UOpPtr bitcast(const UOpPtr& x, DType dtype) {
  TG_ASSERT(itemsize(x->dtype) == itemsize(dtype), "bitcast size");
  return make_uop(Op::BITCAST, dtype, {x}, {}, x->shape, x->device);
}

UOpPtr reduce(const UOpPtr& x, Op op, std::vector<int64_t> axes) {
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  Shape out = x->shape;
  std::vector<int64_t> real;
  for (auto a : axes) {
    TG_ASSERT(a >= 0 && a < static_cast<int64_t>(out.size()), "reduce axis ", a);
    if (out[a] != 1) real.push_back(a);
    out[a] = 1;
  }
  if (real.empty()) return x;
  return make_uop(Op::REDUCE_AXIS, x->dtype, {x}, Arg{ReduceArg{op, real}}, out, x->device);
}

UOpPtr reshape(const UOpPtr& x, const Shape& shape) {
  TG_ASSERT(prod(shape) == prod(x->shape), "reshape ", shape_str(x->shape), " -> ", shape_str(shape));
  if (shape == x->shape) return x;
  if (x->op == Op::RESHAPE) return reshape(x->src[0], shape);
  return make_uop(Op::RESHAPE, x->dtype, {x}, Arg{shape}, shape, x->device);
}

UOpPtr permute(const UOpPtr& x, const std::vector<int64_t>& order) {
  TG_ASSERT(order.size() == x->shape.size(), "permute rank");
  bool identity = true;
  Shape out;
  for (size_t i = 0; i < order.size(); i++) {
    identity &= order[i] == static_cast<int64_t>(i);
    out.push_back(x->shape[order[i]]);
  }
  if (identity) return x;
  return make_uop(Op::PERMUTE, x->dtype, {x}, Arg{order}, out, x->device);
}

UOpPtr expand(const UOpPtr& x, const Shape& shape) {
  TG_ASSERT(shape.size() == x->shape.size(), "expand rank ", shape_str(x->shape), " -> ", shape_str(shape));
  for (size_t i = 0; i < shape.size(); i++)
    TG_ASSERT(x->shape[i] == shape[i] || x->shape[i] == 1, "expand ", shape_str(x->shape), " -> ", shape_str(shape));
  if (shape == x->shape) return x;
  return make_uop(Op::EXPAND, x->dtype, {x}, Arg{shape}, shape, x->device);
}

UOpPtr pad(const UOpPtr& x, const Pads& pads) {
  TG_ASSERT(pads.size() == x->shape.size(), "pad rank");
  bool zero = true;
  Shape out = x->shape;
  for (size_t i = 0; i < pads.size(); i++) {
    TG_ASSERT(pads[i].first >= 0 && pads[i].second >= 0, "negative pad");
    zero &= pads[i].first == 0 && pads[i].second == 0;
    out[i] += pads[i].first + pads[i].second;
  }
  if (zero) return x;
  return make_uop(Op::PAD, x->dtype, {x}, Arg{flatten_pairs(pads)}, out, x->device);
}

UOpPtr shrink(const UOpPtr& x, const Pads& bounds) {
  TG_ASSERT(bounds.size() == x->shape.size(), "shrink rank");
  bool full = true;
  Shape out;
  for (size_t i = 0; i < bounds.size(); i++) {
    TG_ASSERT(0 <= bounds[i].first && bounds[i].first <= bounds[i].second && bounds[i].second <= x->shape[i],
              "shrink bounds");
    full &= bounds[i].first == 0 && bounds[i].second == x->shape[i];
    out.push_back(bounds[i].second - bounds[i].first);
  }
  if (full) return x;
  if (x->op == Op::PAD && !x->realized) {  // the padded node itself (a shrink's gradient, shrunk again)
    const UOpPtr& inner = x->src[0];
    bool undoes = true;
    for (size_t i = 0; i < bounds.size(); i++)
      undoes &=
          bounds[i].first == x->arg_ints()[2 * i] && bounds[i].second == bounds[i].first + inner->shape[i];
    if (undoes) return inner;
  }
  return make_uop(Op::SHRINK, x->dtype, {x}, Arg{flatten_pairs(bounds)}, out, x->device);
}

UOpPtr flip(const UOpPtr& x, const std::vector<int64_t>& axes) {
  std::vector<int64_t> real;
  for (auto a : axes)
    if (x->shape[a] > 1) real.push_back(a);
  if (real.empty()) return x;
  std::sort(real.begin(), real.end());
  return make_uop(Op::FLIP, x->dtype, {x}, Arg{real}, x->shape, x->device);
}

UOpPtr contiguous(const UOpPtr& x) { return make_uop(Op::CONTIGUOUS, x->dtype, {x}, {}, x->shape, x->device); }
UOpPtr custom_grad(const UOpPtr& value, const std::vector<UOpPtr>& inputs, std::vector<int64_t> rule) {
  std::vector<UOpPtr> src{value};
  src.insert(src.end(), inputs.begin(), inputs.end());
  return make_uop(Op::CUSTOM_GRAD, value->dtype, std::move(src), Arg{std::move(rule)}, value->shape, value->device);
}

UOpPtr detach(const UOpPtr& x) { return make_uop(Op::DETACH, x->dtype, {x}, {}, x->shape, x->device); }
UOpPtr copy_to(const UOpPtr& x, const std::string& device) {
  if (x->device == device) return x;
  return make_uop(Op::COPY, x->dtype, {x}, {}, x->shape, device);
}

// Note [gather and scatter-add]: an embedding is a row lookup: compared against every row, as a
// one-hot product, it costs O(N*V*D) for N lookups of a V x D table, and so does its gradient.
// GATHER reads x at positions that another tensor holds: lowering evaluates `index` at the output
// position and uses the loaded value as the index along `axis` (a data-dependent address, gated
// where it falls outside x, like PAD's validity), so it fuses into its readers as a view does and
// costs O(N*D). Its gradient is SCATTER_ADD, which adds each value into its row: a kernel of its
// own that runs over the values, not over the output, and stores with ADD into a buffer that a
// kernel before it has zeroed (Note [accumulating stores] in schedule/lower.cpp). The two are each
// other's gradients. Both index with any integer dtype; out-of-range indices select 0 and add
// nothing (the front end cannot check data on the device without a sync).
UOpPtr gather(const UOpPtr& x, const UOpPtr& index, int64_t axis) {
  TG_ASSERT(!is_float(index->dtype) && x->shape.size() == index->shape.size() && axis >= 0 &&
                axis < static_cast<int64_t>(x->shape.size()) && x->device == index->device,
            "gather of ", x->str(0), " at ", index->str(0), " along ", axis);
  for (size_t d = 0; d < x->shape.size(); d++)
    TG_ASSERT(static_cast<int64_t>(d) == axis || x->shape[d] == index->shape[d], "gather: shapes differ in dim ", d);
  return make_uop(Op::GATHER, x->dtype, {x, index}, Arg{std::vector<int64_t>{axis}}, index->shape, x->device);
}

DType scatter_accumulator(DType dtype) {
  if (is_float(dtype)) return dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  return itemsize(dtype) == 8 ? DType::Int64 : DType::Int32;
}

UOpPtr scatter_add(const UOpPtr& values, const UOpPtr& index, int64_t axis, int64_t size) {
  TG_ASSERT(!is_float(index->dtype) && values->shape == index->shape && axis >= 0 &&
                axis < static_cast<int64_t>(values->shape.size()) && size >= 0 && values->device == index->device,
            "scatter_add of ", values->str(0), " at ", index->str(0), " along ", axis);
  DType acc = scatter_accumulator(values->dtype);
  if (acc != values->dtype) return cast(scatter_add(cast(values, acc), index, axis, size), values->dtype);
  Shape out = values->shape;
  out[static_cast<size_t>(axis)] = size;
  return make_uop(Op::SCATTER_ADD, acc, {values, index}, Arg{std::vector<int64_t>{axis, size}}, out, values->device);
}

std::vector<int64_t> argsort(const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (size_t i = 0; i < order.size(); i++) inv[order[i]] = static_cast<int64_t>(i);
  return inv;
}

const UOp* base_const(const UOpPtr& x) {
  const UOp* u = x.get();
  while (u->op == Op::RESHAPE || u->op == Op::EXPAND || u->op == Op::PERMUTE) u = u->src[0].get();
  return u->op == Op::CONST ? u : nullptr;
}

}  // namespace tg::lazy
