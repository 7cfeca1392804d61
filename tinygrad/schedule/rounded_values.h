// Realize points that keep mixed-precision values in half buffers: a float32 value read only
// rounded is stored rounded (Note [values stored rounded] in rounded_values.cpp), and a library
// product gets two half operands (Note [mixed library operands]). Two passes of realize_points
// (schedule.cpp), run after reduces and rows have been fused.
#pragma once
#include "tinygrad/schedule/graph.h"

namespace tg {

// Moves a float32 realize point whose one reader rounds it to half onto that rounding cast.
void store_values_rounded(const ScheduleGraph& g, NodeSet& realize);

// On devices whose products run through a library, realizes the rounding cast of a product
// operand whose partner is a half buffer.
void realize_rounded_partners(const ScheduleGraph& g, NodeSet& realize);

}  // namespace tg
