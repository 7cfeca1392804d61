// Realize points that keep mixed-precision values in half buffers (see rounded_values.h).
#include "tinygrad/schedule/rounded_values.h"

#include <algorithm>

#include "tinygrad/schedule/library_operands.h"

namespace tg {

// Note [values stored rounded]: under mixed precision many float32 values are read only rounded
// to bfloat16 (or float16). A product sums in float32 and its one reader rounds the sum: `x.matmul(w)`
// of half operands is a REDUCE_AXIS in float32 cast to the half type, which a Linear widens back
// to float32 for its caller. An elementwise value realized for a product (Note [product operands]:
// a GELU's output, a masked gradient) is read by the product through a rounding cast. Such a
// realize point with a rounding cast as its one reader (through the reshape that drops a
// reduce's summed dims) is stored rounded: the cast becomes the realize point, the value is
// computed in the cast's kernel (a reduce joins it, as a reduce joins the one reader it has) and
// its buffer is half the size, with the same values. Reduces that joined a reader's kernel
// already (a product with its bias and relu, Note [where kernels end]) have no buffer to shrink
// and are left there. GPT-2's activations, logits and the
// products' computed operands are such values; their readers widen them as they load them, and
// a product then reads two half buffers. Where a reader of the cast is itself a realize point (a
// weight gradient returned in float32) the value stays where it is: moving it would leave a
// kernel that only widens. Outputs and nodes realized for what they are (copies, collectives,
// template kernels and their sources, CONTIGUOUS) keep their buffers.
void store_values_rounded(const ScheduleGraph& g, NodeSet& realize) {
  // the one node reading `n`, or null
  auto only_reader = [&](const UOp* n) -> const UOp* {
    const auto& readers = readers_of(g, n);
    return readers.size() == 1 ? readers[0] : nullptr;
  };
  for (auto& u : g.order) {
    if (!realize.count(u.get()) || g.output_set.count(u.get()) || u->dtype != DType::Float32 ||
        !(u->op == Op::REDUCE_AXIS || (is_alu(u->op) && u->op != Op::CAST)))
      continue;
    const UOp* rounded = only_reader(u.get());  // through the reshape that drops a reduce's summed dims
    while (rounded && rounded->op == Op::RESHAPE && !realize.count(rounded)) rounded = only_reader(rounded);
    if (!rounded || rounded->op != Op::CAST || !is_half(rounded->dtype) || realize.count(rounded)) continue;
    const auto& widened = readers_of(g, rounded);
    if (std::any_of(widened.begin(), widened.end(), [&](const UOp* r) { return realize.count(r) > 0; })) continue;
    realize.erase(u.get());
    realize.insert(rounded);
  }
}

// Note [mixed library operands]: a library product takes two bfloat16 operands, or two float32
// ones that it rounds itself (MatmulSpec::inputs_bf16), never one of each. Mixed precision makes
// such pairs: a bfloat16 buffer (attention's output, rounded inside the copy the library needs of
// it, Note [library operands]; a value stored rounded, Note [values stored rounded]) times a
// float32 weight or gradient rounded to bfloat16 in the product's kernel. Those products ran as
// generated kernels at a tenth of the library's speed (GPT-2's c_proj forward product and weight
// gradient). So on a device whose products run through its library, where one operand of a
// product is a half buffer and the other is rounded in the kernel, the rounding cast is a
// realize point too: one pass rounds it into a half buffer (a weight: a small copy), and the
// product reads two half buffers.
void realize_rounded_partners(const ScheduleGraph& g, NodeSet& realize) {
  auto stored = [&](const UOp* n) { return has_buffer(n) || realize.count(n) > 0; };
  // below a product operand's views and its widening cast, the half node it reads, or null (a
  // CUSTOM_GRAD is its value, src[0]: fused attention's output)
  auto half_source = [](const UOp* side) -> const UOp* {
    bool widened = false;
    for (const UOp* n = side;; n = n->src[0].get()) {
      if (has_buffer(n) || !(op_group(n->op) == OpGroup::Movement || n->op == Op::CUSTOM_GRAD ||
                             (n->op == Op::CAST && !widened)))
        return widened && is_half(n->dtype) ? n : nullptr;
      if (n->op == Op::CAST) {
        if (n->dtype != DType::Float32 || !is_half(n->src[0]->dtype)) return nullptr;
        widened = true;
      }
    }
  };
  for (auto& u : g.order) {
    if (u->op != Op::REDUCE_AXIS || has_buffer(u.get()) || !runs_library_products(u->device)) continue;
    const UOp* product = u->src[0].get();
    while (product->op == Op::CAST) product = product->src[0].get();
    if (product->op != Op::MUL || product->src.size() != 2) continue;
    const UOp* a = half_source(product->src[0].get());
    const UOp* b = half_source(product->src[1].get());
    if (!a || !b || stored(a) == stored(b)) continue;
    const UOp* rounding = stored(a) ? b : a;
    if (rounding->op == Op::CAST && rounding->src[0]->dtype == DType::Float32) realize.insert(rounding);
  }
}

}  // namespace tg
