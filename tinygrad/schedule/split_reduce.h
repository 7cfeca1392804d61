// Long reductions with few outputs in two stages (Note [split reductions] in split_reduce.cpp).
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
// few outputs; nothing otherwise.
std::optional<SplitReduce> split_reduce(const UOpPtr& root, const std::function<bool(const UOp*)>& is_input);

}  // namespace tg
