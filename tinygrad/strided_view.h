// A chain of movement ops read as strides over the node below it (Note [strided views] in
// strided_view.cpp): what a hand-written kernel needs to read a view in place instead of from a
// copy.
#pragma once
#include <optional>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

// Element (i_0, ..., i_n) of a view is element offset + sum_k i_k * strides[k] of `base`, in
// base's row-major order.
struct StridedView {
  UOpPtr base;
  int64_t offset = 0;
  std::vector<int64_t> strides;
};

// The strides of a reshape to `to` of elements laid out as `from` with `strides`, or nullopt where
// it merges dims that are not laid out as one block (Note [strided views]).
std::optional<std::vector<int64_t>> reshaped_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                     const Shape& to);

// x as strides over the first node below its reshapes, permutes, shrinks and expands (a node
// that is not one of those, or one already realized, is its own base with row-major strides);
// nullopt where a reshape in the chain merges dims that are not laid out as one.
std::optional<StridedView> strided_view(const UOpPtr& x);

}  // namespace tg
