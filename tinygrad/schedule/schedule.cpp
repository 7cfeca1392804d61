// Kernel boundaries and fusion. create_schedule runs three steps: graph_to_compute (graph.h: the nodes
// still to compute, after the layout rewrite of Note [padded B rows] in padded_rows.cpp),
// realize_points (which nodes get buffers of their own: the Notes below), and ItemMaker, which
// gives each realize point a buffer and an item: a copy or collective, or a kernel lowered from
// its lazy subgraph (in two stages where Note [split reductions] in split_reduce.cpp says so).
//
// Note [where kernels end]: a node is computed into its own buffer ("realize point") when it is
// an output, a REDUCE_AXIS, CONTIGUOUS, COPY (and its source), a collective or a template kernel
// (and its sources: Note [template kernels] in codegen/attention_kernel.cpp). Everything else is
// recomputed inline by each kernel that reads it, so elementwise chains and movement ops never
// cost a kernel or a copy. One exception joins a reduce to the kernel above it: an output or
// CONTIGUOUS node that reaches a REDUCE_AXIS through elementwise ops alone, every node on the way
// read only once, computes that reduce itself ("sum then scale" is one kernel). The way down may
// also pass views that use each element at most once (RESHAPE, PERMUTE, SHRINK, FLIP), never an
// EXPAND, which would recompute the reduce for every copy. The other exception is over rows,
// through EXPANDs: Note [row fusion].
//
// Note [row fusion]: a REDUCE_AXIS over the trailing axes of its input (a "row" of at most
// ROW_FUSE_MAX elements) that is read back over the same rows (softmax's `x - x.max(-1)`,
// layernorm's `x - x.mean(-1)`) is not a realize point when every way up from it reaches one
// kernel K and passes only nodes that keep a row at one index: elementwise ops on the full shape
// S or the reduced shape S', EXPANDs from S' to S, and other such reduces over the same axes
// (which this rule or the one above fused). K itself has shape S or S' (an elementwise node, or
// such a reduce), or is S' without its size-1 dims (`logsumexp(-1)`). Lowering then evaluates the
// reduce at (row, 0) only, so it is computed once per row, and the linearizer opens the row loops
// first, runs the row's reductions in order and only then the loops over the row's elements (Note
// [row loops] in codegen/linearize.cpp). softmax, log_softmax and layernorm become one kernel that
// reads its input once from memory and again from cache. Reduces are visited consumers first, so
// softmax's sum joins K before its max is looked at (whose way up then passes the fused sum). A
// reduce that two kernels read stays a realize point (each would compute it again), and rows
// longer than ROW_FUSE_MAX stay separate kernels: their re-reads would no longer come from cache.
// ROWFUSE=0 turns the rule off.
//
// Note [product operands]: a computed elementwise node that a product (a REDUCE_AXIS of a MUL)
// reads through an EXPAND (a matmul's operand: the output gradient times a relu's mask, a
// softmax's gradient, a bias plus a relu) and that is expanded at least PRODUCT_OPERAND_COPIES
// times is a realize point of its own on two kinds of devices:
//  - where the device policy says realize_product_operands (the CPU), the product's kernel would recompute it for every copy the EXPAND makes,
//    once per column of the product; one pass writes it, and the product reads plain loads it
//    can keep in registers;
//  - with a matmul library (Feature::MatmulLibrary, the MATMUL_LIB knob on), the library runs
//    a product from buffers only (Note [matching a matmul kernel] in match_matmul.cpp); with the
//    operand computed inline the product would stay a generated kernel.
// The way from the MUL to the EXPAND passes casts, reshapes and permutes only, and from the
// EXPAND down to the node reshapes, permutes and casts between float types (the library rounds
// or widens operands itself). Sliding windows (a convolution's input repeated, then shrunk into
// windows) stay fused: realizing the activations under them cost the CNN run 100 MB of peak
// memory; so do plain sums of products (no EXPAND) and a row statistic expanded inside a reduce
// (layernorm's mean). GPU-style devices without a library keep recomputing them.
//
// Note [kept convolution outputs]: a convolution's CUSTOM_GRAD node is a realize point too, and
// its buffer stays with the node after the schedule has run, like an output's; so does a template
// kernel's (fused attention's forward output, which its backward kernels read). A training step
// runs several schedules over one graph (a BatchNorm realizes its statistics in the middle of the
// forward pass, then the backward pass reads the pre-activations again); without this each of
// them would recompute every convolution it reaches. The cost is one extra pass over the output
// where a bias and activation used to fuse into the convolution's kernel. Other CUSTOM_GRAD nodes
// (cross-entropy's target logit) are their values, fused like any elementwise node.
//
// Note [kernels with several outputs]: an optimizer's step computes each parameter's new value
// from its new moments (AdamW: m' = b1 m + (1 - b1) g, v' = b2 v + (1 - b2) g^2, p' = p - lr m' /
// (sqrt(v') + eps) ...), and all three are outputs. As three kernels, the update reads m' and v'
// back after writing them, and each kernel evaluates the gradient's expression again. So a
// realize point U computed elementwise (its kernel has no reduce) whose every reader lies in the
// kernel of one other such realize point K, of the same shape and device, reached from K through
// elementwise ops only (both are evaluated at the same index), is stored by K's kernel: one
// kernel, a STORE per output, the first K's (ScheduleItem::outputs; lower_kernel with several
// roots). AdamW's update of a parameter and SGD's with momentum are one kernel each.
#include "tinygrad/schedule/schedule.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/gradient.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"
#include "tinygrad/multi.h"
#include "tinygrad/schedule/concat_in_place.h"
#include "tinygrad/schedule/graph.h"
#include "tinygrad/schedule/library_operands.h"
#include "tinygrad/schedule/match_matmul.h"
#include "tinygrad/schedule/memory_order.h"
#include "tinygrad/schedule/padded_rows.h"
#include "tinygrad/schedule/rounded_values.h"
#include "tinygrad/schedule/shared_chains.h"
#include "tinygrad/schedule/split_reduce.h"

