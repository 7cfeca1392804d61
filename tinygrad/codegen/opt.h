// The kernel optimizer: transformations of a kernel graph (rooted at STORE or SINK) that keep its
// result and change its loops, the hand-coded heuristics that pick them, and the search space
// BEAM explores (engine/beam.cpp).
//
// Note [upcast and unroll]: both split a loop of size n by an amount a that divides n into an
// outer loop of n/a iterations and a lanes that are written out as straight-line code: the loop
// variable r becomes r'*a + c for the constants c = 0..a-1, and hash-consing shares every node
// that does not depend on r between the lanes. UPCAST splits an output loop, so each lane is its
// own STORE (and its own accumulator, if the kernel reduces). UNROLL splits a reduce loop into a
// partial accumulators that are combined after the loop. The lanes of an axis that is contiguous
// in memory become vector loads, FMAs and stores when the backend compiles them (LLVM's SLP
// vectorizer on the CPU); lanes of an axis that some input does not depend on reuse that input's
// loads from registers (a matmul's register tile).
//
// BLOCK and KBLOCK (codegen/opt_block.h) split a loop into two loops instead, for cache reuse;
// PADTO (also there) pads an output loop to a multiple of an amount that does not divide it;
// PREFETCH (also there) asks for the cache lines that loads stream along a reduce loop some
// iterations ahead.
#pragma once
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tinygrad/device_policy.h"
#include "tinygrad/ops.h"
#include "tinygrad/rewrite.h"

namespace tg {

enum class OptOp { UPCAST, UNROLL, BLOCK, KBLOCK, PADTO, PREFETCH };

struct Opt {
  OptOp op;
  int64_t axis;    // the RANGE's id (its arg)
  // divides the loop's size (PADTO: the multiple the loop is padded to; PREFETCH: how many
  // iterations of the reduce loop ahead its streams are prefetched)
  int64_t amount;
  bool operator==(const Opt& o) const { return op == o.op && axis == o.axis && amount == o.amount; }
};
std::string opt_str(const Opt& o);           // "UPCAST(1,8)"
std::string opts_str(const std::vector<Opt>& opts);
std::vector<Opt> parse_opts(const std::string& s);  // inverse of opts_str; throws on bad text

// One loop of a kernel graph.
struct KernelAxis {
  UOpPtr range;
  int64_t id = 0, size = 0;
  bool reduce = false;
  // an output loop that no store index depends on: the outer loop of a KBLOCK, whose iterations
  // add to what the previous ones stored (so it must not be upcast)
  bool carried = false;
};
std::vector<KernelAxis> kernel_axes(const UOpPtr& ast);

// Applies opts in order. Throws tg::Error naming the opt when one does not apply (no such loop,
// or an amount that does not divide its size). The result is rooted at SINK.
UOpPtr apply_opts(const UOpPtr& ast, const std::vector<Opt>& opts);
// Whether opt applies to ast (the check apply_opts makes).
bool opt_applies(const UOpPtr& ast, const Opt& opt);

// The default choice: a register tile over the output loops that inputs are reused along (with
// cache blocks around it for large matmuls), and partial accumulators for reductions over
// contiguous memory, sized for the CPU's vectors, registers and caches (Note [tiles from the
// host]; the default CpuLimits are an AVX2 core's).
std::vector<Opt> hand_coded_opts(const UOpPtr& ast, const CpuLimits& cpu = {});

// The sizes hand_coded_opts derives from a CPU's limits (Note [tiles from the host]).
struct CpuTiles {
  int64_t vector_lanes;      // float32 lanes of one vector register
  int64_t wide_lanes;        // lanes of the contiguous loop in a register tile: two vectors
  int64_t max_accumulators;  // lanes of a register tile's accumulators in all
  int64_t max_tile_rows;     // most lanes of the tile's other loop
  int64_t k_block;           // most reduce iterations of a cache block: a B panel in half the L1
  int64_t row_block;         // most rows of a cache block: an A block in 1/16 of the L2
  int64_t min_panel_bytes;   // a B at least this large (half the L2) gets cache blocks
  // B read from contiguous panels (Note [blocks of B panels] in opt_block.cpp): most reduce
  // iterations of a block (a panel in 1/16 of the L2), the longest reduce kept whole (a panel in
  // 1/8 of the L2) and the bytes of an A block (half the L2)
  int64_t panel_k_block;
  int64_t panel_whole_k;
  int64_t a_block_bytes;
};
CpuTiles cpu_tiles(const CpuLimits& cpu);
std::string cpu_tiles_str(const CpuLimits& cpu);  // one line, for DEBUG=3

// How far an index expression moves when `range` goes from 0 to 1 (every other loop at 0).
int64_t index_stride(const UOpPtr& index, const UOpPtr& range);
// An index expression's value with every loop at 0.
int64_t index_at_zero(const UOpPtr& index);

// The loops (RANGEs) an expression depends on.
std::unordered_set<const UOp*> ranges_in(const UOpPtr& u);

// The kernel's STOREs (ast rooted at STORE or SINK).
std::vector<UOpPtr> stores_of(const UOpPtr& ast);

// Lanes a kernel would have after opts (the product of all amounts), to bound register use.
int64_t lane_count(const std::vector<Opt>& opts);

}  // namespace tg
