// Schedule execution: each kernel compiled once (the kernel pipeline, codegen/pipeline.h, makes
// its source; the cache keeps the program) and launched, copies and collectives run in order.
#include "tinygrad/engine/realize.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

GlobalCounters& GlobalCounters::get() {
  static GlobalCounters c;
  return c;
}
void GlobalCounters::reset() { get() = GlobalCounters(); }

namespace {

struct CollectiveRunners {
  std::mutex mu;
  int64_t next_id = 1;
  std::unordered_map<int64_t, CollectiveRunner*> by_group;
};
CollectiveRunners& collective_runners() {
  static CollectiveRunners r;
  return r;
}

CollectiveRunner& runner_of(const ScheduleItem& item) {
  int64_t group = item.ast->arg_collective().group;
  auto& rs = collective_runners();
  std::lock_guard<std::mutex> lock(rs.mu);
  auto it = rs.by_group.find(group);
  TG_CHECK(it != rs.by_group.end(), op_name(item.ast->op), ": collective group ", group,
           " has no runner (the distributed engine that served it is gone, or none was created)");
  return *it->second;
}

// Hands each group's runner the collective items of a list (CollectiveRunner::check_sequence).
template <class Items, class ItemOf>
void check_collective_sequences(const Items& items, ItemOf item_of) {
  std::map<int64_t, std::vector<const ScheduleItem*>> by_group;
  for (const auto& e : items) {
    const ScheduleItem& item = item_of(e);
    if (item.kind == ScheduleItem::Kind::Collective) by_group[item.ast->arg_collective().group].push_back(&item);
  }
  for (auto& [group, list] : by_group) runner_of(*list.front()).check_sequence(list);
}

struct CompiledKernel {
  KernelLaunch launch;
  std::string source;
  KernelChoice choice;
};

thread_local ExecRecorder* exec_recorder = nullptr;

// Kernel graphs are hash-consed, so the same kernel in a later step is the same node: the
// cache keeps the key alive and maps it to its compiled program.
using CompiledKernels = std::unordered_map<const UOp*, std::pair<UOpPtr, CompiledKernel>>;
struct KernelCache {
  std::mutex mu;
  std::unordered_map<std::string, CompiledKernels> by_key;  // entries are never removed
};
KernelCache& kernel_cache() {
  static KernelCache* c = new KernelCache();
  return *c;
}

// Compiles what the kernel pipeline made of item (Note [the pass list] in codegen/pipeline.cpp):
// the device library's program, or the rendered source through the device compiler.
CompiledKernel compile_kernel(const ScheduleItem& item, Device& dev) {
  LoweredKernel k = lower_kernel_item(item, dev);
  if (k.choice.kind == KernelChoice::Kind::Library) {
    Program* prog = dev.get_matmul_program(*k.choice.matmul);
    TG_ASSERT(prog, "the library refused a product it was chosen for: ", k.choice.matmul->key());
    return CompiledKernel{KernelLaunch{prog, k.choice.matmul->name(), {}, {}}, "", k.choice};
  }
  Program& prog = dev.get_program(k.kernel.name, k.source);
  return CompiledKernel{KernelLaunch{&prog, k.kernel.name, k.kernel.global_size, k.kernel.local_size},
                        std::move(k.source), k.choice};
}

// The cache's kernels for a device under the current knobs: its first key is the device and every
// knob that changes generated code (Note [one kernel-cache key] in knobs.h). That text is long and
// the same for every kernel of a step, so each thread keeps the last key's map until the device or a
// knob changes. The caller holds cache.mu.
CompiledKernels& kernels_for(KernelCache& cache, const std::string& device) {
  thread_local uint64_t generation = 0;
  thread_local std::string last_device;
  thread_local CompiledKernels* last = nullptr;
  const uint64_t now = knob_generation();
  if (!last || generation != now || device != last_device) {
    last = &cache.by_key[device + " " + codegen_key()];
    last_device = device;
    generation = now;
  }
  return *last;
}

const CompiledKernel& compiled(const ScheduleItem& item) {
  auto& cache = kernel_cache();
  CompiledKernels* kernels = nullptr;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    kernels = &kernels_for(cache, item.device);
    if (auto it = kernels->find(item.ast.get()); it != kernels->end()) return it->second.second;
  }
  trace::Span span("compile", "compile");
  CompiledKernel ck = compile_kernel(item, get_device(item.device));
  if (trace::enabled()) span.rename("compile " + ck.launch.name);
  std::lock_guard<std::mutex> lock(cache.mu);
  auto& slot = (*kernels)[item.ast.get()];
  slot = {item.ast, std::move(ck)};
  return slot.second;
}

