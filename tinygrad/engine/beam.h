// BEAM search over kernel optimizations: times candidate opt lists on the kernel's own buffers and
// keeps the fastest, then compares it with the tensor-core layout and the device library;
// winners are cached on disk (CACHEDIR/beam), keyed by kernel and device (the compiler's cache key:
// for the CPU, its model and ISA, so a choice timed on one machine never serves another).
#pragma once

#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/schedule/schedule.h"

namespace tg {

// The fastest choice found for item's kernel with a beam of `width` candidates per round.
KernelChoice beam_search(const ScheduleItem& item, int width);

}  // namespace tg