namespace tg {

namespace {

bool is_elementwise(const UOp& u) { return is_alu(u.op) || u.op == Op::DETACH || u.op == Op::CUSTOM_GRAD; }
bool is_collective(const UOp& u) { return op_group(u.op) == OpGroup::Collective; }
bool is_reordering_view(const UOp& u) { return u.op == Op::RESHAPE || u.op == Op::PERMUTE; }
bool is_injective_view(const UOp& u) {
  return u.op == Op::RESHAPE || u.op == Op::PERMUTE || u.op == Op::SHRINK || u.op == Op::FLIP;
}

// Note [product operands]
constexpr int64_t PRODUCT_OPERAND_COPIES = 8;

bool realizes_product_operands(const std::string& device) {
  return get_device(device).policy().realize_product_operands || runs_library_products(device);
}

// Note [row fusion]
constexpr int64_t ROW_FUSE_MAX = 16384;

// A reduce over the trailing axes of its input, at most ROW_FUSE_MAX elements per row.
bool is_row_reduce(const UOp& u) {
  if (u.op != Op::REDUCE_AXIS) return false;
  auto& axes = u.arg_reduce().axes;
  const Shape& in = u.src[0]->shape;
  int64_t row = 1;
  for (size_t i = 0; i < axes.size(); i++) {
    if (axes[i] != static_cast<int64_t>(in.size() - axes.size() + i)) return false;
    row *= in[static_cast<size_t>(axes[i])];
  }
  return !axes.empty() && row <= ROW_FUSE_MAX;
}

// ---- realize points (Note [where kernels end]) ----

// A node whose buffer stays with it after the schedule (Note [kept convolution outputs]).
bool keeps_its_output(const UOp& u) {
  return u.op == Op::TEMPLATE_KERNEL ||
         (u.op == Op::CUSTOM_GRAD && static_cast<CustomGrad>(u.arg_ints().at(0)) == CustomGrad::CONV2D);
}

// The nodes that always end a kernel: outputs, REDUCE_AXIS, CONTIGUOUS, COPY, collectives and
// template kernels (and their sources), convolutions (Note [kept convolution outputs]),
// SCATTER_ADD (Note [accumulating stores] in lower.cpp).
NodeSet kernel_ends(const ScheduleGraph& g) {
  NodeSet realize;
  for (auto& u : g.order) {
    if (has_buffer(u.get())) continue;
    if (g.output_set.count(u.get()) || u->op == Op::REDUCE_AXIS || u->op == Op::CONTIGUOUS || u->op == Op::COPY ||
        is_collective(*u) || keeps_its_output(*u) || u->op == Op::SCATTER_ADD)
      realize.insert(u.get());
    if (u->op == Op::COPY && !has_buffer(u->src[0].get())) realize.insert(u->src[0].get());
    if (u->op == Op::TEMPLATE_KERNEL || is_collective(*u))  // a device collective reads every device's operand
      for (auto& src : u->src)
        if (!has_buffer(src.get())) realize.insert(src.get());
  }
  return realize;
}

// Note [product operands]
void realize_product_operands(const ScheduleGraph& g, NodeSet& realize) {
  for (auto& u : g.order) {
    if (u->op != Op::REDUCE_AXIS || has_buffer(u.get()) || !realizes_product_operands(u->device)) continue;
    const UOp* product = u->src[0].get();
    while (product->op == Op::CAST) product = product->src[0].get();
    if (product->op != Op::MUL) continue;
    for (auto& side : product->src) {
      const UOp* n = side.get();
      while ((n->op == Op::CAST || is_reordering_view(*n)) && !has_buffer(n) && !realize.count(n))
        n = n->src[0].get();
      if (n->op != Op::EXPAND || has_buffer(n) || prod(n->shape) < PRODUCT_OPERAND_COPIES * prod(n->src[0]->shape))
        continue;
      const UOp* x = n->src[0].get();
      while ((is_reordering_view(*x) || library_float_cast(*x)) && !has_buffer(x) && !realize.count(x))
        x = x->src[0].get();
      if (!has_buffer(x) && !realize.count(x) && is_alu(x->op) && x->op != Op::CAST) realize.insert(x);
    }
  }
}

// Note [rounded products stay with the library]: on a device whose products run through its
// library, a product (a sum of a MUL) whose one reader rounds it to a half type is stored
// rounded by the library (Note [values stored rounded] in rounded_values.cpp) rather than joined
// to the kernel of a reader that computes on in float32 and rounds to a half type again: what a
// Linear under a compute dtype adds after the rounding (its float32 bias) is then no epilogue the
// library takes (a float32 bias needs a float32 output), so the joined kernel would be a
// generated product. Readers that keep float32 or work in the half type keep the product in
// their kernel, where the library runs it with its bias and relu. GPT's c_attn output, rounded
// to bfloat16 with its bias for fused attention to read in place (Note [strided operands] in
// tensor_attention.cpp), ran as a generated kernel at 15.7 ms (H100) instead of the library's
// 0.09 ms and an elementwise pass for the bias.
bool product_stored_rounded(const ScheduleGraph& g, const UOp& reduce, const UOp& kernel) {
  if (!runs_library_products(reduce.device)) return false;
  const UOp* product = reduce.src[0].get();
  while (product->op == Op::CAST) product = product->src[0].get();
  const UOp* reader = &reduce;  // through the reshape that drops the summed dims
  do {
    const auto& readers = readers_of(g, reader);
    if (readers.size() != 1) return false;
    reader = readers[0];
  } while (reader->op == Op::RESHAPE);
  bool rounds_again = kernel.op == Op::CAST && is_half(kernel.dtype) && &kernel != reader;
  return product->op == Op::MUL && reader->op == Op::CAST && is_half(reader->dtype) && rounds_again;
}

// Note [where kernels end]: a reduce read once, through elementwise ops and injective views
// only, by a realize point that is not itself a reduce, joins that realize point's kernel
// (except Note [rounded products stay with the library]).
void fuse_reduces_into_readers(const ScheduleGraph& g, NodeSet& realize) {
  for (auto& u : g.order) {
    if (!realize.count(u.get()) || u->op == Op::REDUCE_AXIS || u->op == Op::COPY || is_collective(*u) ||
        u->op == Op::SCATTER_ADD || u->op == Op::TEMPLATE_KERNEL)
      continue;
    std::vector<const UOp*> stack;
    auto push_value_srcs = [&](const UOp& n) {
      for (size_t i = 0; i < value_src_count(n); i++) stack.push_back(n.src[i].get());
    };
    push_value_srcs(*u);
    NodeSet seen;
    while (!stack.empty()) {
      const UOp* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second || has_buffer(n) || readers_of(g, n).size() != 1) continue;
      if (n->op == Op::REDUCE_AXIS && realize.count(n) && !g.output_set.count(n)) {
        if (!product_stored_rounded(g, *n, *u)) realize.erase(n);
        break;
      }
      if (realize.count(n) || !(is_elementwise(*n) || is_injective_view(*n))) continue;
      push_value_srcs(*n);
    }
  }
}

// Un-realizes the row reduces that one kernel reads back over the same rows (Note [row fusion]).
void fuse_rows(const ScheduleGraph& g, NodeSet& realize) {
  for (auto it = g.order.rbegin(); it != g.order.rend(); ++it) {
    const UOp* r = it->get();
    if (!realize.count(r) || g.output_set.count(r) || !is_row_reduce(*r)) continue;
    const Shape& full = r->src[0]->shape;
    const Shape& reduced = r->shape;
    auto keeps_rows = [&](const UOp& n) {
      if (n.op == Op::RESHAPE && realize.count(&n))  // a kernel K that drops the reduced size-1 dims
        return n.src[0]->shape == reduced && without_ones(n.shape) == without_ones(reduced);
      if (n.shape != full && n.shape != reduced) return false;
      if (is_elementwise(n) || n.op == Op::CONTIGUOUS) return true;
      if (n.op == Op::EXPAND) return n.src[0]->shape == reduced && n.shape == full;
      return n.op == Op::REDUCE_AXIS && n.src[0]->shape == full &&
             n.arg_reduce().axes == r->arg_reduce().axes;
    };
    const UOp* kernel = nullptr;
    bool ok = true;
    std::vector<const UOp*> stack{r};
    NodeSet seen;
    while (ok && !stack.empty()) {
      const UOp* n = stack.back();
      stack.pop_back();
      for (const UOp* u : readers_of(g, n)) {
        if (!seen.insert(u).second) continue;
        if (!keeps_rows(*u) || (u->op == Op::CONTIGUOUS && !realize.count(u))) {
          ok = false;
          break;
        }
        if (!realize.count(u)) {
          stack.push_back(u);
        } else if (!kernel || kernel == u) {
          kernel = u;
        } else {
          ok = false;
          break;
        }
      }
    }
    if (ok && kernel) realize.erase(r);
  }
}

// ---- kernels with several outputs (Note [kernels with several outputs]) ----

// The nodes whose value, as a kernel computes it, includes a reduce: a REDUCE_AXIS, or a node that
// reads one through nodes that are not realize points. A realize point in it has a reduce in its
// kernel. One pass over the graph, sources first.
NodeSet computing_reduces(const ScheduleGraph& g, const NodeSet& realize) {
  NodeSet r;
  for (auto& u : g.order) {
    if (has_buffer(u.get())) continue;
    bool reduces = u->op == Op::REDUCE_AXIS;
    for (size_t i = 0; i < value_src_count(*u) && !reduces; i++) {
      const UOp* s = u->src[i].get();
      reduces = !realize.count(s) && r.count(s);
    }
    if (reduces) r.insert(u.get());
  }
  return r;
}

// The nodes of k's kernel evaluated at k's own index (reached through elementwise ops), and the
// realize points they read.
struct SameIndexRegion {
  NodeSet nodes;
  std::vector<UOpPtr> realized_reads;
};
SameIndexRegion same_index_region(const UOpPtr& k, const NodeSet& realize) {
  SameIndexRegion r;
  std::vector<const UOpPtr*> stack{&k};
  while (!stack.empty()) {
    const UOpPtr& n = *stack.back();
    stack.pop_back();
    if (has_buffer(n.get())) continue;
    if (n != k && realize.count(n.get())) {
      r.realized_reads.push_back(n);
      continue;
    }
    if (!(n == k || is_elementwise(*n)) || !r.nodes.insert(n.get()).second) continue;
    for (size_t i = 0; i < value_src_count(*n); i++) stack.push_back(&n->src[i]);
  }
  return r;
}

// The realize points that can be one of a kernel's outputs: computed elementwise, their kernels
// have no reduce. Empty where fewer than two are (no kernel could store another).
NodeSet elementwise_kernels(const ScheduleGraph& g, const NodeSet& realize) {
  std::vector<const UOp*> alu;
  for (auto& u : g.order)
    if (realize.count(u.get()) && is_alu(u->op) && !has_buffer(u.get())) alu.push_back(u.get());
  NodeSet r;
  if (alu.size() < 2) return r;
  const NodeSet reducing = computing_reduces(g, realize);
  for (const UOp* u : alu)
    if (!reducing.count(u)) r.insert(u);
  return r;
}

// For each kernel that stores several outputs, the realize points its kernel also stores.
std::unordered_map<const UOp*, std::vector<UOpPtr>> kernels_with_several_outputs(const ScheduleGraph& g,
                                                                                const NodeSet& realize) {
  std::unordered_map<const UOp*, std::vector<UOpPtr>> joined;
  const NodeSet candidates = elementwise_kernels(g, realize);
  if (candidates.size() < 2) return joined;  // nothing to do: a join takes a kernel and another output
  NodeSet absorbed;
  for (auto it = g.order.rbegin(); it != g.order.rend(); ++it) {
    const UOpPtr& k = *it;
    if (!candidates.count(k.get()) || absorbed.count(k.get())) continue;
    SameIndexRegion region = same_index_region(k, realize);
    for (const UOpPtr& u : region.realized_reads) {
      if (!candidates.count(u.get()) || absorbed.count(u.get()) || joined.count(u.get()) || u->shape != k->shape ||
          u->device != k->device)
        continue;
      const auto& rs = readers_of(g, u.get());
      if (!std::all_of(rs.begin(), rs.end(), [&](const UOp* r) { return region.nodes.count(r) > 0; })) continue;
      joined[k.get()].push_back(u);
      absorbed.insert(u.get());
    }
  }
  return joined;
}

// The nodes computed into buffers of their own (Note [where kernels end]).
NodeSet realize_points(const ScheduleGraph& g) {
  NodeSet realize = kernel_ends(g);
  realize_product_operands(g, realize);
  fuse_reduces_into_readers(g, realize);
  if (knobs::ROWFUSE) fuse_rows(g, realize);  // Note [row fusion]
  store_values_rounded(g, realize);  // Note [values stored rounded]
  realize_rounded_partners(g, realize);  // Note [mixed library operands]
  // Note [shared elementwise chains] in shared_chains.cpp
  realize_shared_chains(g.order, realize, [](const UOp* u) { return has_buffer(u); });
  return realize;
}

// ---- the order of collectives on resident data (Note [gathers one reader ahead]) ----

// Note [gathers one reader ahead]: a collective whose input is resident data (existing buffers,
// or one kernel that reads only existing buffers: fsdp's gather of a unit's parameter shards)
// can be issued at any point of a schedule. Left where the graph's order puts it, just before
// its first reader, that reader would wait for all of it; issued at the top, every such result
// would be alive from the start. So these collectives, taken in the order of their first
// readers, are each issued no later than just before the first reader of the one before them:
// unit k+1's gather is queued on the communication thread before unit k's first kernel, runs
// while unit k's kernels do, and is waited for only by unit k+1's first kernel, while at most
// about two units' results are alive (each is freed after its last reader, Note [intermediates
// die after their last reader] in engine/realize.cpp). The first of them stays where it is, and
// none is moved later than the order had it (outputs listed first stay at the top). The kernel
// that makes the input moves with its collective; it reads existing buffers only, and buffers
// are never written twice, so any earlier place computes the same value.

// The realize points that must run to issue collective c (its input's kernel, when it has one,
// then c), or nothing when c's input is not resident data.
std::vector<const UOp*> resident_collective(const UOp* c, const NodeSet& realize, const NodeSet& joined) {
  if (c->src.size() != 1) return {};  // between devices: its operands come from several kernels
  const UOp* in = c->src[0].get();
  std::vector<const UOp*> stack{in};
  NodeSet seen;
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second || has_buffer(n)) continue;
    if (is_collective(*n) || (n != in && realize.count(n)) || joined.count(n)) return {};
    for (auto& s : n->src) stack.push_back(s.get());
  }
  if (has_buffer(in)) return {c};
  return {in, c};
}

