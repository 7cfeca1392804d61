// Reverse-mode differentiation over the lazy graph: the derivative of each primitive op.
#pragma once
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/ops.h"

namespace tg {

// Gradient rules of compositions that carry one (Op::CUSTOM_GRAD, arg {id, parameters...}); each
// returns one gradient per source of the node (nullptr for src[0], the value), given the
// output gradient. Defined next to their composition.
enum class CustomGrad : int64_t { CONV2D = 0, PICK = 1, ATTENTION = 2 };
std::vector<UOpPtr> conv2d_gradient(const UOpPtr& node, const UOpPtr& grad);  // tensor_nn.cpp
// A row's target logit (src[1] the logits, src[2] the one-hot of the targets): Note
// [cross-entropy from the target's logit] in tensor_nn.cpp.
std::vector<UOpPtr> pick_gradient(const UOpPtr& node, const UOpPtr& grad);
// Fused attention's backward kernels (src[0] the forward TEMPLATE_KERNEL node, src[1..3] q, k and
// v): Note [fused attention in the graph] in tensor_attention.cpp.
std::vector<UOpPtr> attention_gradient(const UOpPtr& node, const UOpPtr& grad);

// d(root)/d(t) for every t in `targets`, with d(root)/d(root) = seed. Traversal stops at DETACH.
std::unordered_map<const UOp*, UOpPtr> compute_gradients(const UOpPtr& root, const UOpPtr& seed,
                                                         const std::unordered_set<const UOp*>& targets);

}  // namespace tg
