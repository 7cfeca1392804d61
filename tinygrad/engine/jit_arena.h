// Memory for a captured step's fixed intermediates (Note [sharing fixed intermediates] and Note
// [one arena for a captured step's intermediates] in jit_arena.cpp): intermediates whose lives do
// not overlap share it, as views into one arena per device where buffers are addresses.
#pragma once
#include <unordered_set>
#include <vector>

#include "tinygrad/engine/realize.h"

namespace tg {

// Replaces the fixed intermediates of `items` (buffers in `written`; slots are null there) by
// shared memory. Returns the bytes of the arenas.
size_t share_intermediates(std::vector<ExecItem>& items, const std::unordered_set<const Buffer*>& written);

}  // namespace tg
