// Concatenations whose pieces are computed straight into the concatenation's buffer: a piece
// that is a realize point of the same schedule gets a view of that buffer as its own, so no
// kernel copies it there (Note [concatenations stored in place] in concat_in_place.cpp).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tinygrad/ops.h"
#include "tinygrad/schedule/graph.h"

namespace tg {

struct ConcatPiece {
  int64_t begin = 0, end = 0;   // the elements of the concatenation it fills
  UOpPtr value;                 // its value, [end - begin] (the source under its PAD)
  const UOp* placed = nullptr;  // the realize point computed into [begin, end), or null: a kernel writes it
};

struct ConcatInPlace {
  std::vector<ConcatPiece> pieces;  // by begin, the empty ones left out
  // Nothing but the concatenation reads its placed pieces, so once it is made its buffer may be
  // overwritten (an all-reduce in place) without changing any value a later kernel reads.
  bool sealed = false;
};

struct ConcatsInPlace {
  std::unordered_map<const UOp*, ConcatInPlace> concats;  // by the concatenation's realize point
  struct Place {
    const UOp* concat;
    int64_t begin;
  };
  std::unordered_map<const UOp*, Place> placed;  // a placed piece's realize point -> where it lies
};

// The 1-d concatenations among the realize points of g that store at least one piece in place
// and need at most one kernel for the others.
ConcatsInPlace plan_concats_in_place(const ScheduleGraph& g, const NodeSet& realize);

// The value of pieces [first, last) of a concatenation: their concatenation, [begin of first,
// end of last), which a kernel writes into that stretch of the buffer.
UOpPtr concat_run_value(const std::vector<ConcatPiece>& pieces, size_t first, size_t last);

}  // namespace tg