// The position in `order` of the first realize point whose kernel reads c (reached through
// nodes computed inline), or order.size() when none does.
size_t first_reader(const UOp* c, const ScheduleGraph& g, const NodeSet& realize,
                    const std::unordered_map<const UOp*, size_t>& pos, size_t none) {
  size_t first = none;
  std::vector<const UOp*> stack{c};
  NodeSet seen;
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    for (const UOp* r : readers_of(g, n)) {
      if (!seen.insert(r).second) continue;
      if (realize.count(r)) first = std::min(first, pos.at(r));
      else stack.push_back(r);
    }
  }
  return first;
}

// The order in which create_schedule makes items: g.order, with the collectives on resident
// data moved up (Note [gathers one reader ahead]).
std::vector<UOpPtr> issue_order(const ScheduleGraph& g, const NodeSet& realize,
                                const std::unordered_map<const UOp*, std::vector<UOpPtr>>& several) {
  if (std::none_of(g.order.begin(), g.order.end(), [](const UOpPtr& u) { return is_collective(*u); })) return g.order;
  NodeSet joined;
  for (auto& [k, us] : several) {
    joined.insert(k);
    for (auto& u : us) joined.insert(u.get());
  }
  std::unordered_map<const UOp*, size_t> pos;
  for (size_t i = 0; i < g.order.size(); i++) pos[g.order[i].get()] = i;
  struct Moved {
    std::vector<const UOp*> items;
    size_t reader;
  };
  std::vector<Moved> ahead;
  for (auto& u : g.order) {
    if (!is_collective(*u) || !realize.count(u.get()) || has_buffer(u.get())) continue;
    auto items = resident_collective(u.get(), realize, joined);
    if (items.empty()) continue;
    size_t reader = first_reader(u.get(), g, realize, pos, g.order.size());
    if (reader < g.order.size()) ahead.push_back({items, reader});
  }
  if (ahead.size() < 2) return g.order;
  std::stable_sort(ahead.begin(), ahead.end(), [](const Moved& a, const Moved& b) { return a.reader < b.reader; });
  std::unordered_map<size_t, std::vector<const UOp*>> before;  // position -> the items issued just before it
  NodeSet moved;
  for (size_t k = 1; k < ahead.size(); k++) {
    const size_t at = ahead[k - 1].reader;
    for (const UOp* u : ahead[k].items) {
      if (pos.at(u) < at) continue;  // never later than the order had it
      before[at].push_back(u);
      moved.insert(u);
    }
  }
  std::unordered_map<const UOp*, UOpPtr> node_of;
  for (auto& u : g.order) node_of[u.get()] = u;
  std::vector<UOpPtr> out;
  out.reserve(g.order.size());
  for (size_t i = 0; i < g.order.size(); i++) {
    if (auto it = before.find(i); it != before.end())
      for (const UOp* u : it->second) out.push_back(node_of.at(u));
    if (!moved.count(g.order[i].get())) out.push_back(g.order[i]);
  }
  return out;
}

