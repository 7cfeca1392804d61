// State tensors that a captured step's replays update in place (Note [state updated in place] in
// jit_in_place.cpp): finding the update kernels that may write a state's new value over its old
// one, and rewriting them to read and write that one buffer.
#pragma once
#include <memory>
#include <unordered_set>
#include <vector>

#include "tinygrad/engine/realize.h"

namespace tg {

// The buffers of a captured list that are views of another (Note [concatenations stored in place]
// in schedule/concat_in_place.cpp) and the buffers they view: their bytes have two names, so
// they neither share the arena of intermediates (a view placed apart from its base would no
// longer alias it) nor take part in an update in place.
std::unordered_set<const Buffer*> aliased_buffers(const std::vector<ExecItem>& items);

// A state tensor's buffer before a captured step and the buffer its new value was written to.
struct StateUpdate {
  std::shared_ptr<Buffer> before, after;
};

// For each update whose kernel may run in place, rewrites that kernel in `items` (a captured
// step's list, in order) to read the old value from its output buffer (`after`) instead of
// `before`, recompiles it, and returns those `after` buffers. `returned`: the buffers of the
// step's outputs, which are never updated in place.
std::unordered_set<const Buffer*> merge_in_place_updates(std::vector<ExecItem>& items,
                                                         const std::vector<StateUpdate>& updates,
                                                         const std::unordered_set<const Buffer*>& returned);

}  // namespace tg
