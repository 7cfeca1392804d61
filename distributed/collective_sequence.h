// The collective sequence check: every rank must run the same collectives (op, reduction,
// dtype, element count) in the same order, or the job deadlocks or corrupts memory inside the
// backend. CollectiveEngine compares each new sequence across ranks before its first collective
// runs (Note [collective sequence check]) and reports a difference by rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "tinygrad/schedule/schedule.h"

namespace tg::dist {

// One collective as the ranks must agree on it.
struct CollectiveDesc {
  int64_t op = 0;      // tg::Op
  int64_t reduce = 0;  // tg::Op (ADD or MAX)
  int64_t dtype = 0;   // tg::DType
  int64_t count = 0;   // input elements
};
std::string describe(const CollectiveDesc& d);  // "all_reduce sum of float32[1000]"

CollectiveDesc describe_item(const ScheduleItem& item);
uint64_t sequence_hash(const std::vector<CollectiveDesc>& seq);

// Note [collective sequence check]: a sequence seen for the first time (each step's first run,
// and the capture that TinyJit replays) costs one all-gather of its 8-byte hash; ranks that agree
// remember it, so a replayed step compares nothing but a hash in a set. When the hashes differ,
// a second all-gather of a fixed-size summary (the count and the first descriptors) lets every
// rank name the first collective that differs and what each rank runs there, and every rank
// throws. Both all-gathers have fixed sizes, so they cannot themselves mismatch. The check needs
// every rank to run a schedule with collectives at the same points; a rank that skips one
// altogether shows up as a timeout of the other ranks' check, with the missing rank named.
// Throws a tg::Error on every rank when the ranks' sequences differ.
void agree_on_sequence(ProcessGroup& pg, const std::vector<CollectiveDesc>& seq, uint64_t hash);

}  // namespace tg::dist
