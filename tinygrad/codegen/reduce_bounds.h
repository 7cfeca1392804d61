// Reduce loops that skip the iterations whose terms are zero by a gate on the loop variable (the
// padded rows of a transposed convolution), for CPU-style devices, after the optimizer's opts.
#pragma once
#include "tinygrad/ops.h"

namespace tg {

// Note [reduce loops skip gated zeros] in reduce_bounds.cpp: each sum-reduce loop whose terms
// are zero unless the loop variable lies in a range set by the outer loops runs over that range
// only. Returns ast itself where no loop is bounded.
UOpPtr bound_reduce_loops(const UOpPtr& ast);

// A loop's trip count where it is a constant, else the most its bounds allow.
int64_t max_trip(const UOp& range);

}  // namespace tg
