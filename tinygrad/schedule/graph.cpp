// The graph a schedule computes (see graph.h).
#include "tinygrad/schedule/graph.h"

#include "tinygrad/device.h"
#include "tinygrad/schedule/padded_rows.h"

namespace tg {

const UOp* buffer_node(const UOp* u) {
  if (u->realized || u->op == Op::BUFFER) return u;
  if (u->op == Op::RESHAPE || u->op == Op::DETACH || u->op == Op::CONTIGUOUS || u->op == Op::CUSTOM_GRAD) {
    if (u->op == Op::CONTIGUOUS && !(u->src[0]->realized || u->src[0]->op == Op::BUFFER)) return nullptr;
    return buffer_node(u->src[0].get());
  }
  return nullptr;
}

bool has_buffer(const UOp* u) { return buffer_node(u) != nullptr; }

std::shared_ptr<Buffer> existing_buffer(const UOp* u) {
  const UOp* b = buffer_node(u);
  if (!b) return nullptr;
  return b->realized ? b->realized : b->arg_buffer();
}

namespace {

// Note [one readers map]: fusing reduces into their readers, row fusion, kernels with several
// outputs and the order of collectives all walk the graph upwards from a node to its readers.
// The graph does not change while they run (only the set of realize points does), so its readers
// are found once, in graph_to_compute, and each pass reads them: a schedule is made on every
// realize, and a map per pass was a good part of a small step's host time.
Readers find_readers(const std::vector<UOpPtr>& order) {
  Readers r;
  r.reserve(order.size());
  for (auto& u : order) {
    if (has_buffer(u.get())) continue;
    for (size_t i = 0; i < value_src_count(*u); i++) r[u->src[i].get()].push_back(u.get());
  }
  return r;
}

}  // namespace

const std::vector<const UOp*>& readers_of(const ScheduleGraph& g, const UOp* u) {
  static const std::vector<const UOp*> none;
  auto it = g.readers.find(u);
  return it == g.readers.end() ? none : it->second;
}

ScheduleGraph graph_to_compute(const std::vector<UOpPtr>& outputs) {
  auto to_compute = [](const UOp& u) { return !has_buffer(&u); };
  ScheduleGraph g{outputs, toposort(outputs, to_compute), {}, {}, {}};
  // Note [padded B rows] in padded_rows.cpp
  if (auto padded = pad_aliasing_rows(outputs, g.order, [](const UOp* u) { return has_buffer(u); })) {
    g.outputs = std::move(padded->outputs);
    g.original_of = std::move(padded->original_of);
    g.order = toposort(g.outputs, to_compute);
  }
  for (auto& o : g.outputs) g.output_set.insert(o.get());
  g.readers = find_readers(g.order);
  return g;
}

}  // namespace tg
