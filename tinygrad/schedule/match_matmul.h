// Recognising matrix products among scheduled kernels, so a device library can run them instead
// of a generated kernel (Note [library matmuls] in device.h; Note [matching a matmul kernel] in
// match_matmul.cpp). Device-independent: it reads the kernel graph only.
#pragma once
#include <optional>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/ops.h"

namespace tg {

// The product that kernel graph `ast` (rooted at its STORE, as lowered, before opts) computes,
// or nullopt when it is not one. `param_dtypes` are the kernel's buffer dtypes.
std::optional<MatmulSpec> match_matmul(const UOpPtr& ast, const std::vector<DType>& param_dtypes);

// A cast between float16, bfloat16 and float32, which a library widens or rounds an operand
// through itself (the matcher looks through it; so does the scheduler's Note [product operands]).
bool library_float_cast(const UOp& u);

}  // namespace tg
