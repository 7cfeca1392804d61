// The scheduler's layout rewrite for matrix products: B rows that alias in the cache (Note
// [padded B rows] in padded_rows.cpp) on devices whose policy says pad_aliasing_rows, and the
// other per-product operand layouts listed at the top of padded_rows.cpp.
#pragma once
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

struct PaddedRows {
  std::vector<UOpPtr> outputs;                          // the graph's outputs, rewritten
  std::unordered_map<const UOp*, UOpPtr> original_of;  // each rebuilt node -> the node it replaces
};

// `outputs` with every product of `order` (their toposort, sources first; `is_input` names the
// nodes it does not descend into) that reads an aliasing B through padded rows; nullopt when no
// product does.
std::optional<PaddedRows> pad_aliasing_rows(const std::vector<UOpPtr>& outputs, const std::vector<UOpPtr>& order,
                                            const std::function<bool(const UOp*)>& is_input);

}  // namespace tg
