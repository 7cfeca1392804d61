// Kernels of a captured step that write over what they read: state tensors that replays update in
// place (Note [state updated in place] in jit_in_place.cpp) and intermediates written over an
// input whose last reader made them (Note [intermediates written over a dying input]); finding
// such kernels and rewriting them to read and write one buffer.
#pragma once
#include <functional>
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

// Whether a buffer of a captured list is one of its intermediates (written by the list, not an
// input, state or output of the step).
using IsIntermediate = std::function<bool(const Buffer*)>;

// Note [intermediates written over a dying input] (jit_in_place.cpp): rewrites each kernel that may
// write an output over an input it is the last reader of, and recompiles it. Returns how many
// kernels it rewrote.
size_t write_intermediates_over_dying_inputs(std::vector<ExecItem>& items, const IsIntermediate& is_intermediate);

// The same before a normal run of `schedule` (Note [dying inputs in a normal run]): its
// intermediates are the buffers that do not exist yet and are not in `outlive` (its outputs and the
// buffers kept with their nodes). Kernels compile as they run.
void write_schedule_over_dying_inputs(std::vector<ScheduleItem>& schedule,
                                      const std::unordered_set<const Buffer*>& outlive);

}  // namespace tg