// A concatenation that a kernel with several outputs stores stays an ordinary kernel.
void drop_joined_concats(ConcatsInPlace& out, const std::unordered_map<const UOp*, std::vector<UOpPtr>>& several) {
  if (out.concats.empty() || several.empty()) return;
  NodeSet joined;
  for (auto& [k, us] : several) {
    joined.insert(k);
    for (auto& u : us) joined.insert(u.get());
  }
  for (auto it = out.concats.begin(); it != out.concats.end();) {
    if (!joined.count(it->first)) {
      ++it;
      continue;
    }
    for (auto& p : it->second.pieces)
      if (p.placed) out.placed.erase(p.placed);
    it = out.concats.erase(it);
  }
}

// ---- schedule items ----

// Makes the buffers and schedule items of the realize points, visited sources first.
class ItemMaker {
 public:
  ItemMaker(const ScheduleGraph& g, const NodeSet& realize, std::unordered_map<const UOp*, std::vector<UOpPtr>> joined,
            ConcatsInPlace concats)
      : g_(g), realize_(realize), joined_(std::move(joined)), concats_(std::move(concats)) {
    for (auto& [k, us] : joined_)
      for (auto& u : us) stored_by_.insert(u.get());
  }

  // The buffer `u` is read from: its own, or the one a realize point scheduled earlier fills.
  std::shared_ptr<Buffer> input_of(const UOp* u) const {
    if (auto b = existing_buffer(u)) return b;
    auto it = buffers_.find(u);
    return it == buffers_.end() ? nullptr : it->second;
  }

