// TinyJit replays on CUDA as CUDA graphs: one graph launch per replayed step instead of one
// launch per kernel (Note [CUDA graphs for replays]).
#include "tinygrad/runtime/cuda_graph.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/ops.h"
#include "tinygrad/runtime/cuda_context.h"

namespace tg::cuda {

namespace {

// Note [CUDA graphs for replays]: a graph is made by stream capture: between cuStreamBeginCapture
// and cuStreamEndCapture (relaxed mode) each item's program is launched on the device's stream as
// usual, and the driver records what is queued instead of running it, so a program that queues
// more than one kernel (a library call) is recorded whole. An instantiated graph (CUgraphExec)
// holds the buffer addresses it was captured with, and a replay binds new input and fresh
// buffers. So each capture keeps up to CUDA_GRAPH instances, each with the addresses of all its
// items' buffers: a replay whose addresses match one launches it as it is. The memory pool hands
// the same blocks back in a steady loop (parameters updated out of place alternate between two
// sets), so after the first replays each one finds its instance. A replay that finds none
// captures again and, while there is room, instantiates the capture; else it updates the least
// recently used instance from it (cuGraphExecUpdate, which keeps the instance's launch setup and
// only rewrites node parameters), and instantiates anew if the driver refuses the update.
// Updating single kernel nodes (cuGraphExecKernelNodeSetParams) would need to know which node
// came from which item, which stream capture of library calls does not tell; the update from a
// fresh capture covers every kind of node. DEBUG=1 prints each graph launch with what it cost.
//
// Collectives are recorded too (Note [collectives on a device's streams] in distributed/
// collective_runner.cpp): their runner forks onto the communication stream and joins back with
// events, which the capture turns into graph edges, so a replayed step is one launch with its
// NCCL work inside. The ranks' collective sequences are compared before the first capture
// (check_collectives), outside capture mode. A graph that holds collectives is instantiated anew
// when the addresses change, never updated in place: NCCL's captured kernels carry state of
// their own that an update does not rewrite.
//
// Copies on the devices are recorded too (Note [copies between devices] in device.cpp): one
// between two buffers of the GPU, or from another GPU of the process (a peer copy: a tensor of
// CUDA:1 that the step reads on CUDA). A peer copy reads memory that the other GPU's stream
// writes and frees, and a capture cannot wait on a stream outside it, so the launch makes the
// waits the copy makes when it runs alone (Note [peer copies between GPUs] in cuda.cpp): the
// graph's stream waits for the work queued on each source GPU, and each source GPU's stream
// waits for the graph.
//
// What is not graphed: a list with copies through host memory, or items on more than one
// device: the factory declines and replays go item by item (DEBUG=1 says why). A
// capture the driver rejects (a program queued work that cannot be captured) is reported at
// DEBUG=1 and that capture replays item by item from then on. At DEBUG>=2 replays go item by item
// too, so that each kernel's GPU time is measured.
class CudaGraph : public ExecGraph {
 public:
  CudaGraph(const Context& c, size_t max_instances, size_t kernels, size_t copies, size_t collectives,
            std::vector<std::string> peers)
      : c_(c),
        max_instances_(max_instances),
        kernels_(kernels),
        copies_(copies),
        collectives_(collectives),
        peers_(std::move(peers)) {}
  ~CudaGraph() override {
    for (auto& i : instances_) driver().cuGraphExecDestroy(i.exec);  // nothing to report at teardown
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void run(const std::vector<ExecItem>& items) override {
    if (!broken_.empty() || knobs::DEBUG >= 2) return run_exec_items(items);
    if (collectives_) check_collectives(items);
    std::vector<void*> addrs;
    for (auto& e : items)
      for (auto& b : e.item.buffers) addrs.push_back(b->ensure_allocated());
    Instance* inst = find(addrs);
    std::string how = "cached";
    if (!inst) {
      auto t0 = std::chrono::steady_clock::now();
      CUgraph graph = nullptr;
      try {
        graph = capture(items);
      } catch (const Error& e) {
        broken_ = e.what();
        if (knobs::DEBUG >= 1)
          std::fprintf(stderr, "*** %s graph: capture failed (%s); replaying kernel by kernel\n",
                       c_.name.c_str(), broken_.c_str());
        return run_exec_items(items);
      }
      struct Destroy {
        CUgraph g;
        ~Destroy() { driver().cuGraphDestroy(g); }
      } destroy{graph};
      inst = slot_for_new();
      how = "instantiated";
      if (inst->exec && collectives_) {  // never updated in place (see the Note)
        driver().cuGraphExecDestroy(inst->exec);
        inst->exec = nullptr;
      } else if (inst->exec) {
        CUgraphExecUpdateResultInfo info{};
        if (driver().cuGraphExecUpdate(inst->exec, graph, &info) == CUDA_SUCCESS) {
          how = "updated";
        } else {
          driver().cuGraphExecDestroy(inst->exec);
          inst->exec = nullptr;
        }
      }
      if (!inst->exec) TG_CU(where(), cuGraphInstantiate, &inst->exec, graph, 0);
      inst->addrs = std::move(addrs);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      char buf[64];
      std::snprintf(buf, sizeof(buf), "captured and %s in %.3f ms", how.c_str(), ms);
      how = buf;
    }
    inst->last_used = ++clock_;
    launch_joined(inst->exec);
    auto& counters = GlobalCounters::get();
    counters.kernels_run += kernels_;
    counters.copies += copies_;
    counters.device_copies += copies_;
    counters.collectives += collectives_;
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "*** %-6s graph of %zu kernels and %zu collectives%s (%s)\n", c_.name.c_str(), kernels_,
                   collectives_, copies_ ? (", " + std::to_string(copies_) + " copies on the devices").c_str() : "",
                   how.c_str());
  }

