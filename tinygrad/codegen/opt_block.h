// Cache blocking of CPU kernels: BLOCK runs an output loop in blocks and moves the loop within a
// block innermost; KBLOCK splits a reduce loop into blocks whose partial sums accumulate in the
// output buffer. Both are kernel optimizer opts (opt.h); the hand-coded choice of them is
// cache_blocked_opts. See Note [cache blocking] in opt_block.cpp.
#pragma once
#include <string>
#include <vector>

#include "tinygrad/codegen/opt.h"

namespace tg {

// Why a BLOCK or KBLOCK opt does not apply to loop ax of ast; empty when it does.
std::string why_not_block(const UOpPtr& ast, const KernelAxis& ax, const Opt& opt);
// r -> r_outer*amount + r_inner: r_outer keeps r's id (it disappears when amount is r's size),
// r_inner gets a fresh id, the largest, so it is the innermost output loop.
UOpPtr block_loop(const UOpPtr& ast, const KernelAxis& ax, int64_t amount);
// The reduce loop r -> r_outer*amount + r_inner: r_outer (r's id) becomes an output loop that
// the stores' values are carried across (each adds its partial sum to what the output holds),
// r_inner (a fresh id) is the reduce loop.
UOpPtr block_reduce(const UOpPtr& ast, const KernelAxis& ax, int64_t amount);

// The register tile that hand_coded_opts chose for a matmul-like kernel: `wide` (the
// contiguous output loop) by wide_lanes, `rows` (the other operand's loop) by row_lanes, reducing
// over `red`. Returns the tile with the cache blocks around it when the kernel is large enough
// for them to pay, else the tile as it is.
// The block sizes come from the CPU's caches (tiles, Note [tiles from the host] in opt.cpp).
std::vector<Opt> cache_blocked_opts(const UOpPtr& ast, const KernelAxis& wide, int64_t wide_lanes,
                                    const KernelAxis& rows, int64_t row_lanes, const KernelAxis& red,
                                    const CpuTiles& tiles);

}  // namespace tg
