// Cache blocking of CPU kernels: the BLOCK and KBLOCK opts and their hand-coded choice for
// matmul-like kernels. See Note [cache blocking].
#include "tinygrad/codegen/opt_block.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "tinygrad/error.h"
#include "tinygrad/rewrite.h"

namespace tg {

// Note [cache blocking]: a register tile (Note [register tile size] in opt.cpp) of R rows by 16
// columns (on AVX2; the sizes here are an AVX2 core's with a 32 KB L1 and a 1 MB L2, Note
// [tiles from the host] derives them for others) of a matmul streams a K x 16 panel of B, one cache line per
// k, and the output loops run rows outside columns, so every R rows read all of B again: B (4 MB at 1024^2,
// 16 MB at 2048^2) never stays in the L2 cache and the kernel waits on memory. Two opts reorder the loops
// instead of writing lanes out:
//
// - BLOCK(r, b) runs output loop r in blocks of b: r = r_outer*b + r_inner, where r_outer keeps
//   r's place and r_inner gets a fresh RANGE id, the largest, so it becomes the innermost output
//   loop (linearize orders output loops by id). BLOCK(r, size of r) moves r innermost.
// - KBLOCK(k, b) splits reduce loop k the same way, but k_outer becomes an output loop placed by
//   its id (after the loops with smaller ids) and the stores are carried across it: each store
//   writes prev + (its reduce over the block), prev being what the output holds (0 where
//   k_outer = 0: a select, not a gated load, so the lanes' loads stay one vector load; the
//   first block reads memory nothing wrote yet and drops it), and the kernel's epilogue (a bias, a relu)
//   runs on the last block only. Partial sums are stored in the output buffer, so KBLOCK needs a
//   store whose buffer has the reduce's dtype.
//
// For C = A @ B with output loops i, j (ids 0, 1) and reduce loop k (id 2), cache_blocked_opts
// picks BLOCK(j, N) BLOCK(i, MB) KBLOCK(k, KB) and the register tile on the new inner loops:
//
//   for i_outer (M/MB blocks, split across threads)   A block MB x KB stays in L2
//     for k_outer (K/KB)
//       for j (N/16 tiles)                            B panel KB x 16 stays in L1
//         for i_inner (MB/R tiles)                    R x 16 accumulators in registers
//           for k_inner (KB)
//
// so each B panel is read from memory once per row block and then MB/R times from L1.
// KBLOCK also bounds the rows of B one panel touches to KB (page-table reach: a 2048-wide B
// has one 8 KB row per k).
//
// Note [blocks of B panels]: where B is read from panels (Note [B panels] in
// schedule/padded_rows.cpp: a tile's K x 16 or K x 32 columns of B are one contiguous run), the
// panel streams from the L2 as well as it sits in the L1 (the hardware prefetchers follow it), so
// the K block is no longer bounded by the L1: it is sized so that a panel takes 1/16 of the L2
// (panel_k_block), and the row block so that the A block (MB x KB) takes half the L2 with the K
// block chosen (a_block_bytes). What a larger K block saves is the output's traffic: every K
// block reads and writes the whole output block again (C is 16 MB at 2048^2, far from the L2).
// On the 2-core Intel Xeon (2 MB L2, 48 KB L1, loaded by other builds), a 2048 matmul's CPU time
// per product went from about 173 ms (KB 128, MB 128) to about 145 ms with KB 512 / MB 256 and
// 130 ms with KB 1024 / MB 256 (the sizes this rule gives); KB 256 / MB 512 took 165 ms. Under
// CPU_ISA=avx2 the same rule (KB 1024, MB 256) took 212-219 ms against 242-250 with KB 256 /
// MB 64. A K that one such block holds is not split at all (a 1024 matmul's K of 1024 took two
// blocks of 512 before): no partial sums are carried through the output, and the kernel stores
// its tile once. Nor is a K whose panel takes up to 1/8 of the L2 (panel_whole_k), the A block
// then being half the L2 with the whole K: a 2048 matmul's product kernel (both threads, the
// Xeon) took 53.5-57.5 ms with K whole and 128-row blocks against 57.6-60.9 ms with K blocks of
// 1024 and 256-row blocks (K blocks of 1024 with 128-row blocks: 56.2-58.8; K whole with
// 256-row blocks, an A block of the whole L2: 55.2-56.9); with buffers in huge pages (Note [huge
// pages for large buffers] in runtime/cpu.cpp) 54.9-56.2 ms against 58.1-58.9. B read with
// padded rows keeps the L1-bounded sizes above.

// Note [padded loops]: register tiles and cache blocks split loops by amounts that divide them,
// so a power-of-two row count (every benchmark's, most batches) gets tiles of 4 rows on AVX2,
// where 5 rows fit the registers (Note [tiles from the host] in opt.cpp): 8 accumulators for two
// FMA ports of latency 4 leave no slack, and every late load stalls both ports. PADTO(r, a)
// pads output loop r of size n to n', the next multiple of a: the loop runs to n', every index
// that r entered reads min(r', n-1) instead (a select: the padded iterations recompute the
// last row, which keeps every load in bounds and lets the tile's loads stay shared), and every
// store is gated by r' < n, so nothing outside the output is written and a KBLOCK's carried
// partial sums are added once. cache_blocked_opts pads the rows of a matmul's A block so that
// blocks of about the size Note [blocks of B panels] gives hold whole tiles of the tallest
// height the registers allow, where the padding costs at most 1/32 of the rows: a 1024 matmul
// runs 4 blocks of 260 rows (52 tiles of 5) over 1040 rows. On the 2-core Intel Xeon as AVX2
// (CPU_ISA=avx2), per product kernel, medians of 18-27 runs alternated with the build before:
// 1024^3 11.97 -> 11.82 ms, 2048^3 101.3 -> 98.0 ms; in a second pair of runs 11.89 -> 11.56 and
// 99.2 -> 93.3 ms. A hand-written C kernel of the same loops gained more from 5 rows (about 10%
// at 1024), so what is left lies outside the tile: the panel copy of B (0.5-0.6 ms at 1024 as
// AVX2, against 0.18 with AVX-512's 128-byte runs) and the spread of this shared machine.

// Note [prefetched panels]: a product that reads B from panels (Note [blocks of B panels])
// streams one panel per tile from the L2, a cache line (AVX2) or two (AVX-512) every step of
// k, and the tile's accumulator chains leave no slack for a line that comes late (Note [padded
// loops]). The L2's prefetchers follow the stream but do not run far enough ahead: a
// hand-written C kernel of the same loops (AVX2, 5 x 16 tiles, K whole) ran 7-9% faster at
// 1024^3 and 10-14% faster at 2048^3 on the 2-core Intel Xeon with a software prefetch 2 KB
// ahead of its B loads (1-2 KB ahead gave the same at 1024, 2 KB was best at 2048). PREFETCH(k,
// n) marks every load that moves by at least a cache line per step of reduce loop k, in the
// lane that starts a cache line, with the distance of n steps in elements (the LOAD's arg); the
// LLVM and C renderers emit a prefetch of that address beside the load (GPU renderers ignore
// it), so each step of k costs one prefetch per line of the stream. A prefetch past the end of
// the buffer is harmless: it does not fault and is not an access in LLVM's sense (the address is
// computed without inbounds). stream_prefetch gives PREFETCH(k, 2 KB / the stream's bytes a
// step) where a load streams along reduce loop k (one to four cache lines a step: a run, not a
// row apart each step) and k has 16 steps or more; cache_blocked_opts adds it to the products
// that read B from panels, register_tile_opts (opt.cpp) to the other register tiles. The
// latter takes in the CNN's channel-last weight gradients, whose inner loop runs along an
// image row of the input and of the output gradient (128 bytes a step each): as AVX2 the 5 x 5
// one went from 63-65 to 55-62 ms a step (`CPU_ISA=avx2 DEBUG=2 tg bench --reps 3 cnn_step`,
// three alternated runs; the whole step within the noise, 316-322 against 314-320 ms).

namespace {

int64_t next_range_id(const UOpPtr& ast) {
  int64_t id = 0;
  for (auto& ax : kernel_axes(ast)) id = std::max(id, ax.id + 1);
  return id;
}

UOpPtr range(int64_t size, int64_t id) { return make_uop(Op::RANGE, dtypes::index, {kint(size)}, Arg{id}); }

// The REDUCE nodes in v whose ranges include r.
std::vector<UOpPtr> reduces_over(const UOpPtr& v, const UOpPtr& r) {
  std::vector<UOpPtr> out;
  for (auto& n : toposort({v}))
    if (n->op == Op::REDUCE && std::find(n->src.begin() + 1, n->src.end(), r) != n->src.end())
      out.push_back(n);
  return out;
}

}  // namespace

std::string why_not_block(const UOpPtr& ast, const KernelAxis& ax, const Opt& opt) {
  std::string loop = "loop " + std::to_string(ax.id);
  if (ax.carried) return loop + " carries partial sums (a KBLOCK's outer loop)";
  if (opt.op == OptOp::BLOCK) return ax.reduce ? loop + " is a reduce loop (KBLOCK it)" : "";
  if (!ax.reduce) return loop + " is an output loop (BLOCK it)";
  if (opt.amount == ax.size) return "the amount must be smaller than " + loop + "'s size";
  bool outer_loop_before = false;
  for (auto& a : kernel_axes(ast)) outer_loop_before |= !a.reduce && a.id < ax.id && a.size > 1;
  if (!outer_loop_before)
    return "no output loop runs outside " + loop + " (threads split the outermost loop)";
  for (auto& st : stores_of(ast)) {
    auto reds = reduces_over(st->src[2], ax.range);
    if (reds.size() != 1) return "a store's value needs exactly one reduce over " + loop;
    if (std::get<Op>(reds[0]->arg) != Op::ADD) return "the reduce over " + loop + " is not a sum";
    if (st->src[0]->dtype != reds[0]->dtype)
      return std::string("partial sums are ") + dtype_name(reds[0]->dtype) + " but the output is " +
             dtype_name(st->src[0]->dtype);
  }
  return {};
}

std::string why_not_pad(const KernelAxis& ax, const Opt& opt) {
  std::string loop = "loop " + std::to_string(ax.id);
  if (ax.reduce) return loop + " is a reduce loop (only output loops are padded)";
  if (ax.carried) return loop + " carries partial sums (a KBLOCK's outer loop)";
  if (ax.size % opt.amount == 0) return loop + "'s size " + std::to_string(ax.size) + " is a multiple already";
  return {};
}

UOpPtr pad_loop(const UOpPtr& ast, const KernelAxis& ax, int64_t amount) {
  UOpPtr padded = range((ax.size + amount - 1) / amount * amount, ax.id);
  UOpPtr inside = kalu(Op::CMPLT, padded, kint(ax.size));
  UOpPtr clamped = kwhere(inside, padded, kint(ax.size - 1));
  std::vector<UOpPtr> stores;
  for (auto& st : stores_of(ast)) {
    UOpPtr s = substitute(st, {{ax.range.get(), clamped}});
    std::vector<UOpPtr> src(s->src.begin(), s->src.begin() + 3);
    src.push_back(s->src.size() > 3 ? kalu(Op::AND, s->src[3], inside) : inside);
    stores.push_back(make_uop(Op::STORE, s->dtype, src, s->arg));
  }
  return graph_rewrite(make_uop(Op::SINK, DType::Float32, stores), symbolic());
}

namespace {

constexpr int64_t CACHE_LINE = 64;
// A stream: a load that moves by one to four cache lines a step, a contiguous run (a panel, a
// channel-last image row); a load that moves by more is strided, each step a line of its own.
constexpr int64_t MAX_STREAM_STEP = 4 * CACHE_LINE;

// How many bytes a load streams per step of loop ax; 0 where it is no stream along it (or gated).
int64_t stream_step(const UOpPtr& load, const KernelAxis& ax) {
  if (load->op != Op::LOAD || load->src.size() != 2 || !ranges_in(load->src[1]).count(ax.range.get())) return 0;
  const int64_t step = index_stride(load->src[1], ax.range) * static_cast<int64_t>(itemsize(load->dtype));
  return step >= CACHE_LINE && step <= MAX_STREAM_STEP ? step : 0;
}

}  // namespace

UOpPtr prefetch_streams(const UOpPtr& ast, const KernelAxis& ax, int64_t iterations) {
  std::unordered_map<const UOp*, UOpPtr> marked;
  for (auto& n : toposort({ast})) {
    const int64_t step = stream_step(n, ax);
    if (!step) continue;
    const int64_t item = static_cast<int64_t>(itemsize(n->dtype));
    if ((index_at_zero(n->src[1]) * item) % CACHE_LINE != 0) continue;  // one lane a cache line
    marked[n.get()] = make_uop(Op::LOAD, n->dtype, n->src, Arg{step / item * iterations});
  }
  return marked.empty() ? ast : substitute(ast, marked);
}

std::optional<Opt> stream_prefetch(const UOpPtr& ast, const KernelAxis& red) {
  constexpr int64_t PREFETCH_BYTES = 2048, MIN_STEPS = 16;
  int64_t step = 0;
  for (auto& n : toposort({ast})) step = std::max(step, stream_step(n, red));
  if (!step || red.size < MIN_STEPS) return std::nullopt;
  return Opt{OptOp::PREFETCH, red.id, PREFETCH_BYTES / step};
}

UOpPtr block_loop(const UOpPtr& ast, const KernelAxis& ax, int64_t amount) {
  UOpPtr inner = range(amount, next_range_id(ast));
  UOpPtr index = ax.size == amount
                     ? inner
                     : kalu(Op::ADD, kalu(Op::MUL, range(ax.size / amount, ax.id), kint(amount)), inner);
  return graph_rewrite(substitute(ast, {{ax.range.get(), index}}), symbolic());
}

UOpPtr block_reduce(const UOpPtr& ast, const KernelAxis& ax, int64_t amount) {
  UOpPtr inner = range(amount, next_range_id(ast));
  UOpPtr outer = range(ax.size / amount, ax.id);
  UOpPtr index = kalu(Op::ADD, kalu(Op::MUL, outer, kint(amount)), inner);
  UOpPtr first = kalu(Op::CMPNE, outer, kint(0)), last = kalu(Op::CMPLT, outer, kint(ax.size / amount - 1));
  std::vector<UOpPtr> stores;
  for (auto& st : stores_of(ast)) {
    UOpPtr red = reduces_over(st->src[2], ax.range).at(0);
    std::vector<UOpPtr> src{substitute(red->src[0], {{ax.range.get(), index}})};
    for (size_t i = 1; i < red->src.size(); i++) src.push_back(red->src[i] == ax.range ? inner : red->src[i]);
    // a gated store's partial sum is read under its gate too
    std::vector<UOpPtr> load_src{st->src[0], st->src[1]};
    if (st->src.size() > 3) load_src.push_back(st->src[3]);
    UOpPtr prev = kwhere(first, make_uop(Op::LOAD, red->dtype, load_src), kconst(red->dtype, 0));
    UOpPtr sum = kalu(Op::ADD, make_uop(Op::REDUCE, red->dtype, src, red->arg), prev);
    UOpPtr value = st->src[2] == red ? sum : kwhere(last, sum, substitute(st->src[2], {{red.get(), sum}}));
    std::vector<UOpPtr> store_src{st->src[0], st->src[1], value};
    if (st->src.size() > 3) store_src.push_back(st->src[3]);  // a padded loop's gate (Note [padded loops])
    stores.push_back(make_uop(Op::STORE, st->dtype, store_src, st->arg));
  }
  return graph_rewrite(make_uop(Op::SINK, DType::Float32, stores), symbolic());
}

namespace {

// Note [blocks of B panels]: whether B, the load that moves along the tile's columns and the
// reduce, reads a contiguous panel: one step of the reduce moves it by the tile's width.
bool reads_b_panels(const UOpPtr& ast, const KernelAxis& wide, int64_t wide_lanes, const KernelAxis& red) {
  for (auto& n : toposort({ast})) {
    if (n->op != Op::LOAD) continue;
    auto in = ranges_in(n->src[1]);
    if (in.count(wide.range.get()) && in.count(red.range.get()))
      return index_stride(n->src[1], red.range) == wide_lanes && index_stride(n->src[1], wide.range) == 1;
  }
  return false;
}

// Note [padded loops]: blocks of about row_block rows, each a whole number of tiles of
// most_row_lanes rows, when tiles of row_lanes rows are shorter and the padding costs at most
// 1/32 of the rows; nullopt otherwise.
std::optional<int64_t> padded_row_block(int64_t rows, int64_t row_block, int64_t row_lanes, int64_t most_row_lanes) {
  if (row_lanes >= most_row_lanes || row_block < most_row_lanes) return std::nullopt;
  const int64_t blocks = std::max<int64_t>((rows + row_block - 1) / row_block, 2);
  const int64_t per_block = most_row_lanes * ((rows + blocks * most_row_lanes - 1) / (blocks * most_row_lanes));
  const int64_t waste = (rows + per_block - 1) / per_block * per_block - rows;
  if (rows % most_row_lanes == 0 || waste * 32 > rows) return std::nullopt;
  return per_block;
}

}  // namespace

std::vector<Opt> cache_blocked_opts(const UOpPtr& ast, const KernelAxis& wide, int64_t wide_lanes,
                                    const KernelAxis& rows, int64_t row_lanes, int64_t most_row_lanes,
                                    const KernelAxis& red, const CpuTiles& tiles) {
  constexpr int64_t MIN_K_BLOCK = 64;
  std::vector<Opt> tile{{OptOp::UPCAST, rows.id, row_lanes}, {OptOp::UPCAST, wide.id, wide_lanes}};
  // B, the operand that moves along the wide loop and the reduce, is what the blocks keep in cache
  if (wide.size * red.size * 4 < tiles.min_panel_bytes || rows.size < 2 * row_lanes) return tile;
  const bool panels = reads_b_panels(ast, wide, wide_lanes, red);  // Note [blocks of B panels]
  int64_t mb = 0, kb = 0;
  if (panels && red.size >= MIN_K_BLOCK && red.size <= tiles.panel_whole_k) kb = red.size;  // no partial sums
  for (int64_t b = panels ? tiles.panel_k_block : tiles.k_block; b >= MIN_K_BLOCK && !kb; b--)
    if (red.size % b == 0 && red.size / b >= 2) kb = b;
  const int64_t row_block = panels && kb ? tiles.a_block_bytes / (kb * 4) : tiles.row_block;
  std::vector<Opt> opts;
  if (auto padded = padded_row_block(rows.size, row_block, row_lanes, most_row_lanes)) {  // Note [padded loops]
    mb = *padded;
    row_lanes = most_row_lanes;
    opts.push_back({OptOp::PADTO, rows.id, mb});
  }
  for (int64_t b = row_block; b >= row_lanes && !mb; b--)
    if (b % row_lanes == 0 && rows.size % b == 0 && rows.size / b >= 2) mb = b;
  if (!mb) return tile;
  const int64_t next = next_range_id(ast);
  const int64_t wide_inner = next, rows_inner = next + 1;  // the ids BLOCK gives the inner loops
  opts.push_back({OptOp::BLOCK, wide.id, wide.size});
  opts.push_back({OptOp::BLOCK, rows.id, mb});
  // a bfloat16 output cannot carry float32 partial sums: its product keeps whole K loops
  if (kb && why_not_block(ast, red, {OptOp::KBLOCK, red.id, kb}).empty()) opts.push_back({OptOp::KBLOCK, red.id, kb});
  opts.push_back({OptOp::UPCAST, rows_inner, row_lanes});
  opts.push_back({OptOp::UPCAST, wide_inner, wide_lanes});
  if (auto prefetch = stream_prefetch(ast, red); prefetch && panels) {  // Note [prefetched panels]
    // a K block's inner loop (KBLOCK's fresh id, after the two BLOCKs') is the one the panel streams along
    if (opts.size() >= 3 && opts[opts.size() - 3].op == OptOp::KBLOCK) prefetch->axis = next + 2;
    opts.push_back(*prefetch);
  }
  return opts;
}

}  // namespace tg
