// Long reductions in two stages (Note [split reductions], Note [split long reductions] in split_reduce.cpp).
#pragma once
#include <functional>
#include <optional>

#include "tinygrad/ops.h"

namespace tg {

struct SplitReduce {
  UOpPtr partial;  // the first stage: partial results of blocks of the reduction, its own kernel
  UOpPtr root;     // the kernel's root with the reduce replaced by a reduce over `partial`
};

// The two-stage version of the kernel rooted at `root`, whose inputs (realized nodes, buffers)
// `is_input` names, when that kernel holds exactly one REDUCE_AXIS and the reduction is long with
// few outputs or long enough to split with many; nothing otherwise.
std::optional<SplitReduce> split_reduce(const UOpPtr& root, const std::function<bool(const UOp*)>& is_input);

}  // namespace tg
