// Realize points for elementwise chains that several kernels read (see shared_chains.h).
//
// Note [shared elementwise chains]: an elementwise node is recomputed inline by each kernel that
// reads it (Note [where kernels end] in schedule.cpp). That is free for a short chain, but a
// transformer's residual stream is a chain that grows by a layer's outputs at every block
// (x' = x + proj(attn(ln(x))) + bias, then the MLP's), and each LayerNorm's statistics, its
// normalized output and the next residual are separate kernels that read it: computed inline,
// the last layers' kernels reloaded every earlier layer's outputs, and a 12-layer model moved
// memory quadratic in its depth (GPT-2's LayerNorm statistics 0.3 ms each instead of a few
// microseconds; the backward pass's gradient sums likewise). So a node is computed once into a
// buffer when that moves less memory than its inline copies: with k kernels reading a node whose
// inline form loads L full-size inputs, inline costs k·L loads and a buffer L loads, one store
// and k loads, fewer when (k - 1)(L - 1) > 2 (two readers of at least four inputs, three of
// three, four of two).
//
// The nodes are visited consumers first, so each node's readers are settled when it is: a node
// realized here is one kernel for the nodes under it. L is counted with the realize points made
// before this pass (an upper bound: nodes under it may be realized after it), so a chain whose
// top qualifies is cut at every node that several kernels read, which for the residual stream
// is every residual, as eager frameworks store them. An input counts when it holds at least
// 1/FULL_SIZE_FRACTION of the node's elements or LARGE_INPUT elements (a bias broadcast over the
// rows stays in cache; an embedding table that a gather reads does not). Left inline are nodes of
// fewer than LARGE_INPUT elements (recomputing them costs less than a kernel launch, so a graph
// without larger ones skips the pass) and nodes whose inline form holds a reduce that is not a
// realize point (Note [row fusion]: such a reduce belongs to one kernel by construction). Readers
// that may become one kernel with several outputs (elementwise, of the node's shape) count as
// one. Once the pass has cut the chain, L is counted again for each node it realized, with every
// realize point below it: a node that then loads at most one full-size input (a LayerNorm's x -
// mean and its normalized x, once the residual x below them is a buffer) is left inline after all,
// since its readers load that one input either way; un-realizing such a node never raises another
// node's count. In GPT-2's forward pass that leaves a LayerNorm three kernels (mean, variance,
// output) that read the residual instead of five that also wrote x - mean and the normalized x in
// float32, and the backward pass recomputes those from the residual. SHARED_CHAINS=0 turns the
// rule off.
#include "tinygrad/schedule/shared_chains.h"

#include <algorithm>
#include <unordered_map>

#include "tinygrad/knobs.h"

namespace tg {

namespace {

constexpr size_t MAX_TRACKED = 16;        // distinct kernels or inputs tracked per node
constexpr int64_t FULL_SIZE_FRACTION = 8;
constexpr int64_t LARGE_INPUT = 1 << 16;  // elements: an input this large is not one cache's worth

// A set of at most MAX_TRACKED pointers (enough to tell whether a count passes a threshold).
struct SmallSet {
  std::vector<const UOp*> items;
  void add(const UOp* u) {
    if (items.size() < MAX_TRACKED && std::find(items.begin(), items.end(), u) == items.end()) items.push_back(u);
  }
  void add_all(const SmallSet& o) {
    for (const UOp* u : o.items) add(u);
  }
};

// What each node's inline form reads: the inputs it loads, and whether it holds a reduce.
struct InlineReads {
  std::unordered_map<const UOp*, SmallSet> inputs;
  std::unordered_set<const UOp*> holds_reduce;
};

InlineReads inline_reads(const std::vector<UOpPtr>& order, const std::unordered_set<const UOp*>& realize,
                         const std::function<bool(const UOp*)>& is_resident) {
  InlineReads r;
  for (auto& u : order) {
    SmallSet& in = r.inputs[u.get()];
    for (size_t i = 0; i < value_src_count(*u); i++) {
      const UOp* s = u->src[i].get();
      if (is_resident(s) || realize.count(s)) {
        in.add(s);
        continue;
      }
      if (auto it = r.inputs.find(s); it != r.inputs.end()) in.add_all(it->second);
      if (s->op == Op::REDUCE_AXIS || r.holds_reduce.count(s)) r.holds_reduce.insert(u.get());
    }
  }
  return r;
}

int64_t full_size_inputs(const UOp& u, const SmallSet& inputs) {
  const int64_t large = std::min(prod(u.shape) / FULL_SIZE_FRACTION, LARGE_INPUT);
  return std::count_if(inputs.items.begin(), inputs.items.end(), [&](const UOp* s) { return prod(s->shape) >= large; });
}

// How many kernels evaluate u, counting the elementwise ones of u's shape as one: those can
// become one kernel with several outputs (Note [kernels with several outputs] in schedule.cpp:
// an optimizer's p, m and v all read the gradient), which reads u's inputs once.
int64_t separate_kernels(const UOp& u, const SmallSet& kernels, const InlineReads& reads) {
  int64_t separate = 0;
  bool same_shape_elementwise = false;
  for (const UOp* k : kernels.items) {
    if (k->op == Op::REDUCE_AXIS || reads.holds_reduce.count(k) || k->shape != u.shape)
      separate++;
    else
      same_shape_elementwise = true;
  }
  return separate + (same_shape_elementwise ? 1 : 0);
}

bool cheaper_in_a_buffer(int64_t kernels, int64_t loads) { return (kernels - 1) * (loads - 1) > 2; }

}  // namespace

void realize_shared_chains(const std::vector<UOpPtr>& order, std::unordered_set<const UOp*>& realize,
                           const std::function<bool(const UOp*)>& is_resident) {
  auto candidate = [&](const UOp& u) { return is_alu(u.op) && prod(u.shape) >= LARGE_INPUT && !realize.count(&u); };
  if (!knobs::SHARED_CHAINS || std::none_of(order.begin(), order.end(), [&](const UOpPtr& u) { return candidate(*u); }))
    return;
  const InlineReads reads = inline_reads(order, realize, is_resident);
  std::unordered_map<const UOp*, SmallSet> kernels_of;  // the kernels that evaluate each node
  std::vector<const UOp*> realized_here;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const UOp* u = it->get();
    SmallSet own;
    if (realize.count(u)) {
      own.add(u);
    } else {
      own = std::move(kernels_of[u]);
      const int64_t kernels = separate_kernels(*u, own, reads);
      if (kernels > 1 && candidate(*u) && !reads.holds_reduce.count(u) &&
          cheaper_in_a_buffer(kernels, full_size_inputs(*u, reads.inputs.at(u)))) {
        realize.insert(u);
        realized_here.push_back(u);
        own = SmallSet{{u}};
      }
    }
    for (size_t i = 0; i < value_src_count(*u); i++) {
      const UOp* s = u->src[i].get();
      if (!is_resident(s)) kernels_of[s].add_all(own);
    }
  }
  // Note [shared elementwise chains]: what a buffer saves, counted again with every realize point
  if (realized_here.empty()) return;
  const InlineReads final_reads = inline_reads(order, realize, is_resident);
  for (const UOp* u : realized_here)
    if (full_size_inputs(*u, final_reads.inputs.at(u)) <= 1) realize.erase(u);
}

}  // namespace tg