  // Schedules realize point `u` into a new buffer, which it returns. An empty tensor needs no item.
  // A realize point that another kernel stores (Note [kernels with several outputs]) waits for it.
  std::shared_ptr<Buffer> add(const UOpPtr& u) {
    if (auto it = buffers_.find(u.get()); it != buffers_.end()) return it->second;  // a device collective's
    if (is_collective(*u)) return add_collective(u);
    if (auto it = concats_.concats.find(u.get()); it != concats_.concats.end()) return add_concat(u, it->second);
    auto out = new_buffer(u);
    if (stored_by_.count(u.get())) {
      waiting_[u.get()] = out;
      return out;
    }
    if (u->op == Op::COPY)
      add_copy(u, out);
    else if (u->op == Op::TEMPLATE_KERNEL)
      add_template_kernel(u, out);
    else if (auto it = joined_.find(u.get()); it != joined_.end())
      add_kernel_with_outputs(u, out, it->second);
    else if (prod(u->shape) > 0)
      add_kernel(u, out);
    buffers_[u.get()] = out;
    return out;
  }

  std::vector<ScheduleItem> take_items() { return std::move(items_); }

 private:
  const ScheduleGraph& g_;
  const NodeSet& realize_;
  std::unordered_map<const UOp*, std::vector<UOpPtr>> joined_;  // a kernel -> the other outputs it stores
  ConcatsInPlace concats_;                                        // Note [concatenations stored in place]
  std::unordered_map<const UOp*, std::shared_ptr<Buffer>> concat_buffers_;
  NodeSet stored_by_;                                             // those other outputs
  std::unordered_map<const UOp*, std::shared_ptr<Buffer>> waiting_;  // their buffers until their kernel is made
  std::unordered_map<const UOp*, std::shared_ptr<Buffer>> buffers_;
  std::vector<ScheduleItem> items_;
  // first stages of split reduces and the results of device collectives: alive while `buffers_` names them
  std::vector<UOpPtr> stages_;

