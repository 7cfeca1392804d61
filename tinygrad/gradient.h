// Reverse-mode differentiation over the lazy graph: the derivative of each primitive op.
#pragma once
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/ops.h"

namespace tg {

// d(root)/d(t) for every t in `targets`, with d(root)/d(root) = seed. Traversal stops at DETACH.
std::unordered_map<const UOp*, UOpPtr> compute_gradients(const UOpPtr& root, const UOpPtr& seed,
                                                         const std::unordered_set<const UOp*>& targets);

}  // namespace tg
