// Vector loads and stores found in a laid-out kernel (Note [vector accesses] in vector_access.cpp):
// runs of LOADs (or STOREs) of one buffer at neighbouring addresses, which a renderer with vector
// types emits as one wide access each.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

// One wide access: `count` consecutive elements from the address of members.front(), which is
// a multiple of `count`. The members are the LOADs (or STOREs) in address order, in one stretch of
// the kernel's straight-line uops (Note [runs across arithmetic] in vector_access.cpp).
struct VectorAccess {
  std::vector<UOpPtr> members;
  int64_t bytes = 0;  // count * the element size: 4, 8 or 16
};

struct VectorPlan {
  // keyed by the member the renderer emits the access at: a load group's first, a store group's last
  std::unordered_map<const UOp*, VectorAccess> at;
  std::unordered_map<const UOp*, const UOp*> member_of;  // every member -> its access's key
};

// The wide accesses of up to max_bytes in uops (a LinearKernel's), where the element index of
// each run's first member is provably a multiple of the run's length.
VectorPlan plan_vector_accesses(const std::vector<UOpPtr>& uops, int64_t max_bytes);

}  // namespace tg
