// Contiguous copies of matrix-product operands that a matmul library could not read otherwise
// (Note [library operands] in library_operands.cpp), part of the scheduler's layout rewrite of
// products (pad_aliasing_rows in padded_rows.cpp).
#pragma once
#include "tinygrad/ops.h"

namespace tg {

// Whether products on `device` run through its matmul library (Feature::MatmulLibrary with the
// MATMUL_LIB knob on), so that their operands must be strided views of buffers.
bool runs_library_products(const std::string& device);

// The node below product operand `side` (a source of a MUL that a sum reduces) that the library
// needs a contiguous copy of, the source of the first reshape whose dims have no strides, or null
// where the views have strides already or the library takes the operand neither way. Replacing
// the node by its copy (lazy::contiguous) serves every reader of it.
const UOp* library_copy_point(const UOpPtr& side);

}  // namespace tg