  // The buffer of a concatenation stored in place, made when its first piece or itself is.
  std::shared_ptr<Buffer> concat_buffer(const UOp* c) {
    auto& b = concat_buffers_[c];
    if (!b) b = std::make_shared<Buffer>(c->device, c->dtype, prod(c->shape));
    return b;
  }

  // A new buffer for realize point u: a view of its concatenation's buffer where u is a placed piece.
  std::shared_ptr<Buffer> new_buffer(const UOpPtr& u) {
    auto it = concats_.placed.find(u.get());
    if (it == concats_.placed.end()) return std::make_shared<Buffer>(u->device, u->dtype, prod(u->shape));
    const size_t offset = static_cast<size_t>(it->second.begin) * itemsize(u->dtype);
    return std::make_shared<Buffer>(concat_buffer(it->second.concat), offset, u->dtype, prod(u->shape));
  }

  // Note [concatenations stored in place]: the placed pieces are already there (made before, as
  // the concatenation's sources); one kernel writes the run of the others, if there is one.
  std::shared_ptr<Buffer> add_concat(const UOpPtr& u, const ConcatInPlace& plan) {
    auto out = concat_buffer(u.get());
    const auto& pieces = plan.pieces;
    for (size_t first = 0; first < pieces.size(); first++) {
      if (pieces[first].placed) continue;
      size_t last = first;
      while (last < pieces.size() && !pieces[last].placed) last++;
      const size_t offset = static_cast<size_t>(pieces[first].begin) * itemsize(u->dtype);
      lower(concat_run_value(pieces, first, last),
            std::make_shared<Buffer>(out, offset, u->dtype, pieces[last - 1].end - pieces[first].begin));
      first = last;
    }
    buffers_[u.get()] = out;
    return out;
  }