// A launched kernel on the timeline: its duration as the device measured it (Note [tracing costs
// nothing when off] in trace.h).
void trace_kernel(const ScheduleItem& item, const KernelLaunch& ck, double t0_us, std::optional<double> seconds) {
  trace::Event e{ck.name, "kernel", trace::thread_id(), t0_us, seconds ? *seconds * 1e6 : trace::now_us() - t0_us};
  e.args.emplace_back("device", item.device);
  trace::complete(std::move(e));
}

void run_kernel(const ScheduleItem& item, const KernelLaunch& ck) {
  auto& counters = GlobalCounters::get();
  std::vector<void*> ptrs;
  ptrs.reserve(item.buffers.size());
  for (auto& b : item.buffers) ptrs.push_back(b->ensure_allocated());
  const bool traced = trace::enabled();
  const double t0_us = traced ? trace::now_us() : 0;
  auto t = ck.program->launch(ptrs, ck.global_size, ck.local_size, knobs::DEBUG >= 2 || traced);
  if (traced) trace_kernel(item, ck, t0_us, t);
  counters.kernels_run++;
  if (knobs::DEBUG >= 2) {
    auto st = get_device(item.device).pool().stats();
    counters.kernel_seconds += t.value_or(0);
    std::fprintf(stderr, "*** %-6s %4llu %-40s %9.3f ms   mem in use %8.2f MB (peak %.2f MB, cached %.2f MB, reuse %llu/%llu)\n",
                 item.device.c_str(), static_cast<unsigned long long>(counters.kernels_run), ck.name.c_str(),
                 t.value_or(0) * 1e3, st.bytes_in_use / 1e6, st.peak_bytes / 1e6, st.bytes_cached / 1e6,
                 static_cast<unsigned long long>(st.reuse_hits), static_cast<unsigned long long>(st.allocations));
  } else if (knobs::DEBUG >= 1) {
    std::fprintf(stderr, "*** %-6s %4llu %s\n", item.device.c_str(), static_cast<unsigned long long>(counters.kernels_run),
                 ck.name.c_str());
  }
}

}  // namespace

CopyKind copy_buffer(Buffer& dst, const Buffer& src) {
  const CopyKind kind = copy_kind(src.device(), dst.device());
  if (kind != CopyKind::ThroughHost) {
    dst.copy_from(src);
    return kind;
  }
  std::vector<uint8_t> host(src.nbytes());
  src.copy_out(host.data(), host.size());
  dst.copy_in(host.data(), host.size());
  return kind;
}

namespace {

CopyKind copy_bytes(const ScheduleItem& item) { return copy_buffer(*item.buffers[0], *item.buffers[1]); }

void run_copy(const ScheduleItem& item) {
  trace::Span span("copy", "copy");
  const CopyKind kind = copy_bytes(item);
  span.arg("kind", copy_kind_name(kind));
  auto& counters = GlobalCounters::get();
  counters.copies++;
  counters.device_copies += kind != CopyKind::ThroughHost;
  if (knobs::DEBUG >= 1) {
    const std::string& src = item.buffers[1]->device();
    const std::string& dst = item.buffers[0]->device();
    std::fprintf(stderr, "*** copy %s -> %s, %zu bytes, %s\n", src.c_str(), dst.c_str(), item.buffers[0]->nbytes(),
                 describe_copy(src, dst).c_str());
  }
}

// Collectives still running (see CollectiveRunner): an item waits for those whose buffers it uses.
// They hold their buffers: run_schedule lets go of an item's buffers once it has run.
struct PendingCollectives {
  std::vector<std::pair<std::vector<std::shared_ptr<Buffer>>, CollectiveWait>> running;
  void add(const ScheduleItem& item, CollectiveWait w) {
    if (!w) return;
    running.emplace_back(item.buffers, std::move(w));
  }
  void wait_for(const ScheduleItem& item) {
    for (size_t i = 0; i < running.size();) {
      bool uses = false;
      for (auto& b : item.buffers)
        for (auto& c : running[i].first) uses = uses || b == c;
      if (!uses) { i++; continue; }
      auto w = std::move(running[i].second);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      w();
    }
  }
  void wait_all() {
    while (!running.empty()) {
      auto w = std::move(running.front().second);
      running.erase(running.begin());
      w();
    }
  }
};

}  // namespace

