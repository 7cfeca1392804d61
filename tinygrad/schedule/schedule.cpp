// Kernel boundaries and fusion.
//
// Note [where kernels end]: a node is computed into its own buffer ("realize point") when it is
// an output, a REDUCE_AXIS, CONTIGUOUS, COPY (and its source) or a collective. Everything else is
// recomputed inline by each kernel that reads it, so elementwise chains and movement ops never
// cost a kernel or a copy. One exception joins a reduce to the kernel above it: an output or
// CONTIGUOUS node that reaches a REDUCE_AXIS through elementwise ops alone, every node on the way
// read only once, computes that reduce itself ("sum then scale" is one kernel). The way down may
// also pass views that use each element at most once (RESHAPE, PERMUTE, SHRINK, FLIP), never an
// EXPAND, which would recompute the reduce for every copy.
//
// Note [reused reduce inputs]: a computed elementwise node that reaches a REDUCE_AXIS through an
// EXPAND (a matmul's operand: the output gradient times a relu's mask, a softmax's gradient, a
// bias plus a relu) would be recomputed by the reduce's kernel for every copy the EXPAND makes,
// once per column of the product. On devices with host memory such a node expanded at least
// REUSED_INPUT_COPIES times is a realize point of its own: one pass writes it, and the product
// then reads plain loads it can keep in registers. Only the shape of a product counts: a reduce
// of a MUL whose operand is, through casts, reshapes and permutes, such an EXPAND. Sliding
// windows (a convolution's input repeated, then shrunk into windows) stay fused: realizing the
// activations under them cost the CNN run 100 MB of peak memory; so does a row statistic
// expanded inside a reduce (layernorm's mean). (GPU-style devices keep recomputing them.)
//
// Note [kept convolution outputs]: a CUSTOM_GRAD node (a convolution) is a realize point too, and
// its buffer stays with the node after the schedule has run, like an output's. A training step
// runs several schedules over one graph (a BatchNorm realizes its statistics in the middle of the
// forward pass, then the backward pass reads the pre-activations again); without this each of
// them would recompute every convolution it reaches. The cost is one extra pass over the output
// where a bias and activation used to fuse into the convolution's kernel.
#include "tinygrad/schedule/schedule.h"

#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg {

namespace {

bool is_elementwise(const UOp& u) { return is_alu(u.op) || u.op == Op::DETACH || u.op == Op::CUSTOM_GRAD; }
bool is_reordering_view(const UOp& u) { return u.op == Op::RESHAPE || u.op == Op::PERMUTE; }
bool is_injective_view(const UOp& u) {
  return u.op == Op::RESHAPE || u.op == Op::PERMUTE || u.op == Op::SHRINK || u.op == Op::FLIP;
}

// The sources a node's value is computed from: a CUSTOM_GRAD's value is its first source, the
// others are there for its gradient rule only.
size_t value_src_count(const UOp& u) { return u.op == Op::CUSTOM_GRAD ? 1 : u.src.size(); }

// A realized node, or a view of one that needs no kernel: reshapes of a contiguous buffer.
std::shared_ptr<Buffer> existing_buffer(const UOp* u) {
  if (u->realized) return u->realized;
  if (u->op == Op::BUFFER) return u->arg_buffer();
  if (u->op == Op::RESHAPE || u->op == Op::DETACH || u->op == Op::CONTIGUOUS || u->op == Op::CUSTOM_GRAD) {
    if (u->op == Op::CONTIGUOUS && !(u->src[0]->realized || u->src[0]->op == Op::BUFFER)) return nullptr;
    return existing_buffer(u->src[0].get());
  }
  return nullptr;
}

}  // namespace