  // Note [all-reduces in place]: an all-reduce across the ranks whose operand is an intermediate
  // of this schedule that it alone reads (a DDP bucket) writes its result over the operand: no
  // second buffer, and on the host no copy of the operand before the reduction. A concatenation
  // stored in place qualifies only when sealed (nothing else reads its pieces' views).
  bool reduces_in_place(const UOpPtr& u) const {
    if (u->op != Op::ALLREDUCE || u->src.size() != 1) return false;
    const UOp* src = u->src[0].get();
    if (has_buffer(src) || !buffers_.count(src) || g_.output_set.count(src) || src->dtype != u->dtype ||
        keeps_its_output(*src) || concats_.placed.count(src))
      return false;
    const auto& rs = readers_of(g_, src);
    if (rs.size() != 1 || rs[0] != u.get()) return false;
    auto c = concats_.concats.find(src);
    return c == concats_.concats.end() || c->second.sealed;
  }

  void add_copy(const UOpPtr& u, const std::shared_ptr<Buffer>& out) {
    ScheduleItem item;
    item.device = u->device;
    item.kind = ScheduleItem::Kind::Copy;
    item.ast = u;
    item.buffers = {out, input_of(u->src[0].get())};
    TG_ASSERT(item.buffers[1], "copy source not realized");
    items_.push_back(std::move(item));
  }

  // Note [one item for a collective between devices]: a collective across the ranks is one node
  // and one item {out, in}. A collective between the n devices of a tuple through their library
  // (Note [collectives through a device library] in multi.cpp) is n nodes, device k's result,
  // each reading all n operands; it runs as one call, so the first of them that the order
  // reaches schedules all n (make_device_collective gives the others, the live nodes where the
  // graph has them) as one item on the tuple: buffers [out_0 .. out_n-1, in_0 .. in_n-1], its
  // graph device 0's node. The others then find their buffers made.
  std::shared_ptr<Buffer> add_collective(const UOpPtr& u) {
    const size_t n = u->src.size();
    ScheduleItem item;
    item.kind = ScheduleItem::Kind::Collective;
    item.outputs = n;
    std::vector<std::string> devices;
    const bool in_place = reduces_in_place(u);  // Note [all-reduces in place]
    for (size_t k = 0; k < n; k++) {
      UOpPtr result = n == 1 ? u : make_device_collective(u->op, u->src, u->arg_collective(), k);
      auto out = in_place ? input_of(u->src[0].get())
                          : std::make_shared<Buffer>(result->device, result->dtype, prod(result->shape));
      buffers_[result.get()] = out;
      item.buffers.push_back(out);
      devices.push_back(result->device);
      if (k == 0) item.ast = result;
      stages_.push_back(std::move(result));
    }
    for (auto& src : u->src) {
      item.buffers.push_back(input_of(src.get()));
      TG_ASSERT(item.buffers.back(), op_name(u->op), " operand not realized");
    }
    item.device = join_devices(devices);
    items_.push_back(std::move(item));
    return buffers_.at(u.get());
  }

