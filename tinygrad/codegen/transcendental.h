// Transcendental functions written with plain arithmetic, for devices whose exp2 is a slow
// library call per element (the CPU): the rewritten kernels vectorize.
#pragma once
#include "tinygrad/ops.h"

namespace tg {

// Replaces every float32 EXP2 in a kernel graph by Note [exp2 by arithmetic].
UOpPtr decompose_transcendentals(const UOpPtr& ast);

}  // namespace tg
