// The graph a schedule computes (Note [where kernels end] in schedule.cpp): the outputs after
// the scheduler's layout rewrites, the nodes still to compute under them, and who reads each.
// The passes that choose realize points (schedule.cpp, rounded_values.cpp) read it; none changes it.
#pragma once
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

class Buffer;

// The node whose buffer u reads without a kernel: u itself when realized or a BUFFER, or the node
// under u's reshapes of a contiguous buffer (and markers whose value is their source's). Null
// where u must be computed.
const UOp* buffer_node(const UOp* u);

// Whether u is a realized node, or a view of one that needs no kernel (buffer_node). The passes
// ask this of every node they visit; only the items take the buffer (existing_buffer).
bool has_buffer(const UOp* u);

// The buffer u reads without a kernel, or null (buffer_node).
std::shared_ptr<Buffer> existing_buffer(const UOp* u);

using NodeSet = std::unordered_set<const UOp*>;

// Each node -> the nodes still to compute that read its value (value_src_count), in the order of
// the graph: what the passes walk up through. Built once per schedule (Note [one readers map] in
// graph.cpp).
using Readers = std::unordered_map<const UOp*, std::vector<const UOp*>>;

// The graph a schedule computes: its outputs, after the scheduler's layout rewrites, and the
// nodes still to compute under them, sources first.
struct ScheduleGraph {
  std::vector<UOpPtr> outputs;
  std::vector<UOpPtr> order;
  NodeSet output_set;
  std::unordered_map<const UOp*, UOpPtr> original_of;  // a rewritten node -> the caller's
  Readers readers;
};

// The nodes still to compute that read u's value (empty for none).
const std::vector<const UOp*>& readers_of(const ScheduleGraph& g, const UOp* u);

// The graph that computing `outputs` needs, after Note [padded B rows] (padded_rows.cpp).
ScheduleGraph graph_to_compute(const std::vector<UOpPtr>& outputs);

}  // namespace tg