std::vector<ScheduleItem> create_schedule(const std::vector<UOpPtr>& outputs,
                                          std::vector<std::shared_ptr<Buffer>>* output_buffers, KeptBuffers* kept) {
  // 1. the graph still to compute, and how often each node is read
  auto order = toposort(outputs, [](const UOp& u) { return !existing_buffer(&u); });
  std::unordered_map<const UOp*, int> readers;
  for (auto& u : order) {
    if (existing_buffer(u.get())) continue;
    for (size_t i = 0; i < value_src_count(*u); i++) readers[u->src[i].get()]++;
  }
  std::unordered_set<const UOp*> output_set;
  for (auto& o : outputs) output_set.insert(o.get());

  // 2. realize points
  std::unordered_set<const UOp*> realize;
  for (auto& u : order) {
    if (existing_buffer(u.get())) continue;
    if (output_set.count(u.get()) || u->op == Op::REDUCE_AXIS || u->op == Op::CONTIGUOUS || u->op == Op::COPY ||
        u->op == Op::ALLREDUCE || u->op == Op::CUSTOM_GRAD)
      realize.insert(u.get());
    if (u->op == Op::COPY || u->op == Op::ALLREDUCE)
      if (!existing_buffer(u->src[0].get())) realize.insert(u->src[0].get());
  }

  // Note [reused reduce inputs]
  constexpr int64_t REUSED_INPUT_COPIES = 8;
  for (auto& u : order) {
    if (u->op != Op::REDUCE_AXIS || existing_buffer(u.get()) ||
        !get_device(u->device).supports(Feature::HostMemory))
      continue;
    const UOp* product = u->src[0].get();
    while (product->op == Op::CAST) product = product->src[0].get();
    if (product->op != Op::MUL) continue;
    for (auto& side : product->src) {
      const UOp* n = side.get();
      while ((n->op == Op::CAST || is_reordering_view(*n)) && !existing_buffer(n) && !realize.count(n))
        n = n->src[0].get();
      if (n->op != Op::EXPAND || existing_buffer(n) ||
          prod(n->shape) < REUSED_INPUT_COPIES * prod(n->src[0]->shape))
        continue;
      const UOp* x = n->src[0].get();
      while (is_reordering_view(*x) && !existing_buffer(x) && !realize.count(x)) x = x->src[0].get();
      if (!existing_buffer(x) && !realize.count(x) && is_alu(x->op) && x->op != Op::CAST) realize.insert(x);
    }
  }

  // 3. fuse a single-reader reduce into the elementwise kernel above it
  for (auto& u : order) {
    if (!realize.count(u.get()) || u->op == Op::REDUCE_AXIS || u->op == Op::COPY || u->op == Op::ALLREDUCE) continue;
    std::vector<const UOp*> stack;
    auto push_value_srcs = [&](const UOp& n) {
      for (size_t i = 0; i < value_src_count(n); i++) stack.push_back(n.src[i].get());
    };
    push_value_srcs(*u);
    std::unordered_set<const UOp*> seen;
    while (!stack.empty()) {
      const UOp* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second || existing_buffer(n) || readers[n] != 1) continue;
      if (n->op == Op::REDUCE_AXIS && realize.count(n) && !output_set.count(n)) {
        realize.erase(n);
        break;
      }
      if (realize.count(n) || !(is_elementwise(*n) || is_injective_view(*n))) continue;
      push_value_srcs(*n);
    }
  }

  // 4. buffers and kernels, sources first
  std::unordered_map<const UOp*, std::shared_ptr<Buffer>> buffers;
  auto input_of = [&](const UOp* u) -> std::shared_ptr<Buffer> {
    if (auto b = existing_buffer(u)) return b;
    auto it = buffers.find(u);
    return it == buffers.end() ? nullptr : it->second;
  };
  std::vector<ScheduleItem> items;
  for (auto& u : order) {
    if (!realize.count(u.get()) || existing_buffer(u.get())) continue;
    auto out = std::make_shared<Buffer>(u->device, u->dtype, prod(u->shape));
    ScheduleItem item;
    item.device = u->device;
    if (u->op == Op::COPY || u->op == Op::ALLREDUCE) {
      item.kind = u->op == Op::COPY ? ScheduleItem::Kind::Copy : ScheduleItem::Kind::Collective;
      item.ast = u;
      item.buffers = {out, input_of(u->src[0].get())};
      TG_ASSERT(item.buffers[1], "copy source not realized");
    } else if (prod(u->shape) > 0) {
      item.kind = ScheduleItem::Kind::Kernel;
      item.buffers = {out};
      item.ast = lower_kernel(u, input_of, item.buffers);
    } else {
      buffers[u.get()] = out;
      continue;  // an empty tensor needs no kernel
    }
    buffers[u.get()] = out;
    if (kept && u->op == Op::CUSTOM_GRAD && !output_set.count(u.get())) kept->push_back({u, out});
    items.push_back(std::move(item));
  }
  if (output_buffers) {
    output_buffers->clear();
    for (auto& o : outputs) output_buffers->push_back(input_of(o.get()));
  }
  return items;
}

}  // namespace tg
