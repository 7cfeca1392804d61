// Elementwise chains that several kernels read are computed once, into a buffer of their own,
// when recomputing them in every reader would move more memory than the buffer does (Note
// [shared elementwise chains] in shared_chains.cpp).
#pragma once
#include <functional>
#include <unordered_set>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

// Adds to `realize` the elementwise nodes of `order` (the nodes still to compute, sources first)
// that several kernels would otherwise each recompute from many inputs. `is_resident` names the
// nodes read from memory as they are (buffers, realized nodes and views of them).
void realize_shared_chains(const std::vector<UOpPtr>& order, std::unordered_set<const UOp*>& realize,
                           const std::function<bool(const UOp*)>& is_resident);

}  // namespace tg
