// The order of a schedule's items, changed to free memory sooner: kernels that reduce what they
// read (a weight gradient, a column sum) run as soon as their operands are ready instead of where
// the graph's walk from the outputs put them (Note [reducing kernels run early] in
// memory_order.cpp). The last step of create_schedule (schedule.cpp).
#pragma once
#include <vector>

#include "tinygrad/schedule/schedule.h"

namespace tg {

// The same items in an order that keeps every dependency between them (a buffer written before
// it is read, read before it is written over, written in order), with reducing kernels moved
// forward; copies and collectives stay where they are relative to every other item.
std::vector<ScheduleItem> reducing_kernels_early(std::vector<ScheduleItem> items);

}  // namespace tg
