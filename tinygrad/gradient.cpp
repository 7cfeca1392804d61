// The derivative of each primitive. Compositions (tanh, softmax, ...) need no rules of their own:
// they are differentiated through the primitives they are made of. A composition whose
// primitive-level gradient would be slow (conv2d) wraps its value in CUSTOM_GRAD, whose rule,
// defined next to the composition, builds the gradient from forward ops instead.
#include "tinygrad/gradient.h"

#include <cmath>

#include "tinygrad/error.h"
#include "tinygrad/lazy.h"
#include "tinygrad/multi.h"

namespace tg {

namespace {

using namespace lazy;

UOpPtr mul(const UOpPtr& a, const UOpPtr& b) { return alu(Op::MUL, a, b); }
UOpPtr add(const UOpPtr& a, const UOpPtr& b) { return alu(Op::ADD, a, b); }
UOpPtr scale(const UOpPtr& a, double c) { return mul(a, const_like(a, c)); }
UOpPtr zeros(const UOpPtr& a) { return const_like(a, 0); }

// Gradients of node `u` (with output gradient g) for each of its sources; nullptr: none.
std::vector<UOpPtr> backward_rule(const UOpPtr& u, const UOpPtr& g) {
  const auto& s = u->src;
  switch (u->op) {
    case Op::CAST:
      return {is_float(s[0]->dtype) ? cast(g, s[0]->dtype) : nullptr};
    case Op::NEG: return {alu(Op::NEG, g)};
    case Op::EXP2: return {mul(g, scale(u, std::log(2.0)))};
    case Op::LOG2: return {mul(g, scale(alu(Op::RECIP, s[0]), 1.0 / std::log(2.0)))};
    case Op::SIN: return {mul(g, alu(Op::SIN, add(alu(Op::NEG, s[0]), const_like(s[0], M_PI / 2))))};
    case Op::SQRT: return {mul(g, alu(Op::RECIP, scale(u, 2.0)))};
    case Op::RECIP: return {alu(Op::NEG, mul(g, mul(u, u)))};
    case Op::ADD: return {g, g};
    case Op::MUL: return {mul(g, s[1]), mul(g, s[0])};
    case Op::MAX: {
      UOpPtr a_lt_b = alu(Op::CMPLT, s[0], s[1]), b_lt_a = alu(Op::CMPLT, s[1], s[0]);
      UOpPtr half = scale(g, 0.5);
      return {where(b_lt_a, g, where(a_lt_b, zeros(g), half)), where(a_lt_b, g, where(b_lt_a, zeros(g), half))};
    }
    case Op::WHERE: return {nullptr, where(s[0], g, zeros(g)), where(s[0], zeros(g), g)};
    case Op::REDUCE_AXIS: {
      const auto& ra = u->arg_reduce();
      const Shape& in = s[0]->shape;
      if (ra.op == Op::ADD) return {expand(g, in)};
      if (ra.op == Op::MAX) {
        UOpPtr is_max = where(alu(Op::CMPNE, s[0], expand(u, in)), zeros(s[0]), const_like(s[0], 1));
        UOpPtr count = expand(reduce(is_max, Op::ADD, ra.axes), in);
        return {mul(mul(is_max, alu(Op::RECIP, count)), expand(g, in))};
      }
      // MUL: d prod / d x_i = prod / x_i
      return {mul(expand(mul(g, u), in), alu(Op::RECIP, s[0]))};
    }
    case Op::RESHAPE: return {reshape(g, s[0]->shape)};
    case Op::PERMUTE: return {permute(g, argsort(u->arg_ints()))};
    case Op::EXPAND: {
      std::vector<int64_t> axes;
      for (size_t i = 0; i < u->shape.size(); i++)
        if (s[0]->shape[i] == 1 && u->shape[i] != 1) axes.push_back(static_cast<int64_t>(i));
      return {reduce(g, Op::ADD, axes)};
    }
    case Op::PAD: {
      auto& p = u->arg_ints();
      Pads b;
      for (size_t i = 0; i < s[0]->shape.size(); i++) b.push_back({p[2 * i], p[2 * i] + s[0]->shape[i]});
      return {shrink(g, b)};
    }
    case Op::SHRINK: {
      auto& b = u->arg_ints();
      Pads p;
      for (size_t i = 0; i < s[0]->shape.size(); i++) p.push_back({b[2 * i], s[0]->shape[i] - b[2 * i + 1]});
      return {pad(g, p)};
    }
    case Op::FLIP: return {flip(g, u->arg_ints())};
    case Op::CONTIGUOUS: return {g};
    case Op::CUSTOM_GRAD:
      switch (static_cast<CustomGrad>(u->arg_ints().at(0))) {
        case CustomGrad::CONV2D: return conv2d_gradient(u, g);
        case CustomGrad::PICK: return pick_gradient(u, g);
        case CustomGrad::ATTENTION: return attention_gradient(u, g);
      }
      TG_ASSERT(false, "unknown CUSTOM_GRAD rule ", u->arg_ints().at(0));
      return {};
    case Op::COPY: return {copy_to(g, s[0]->device)};
    case Op::MULTI: return multi_gradient(u, g);
    // Note [gather and scatter-add] in lazy.cpp: each is the other's gradient
    case Op::GATHER: {
      int64_t axis = u->arg_ints()[0];
      return {scatter_add(g, s[1], axis, s[0]->shape[static_cast<size_t>(axis)]), nullptr};
    }
    case Op::SCATTER_ADD: return {gather(g, s[1], u->arg_ints()[0]), nullptr};
    default:
      return std::vector<UOpPtr>(s.size(), nullptr);  // not differentiable: comparisons, bit ops, ...
  }
}

}  // namespace

std::unordered_map<const UOp*, UOpPtr> compute_gradients(const UOpPtr& root, const UOpPtr& seed,
                                                         const std::unordered_set<const UOp*>& targets) {
  auto order = toposort({root}, [](const UOp& u) { return u.op != Op::DETACH; });
  std::unordered_set<const UOp*> on_path;  // nodes some target flows into
  for (auto& n : order) {
    bool p = targets.count(n.get()) > 0;
    if (n->op != Op::DETACH)
      for (auto& s : n->src) p |= on_path.count(s.get()) > 0;
    if (p) on_path.insert(n.get());
  }
  std::unordered_map<const UOp*, UOpPtr> grads;
  grads[root.get()] = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const UOpPtr& n = *it;
    auto g = grads.find(n.get());
    if (g == grads.end() || !on_path.count(n.get()) || n->op == Op::DETACH) continue;
    auto src_grads = backward_rule(n, g->second);
    for (size_t i = 0; i < n->src.size(); i++) {
      if (!src_grads[i] || !on_path.count(n->src[i].get())) continue;
      TG_ASSERT(src_grads[i]->shape == n->src[i]->shape, "gradient of ", op_name(n->op), " has shape ",
                shape_str(src_grads[i]->shape), ", source ", shape_str(n->src[i]->shape));
      auto& slot = grads[n->src[i].get()];
      slot = slot ? add(slot, src_grads[i]) : src_grads[i];
    }
  }
  std::unordered_map<const UOp*, UOpPtr> out;
  for (auto* t : targets)
    if (auto it = grads.find(t); it != grads.end()) out[t] = it->second;
  return out;
}

}  // namespace tg
