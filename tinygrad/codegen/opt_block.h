// Cache blocking of CPU kernels: BLOCK runs an output loop in blocks and moves the loop within a
// block innermost; KBLOCK splits a reduce loop into blocks whose partial sums accumulate in the
// output buffer; PADTO pads an output loop so that blocks and register tiles of sizes that do
// not divide it fit; PREFETCH asks for a panel's cache lines ahead of the loads. All are kernel
// optimizer opts (opt.h); the hand-coded choice of them is cache_blocked_opts. See Note [cache
// blocking], Note [padded loops] and Note [prefetched panels] in opt_block.cpp.
#pragma once
#include <optional>
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

// Why PADTO does not apply to loop ax; empty when it does.
std::string why_not_pad(const KernelAxis& ax, const Opt& opt);
// r (size n) -> r' of size n rounded up to a multiple of amount: every index reads r' clamped to
// n-1, and every store is gated by r' < n (Note [padded loops]).
UOpPtr pad_loop(const UOpPtr& ast, const KernelAxis& ax, int64_t amount);

// Every load that streams along reduce loop ax (one to four cache lines a step: a B panel, a
// channel-last image row) is marked to prefetch the element `iterations` steps ahead, in the lane
// that starts a cache line: its LOAD's arg is the distance in elements (Note [prefetched panels]).
UOpPtr prefetch_streams(const UOpPtr& ast, const KernelAxis& ax, int64_t iterations);
// PREFETCH(red, 2 KB ahead) where some load streams along reduce loop red and the loop has 16
// steps or more, so that the prefetched lines are read within it; nullopt otherwise.
std::optional<Opt> stream_prefetch(const UOpPtr& ast, const KernelAxis& red);

// The register tile that hand_coded_opts chose for a matmul-like kernel: `wide` (the
// contiguous output loop) by wide_lanes, `rows` (the other operand's loop) by row_lanes, reducing
// over `red`; `most_row_lanes` is the most rows a tile may have, more than row_lanes where none
// larger divides the loop. Returns the tile with the cache blocks around it (and the rows padded
// for a taller tile, Note [padded loops]) when the kernel is large enough for them to pay, else
// the tile as it is.
// The block sizes come from the CPU's caches (tiles, Note [tiles from the host] in opt.cpp).
std::vector<Opt> cache_blocked_opts(const UOpPtr& ast, const KernelAxis& wide, int64_t wide_lanes,
                                    const KernelAxis& rows, int64_t row_lanes, int64_t most_row_lanes,
                                    const KernelAxis& red, const CpuTiles& tiles);

}  // namespace tg
