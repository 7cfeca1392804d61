// BEAM search over kernel optimizations: times candidate opt lists on the kernel's own buffers and
// keeps the fastest; winners are cached on disk (CACHEDIR/beam), keyed by kernel and device.
#pragma once
#include <vector>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {

// The fastest opts found for item's kernel with a beam of `width` candidates per round.
std::vector<Opt> beam_search(const ScheduleItem& item, int width);

}  // namespace tg