  void add_kernel(const UOpPtr& u, const std::shared_ptr<Buffer>& out) {
    if (u->op == Op::SCATTER_ADD) {  // Note [accumulating stores] in lower.cpp: zeroed, then added into
      lower(lazy::constant(0, u->dtype, u->device, u->shape), out);
      lower(u, out);
      return;
    }
    UOpPtr root = u;
    // Note [split reductions] in split_reduce.cpp
    if (knobs::SPLIT_REDUCE && get_device(u->device).policy().split_reductions) {
      auto is_input = [&](const UOp* n) { return realize_.count(n) > 0 || has_buffer(n); };
      if (auto split = split_reduce(u, is_input)) {
        const UOpPtr& partial = split->partial;
        buffers_[partial.get()] = lower(partial, std::make_shared<Buffer>(u->device, partial->dtype, prod(partial->shape)));
        stages_.push_back(partial);
        root = split->root;
      }
    }
    lower(root, out);
  }

  // Note [template kernels] in codegen/attention_kernel.cpp: the item's graph is the template and
  // its parameters alone; the kernel writes `out` and reads its sources' buffers, in order.
  void add_template_kernel(const UOpPtr& u, const std::shared_ptr<Buffer>& out) {
    ScheduleItem item;
    item.kind = ScheduleItem::Kind::Kernel;
    item.device = u->device;
    item.ast = make_uop(Op::TEMPLATE_KERNEL, u->dtype, {}, u->arg);
    item.buffers = {out};
    for (auto& src : u->src) {
      item.buffers.push_back(input_of(src.get()));
      TG_ASSERT(item.buffers.back(), "template kernel source not realized");
    }
    items_.push_back(std::move(item));
  }

  // Note [kernels with several outputs]
  void add_kernel_with_outputs(const UOpPtr& u, const std::shared_ptr<Buffer>& out, const std::vector<UOpPtr>& others) {
    ScheduleItem item;
    item.kind = ScheduleItem::Kind::Kernel;
    item.device = u->device;
    std::vector<UOpPtr> roots{u};
    item.buffers = {out};
    for (auto& o : others) {
      roots.push_back(o);
      item.buffers.push_back(waiting_.at(o.get()));
      buffers_[o.get()] = waiting_.at(o.get());
    }
    if (prod(u->shape) == 0) return;
    item.outputs = roots.size();
    item.ast = lower_kernel(roots, [this](const UOp* n) { return input_of(n); }, item.buffers);
    items_.push_back(std::move(item));
  }

  // Lowers the kernel that computes `root` into `out` and schedules it; returns `out`.
  std::shared_ptr<Buffer> lower(const UOpPtr& root, std::shared_ptr<Buffer> out) {
    ScheduleItem item;
    item.kind = ScheduleItem::Kind::Kernel;
    item.device = root->device;
    item.buffers = {out};
    item.ast = lower_kernel(root, [this](const UOp* n) { return input_of(n); }, item.buffers);
    items_.push_back(std::move(item));
    return out;
  }
};

}  // namespace

std::vector<ScheduleItem> create_schedule(const std::vector<UOpPtr>& outputs,
                                          std::vector<std::shared_ptr<Buffer>>* output_buffers, KeptBuffers* kept) {
  ScheduleGraph g = graph_to_compute(outputs);
  NodeSet realize = realize_points(g);
  ConcatsInPlace concats = plan_concats_in_place(g, realize);  // Note [concatenations stored in place]
  auto several = kernels_with_several_outputs(g, realize);
  drop_joined_concats(concats, several);
  std::vector<UOpPtr> order = issue_order(g, realize, several);  // Note [gathers one reader ahead]
  ItemMaker maker(g, realize, std::move(several), std::move(concats));
  for (auto& u : order) {
    if (!realize.count(u.get()) || has_buffer(u.get())) continue;
    auto out = maker.add(u);
    if (kept && keeps_its_output(*u) && !g.output_set.count(u.get()) && prod(u->shape) > 0) {
      auto it = g.original_of.find(u.get());
      kept->push_back({it == g.original_of.end() ? u : it->second, out});  // Note [kept convolution outputs]
    }
  }
  if (output_buffers) {
    output_buffers->clear();
    for (auto& o : g.outputs) output_buffers->push_back(maker.input_of(o.get()));
  }
  return reducing_kernels_early(maker.take_items());  // Note [reducing kernels run early]
}

}  // namespace tg