int64_t register_collective_runner(CollectiveRunner* runner) {
  TG_ASSERT(runner, "register_collective_runner: null runner");
  auto& rs = collective_runners();
  std::lock_guard<std::mutex> lock(rs.mu);
  int64_t id = rs.next_id++;
  rs.by_group[id] = runner;
  return id;
}

void unregister_collective_runner(int64_t group) {
  auto& rs = collective_runners();
  std::lock_guard<std::mutex> lock(rs.mu);
  rs.by_group.erase(group);
}

namespace {

void run_item(const ScheduleItem& item, const KernelLaunch* launch, PendingCollectives& pending) {
  pending.wait_for(item);
  switch (item.kind) {
    case ScheduleItem::Kind::Kernel: run_kernel(item, *launch); break;
    case ScheduleItem::Kind::Copy: run_copy(item); break;
    case ScheduleItem::Kind::Collective:
      pending.add(item, runner_of(item).start(item));
      GlobalCounters::get().collectives++;
      break;
  }
}

}  // namespace

ExecRecorder* set_exec_recorder(ExecRecorder* recorder) {
  std::swap(exec_recorder, recorder);
  return recorder;
}

// Note [intermediates die after their last reader]: each item holds its own references to the
// buffers it touches, and an intermediate (a realize point inside the graph: no tensor holds
// it) has no other owner. So once an item has run, its references are dropped; a buffer whose
// last reader that was goes back to the pool, where a later kernel of the same schedule takes
// its memory. Without this a schedule held all of its intermediates until its end: a forward
// pass at batch 1000 grew to the sum of its activations.
void run_schedule(std::vector<ScheduleItem> schedule) {
  auto& counters = GlobalCounters::get();
  for (auto& item : schedule)
    if (item.kind == ScheduleItem::Kind::Kernel) counters.kernels_scheduled++;
  if (knobs::DEBUG >= 1 && !schedule.empty())
    std::fprintf(stderr, "scheduled %zu items\n", schedule.size());
  check_collective_sequences(schedule, [](const ScheduleItem& i) -> const ScheduleItem& { return i; });
  PendingCollectives pending;
  for (auto& item : schedule) {
    const KernelLaunch* launch = item.kind == ScheduleItem::Kind::Kernel ? &compiled(item).launch : nullptr;
    if (exec_recorder) (*exec_recorder)(ExecItem{item, launch ? *launch : KernelLaunch{}});
    run_item(item, launch, pending);
    item.buffers.clear();
  }
  pending.wait_all();
}

KernelLaunch kernel_launch(const ScheduleItem& item) { return compiled(item).launch; }

void run_exec_items(const std::vector<ExecItem>& items) {
  check_collective_sequences(items, [](const ExecItem& e) -> const ScheduleItem& { return e.item; });
  PendingCollectives pending;
  for (auto& e : items) run_item(e.item, &e.launch, pending);
  pending.wait_all();
}

void check_collectives(const std::vector<ExecItem>& items) {
  check_collective_sequences(items, [](const ExecItem& e) -> const ScheduleItem& { return e.item; });
}

void record_exec_items(const std::vector<ExecItem>& items, const std::function<void(const ExecItem&)>& launch) {
  PendingCollectives pending;
  for (auto& e : items) {
    pending.wait_for(e.item);
    if (e.item.kind == ScheduleItem::Kind::Collective) pending.add(e.item, runner_of(e.item).start(e.item));
    else if (e.item.kind == ScheduleItem::Kind::Copy) copy_bytes(e.item);
    else launch(e);
  }
  pending.wait_all();
}

}  // namespace tg