 private:
  struct Instance {
    std::vector<void*> addrs;  // every item's buffers, in order
    CUgraphExec exec = nullptr;
    uint64_t last_used = 0;
  };

  std::string where() const {
    return "device " + c_.name + ", graph of " + std::to_string(kernels_) + " kernels";
  }

  // The launch, after the work queued on the GPUs its peer copies read, and before their later
  // work (see the Note).
  void launch_joined(CUgraphExec exec) {
    Device& self = get_device(c_.name);
    for (auto& p : peers_) self.wait_event(StreamKind::Compute, *get_device(p).record_event(StreamKind::Compute));
    c_.current();
    TG_CU(where(), cuGraphLaunch, exec, c_.stream);
    for (auto& p : peers_) get_device(p).wait_event(StreamKind::Compute, *self.record_event(StreamKind::Compute));
  }

  Instance* find(const std::vector<void*>& addrs) {
    for (auto& i : instances_)
      if (i.addrs == addrs) return &i;
    return nullptr;
  }
  Instance* slot_for_new() {
    if (instances_.size() < max_instances_) return &instances_.emplace_back();
    Instance* lru = &instances_[0];
    for (auto& i : instances_)
      if (i.last_used < lru->last_used) lru = &i;
    return lru;
  }

  CUgraph capture(const std::vector<ExecItem>& items) {
    c_.current();
    TG_CU(where(), cuStreamBeginCapture, c_.stream, CU_STREAM_CAPTURE_MODE_RELAXED);
    try {
      std::vector<void*> ptrs;
      record_exec_items(items, [&](const ExecItem& e) {
        ptrs.clear();
        for (auto& b : e.item.buffers) ptrs.push_back(b->ptr());
        e.launch.program->launch(ptrs, e.launch.global_size, e.launch.local_size, false);
      });
    } catch (...) {
      CUgraph partial = nullptr;
      driver().cuStreamEndCapture(c_.stream,
                                  &partial);  // leaves capture mode; the launch error is what matters
      if (partial) driver().cuGraphDestroy(partial);
      throw;
    }
    CUgraph graph = nullptr;
    TG_CU(where(), cuStreamEndCapture, c_.stream, &graph);
    return graph;
  }

  const Context& c_;
  size_t max_instances_;
  size_t kernels_, copies_, collectives_;
  std::vector<std::string> peers_;  // the other GPUs its copies read
  std::vector<Instance> instances_;
  uint64_t clock_ = 0;
  std::string broken_;  // why capturing failed; replays then go item by item
};

// Why a captured list cannot be one graph, or "". The list's rebound buffers are null here
// (Note [device graphs]): a copy's source device comes from its graph node.
std::string not_graphable(const std::vector<ExecItem>& items) {
  for (auto& e : items) {
    if (e.item.kind == ScheduleItem::Kind::Copy &&
        copy_kind(e.item.ast->src[0]->device, e.item.device) == CopyKind::ThroughHost)
      return "it copies " + e.item.ast->src[0]->device + " -> " + e.item.device + " through the host";
    if (e.item.device != items[0].item.device)
      return "it runs on " + items[0].item.device + " and " + e.item.device;
  }
  return "";
}

// The other GPUs whose memory the list's copies read, each once.
std::vector<std::string> peer_sources(const std::vector<ExecItem>& items) {
  std::vector<std::string> out;
  for (auto& e : items) {
    if (e.item.kind != ScheduleItem::Kind::Copy) continue;
    const std::string src = canonical_device(e.item.ast->src[0]->device);
    if (src != canonical_device(e.item.device) && std::find(out.begin(), out.end(), src) == out.end())
      out.push_back(src);
  }
  return out;
}

}  // namespace

void register_cuda_graphs() {
  register_graph_factory("CUDA", [](const std::vector<ExecItem>& items) -> std::unique_ptr<ExecGraph> {
    int instances = knobs::CUDA_GRAPH.get();
    if (instances <= 0 || items.empty()) return nullptr;
    if (std::string why = not_graphable(items); !why.empty()) {
      if (knobs::DEBUG >= 1)
        std::fprintf(stderr, "*** CUDA graph: not used for this capture: %s\n", why.c_str());
      return nullptr;
    }
    size_t copies = 0, collectives = 0;
    for (auto& e : items) {
      copies += e.item.kind == ScheduleItem::Kind::Copy;
      collectives += e.item.kind == ScheduleItem::Kind::Collective;
    }
    return std::make_unique<CudaGraph>(context_of(items[0].item.device), static_cast<size_t>(instances),
                                       items.size() - copies - collectives, copies, collectives, peer_sources(items));
  });
}

}  // namespace tg::cuda
