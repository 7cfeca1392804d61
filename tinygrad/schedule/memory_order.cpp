// Reducing kernels moved forward in a schedule (see memory_order.h).
//
// Note [reducing kernels run early]: create_schedule emits realize points in the order of a walk
// from the outputs, and a training step's outputs are its gradients in parameter order. The walk
// for the first parameter's gradient (GPT-2's token embedding, tied to the output projection)
// runs the whole backward pass down to the embedding, and every later parameter's weight gradient
// (x^T dy) and bias gradient (a column sum of dy) comes after it, in parameter order: the first
// layer's first. So each layer's activations and output gradients stayed alive until the end of
// the backward pass, where the weight gradients finally read them (the schedule of a GPT-2 124M
// step at batch 16 x 1024 kept 12.4 GB of intermediates alive at its peak). Here a kernel that
// writes at most a quarter of the bytes it reads (a weight or bias gradient, a row statistic)
// runs as soon as the items it depends on have run, so the buffers it is the last reader of die
// right after it; that schedule's peak becomes 9.7 GB. The other items keep their order.
//
// Dependencies are those of the buffers' bytes (a view is its bytes of its base): an item reading
// bytes comes after the items that wrote them before, an item writing bytes after the items that
// read or wrote them before (writes in place: an optimizer's assignments, all-reduces in place).
// Kernels writing disjoint parts of one buffer do not order each other: the gradients that
// backward stores into a data-parallel bucket (Note [concatenations stored in place]) move as
// freely as those in buffers of their own.
// Copies and collectives are fences: nothing moves across one, so what overlaps communication
// (Note [gathers one reader ahead]) and the order of collectives between ranks are as before. A
// moved kernel's own output lives longer, but it is a quarter of its inputs at most, and a
// gradient is a step's output that lives to the end anyway. Kahn's algorithm over the items: a
// ready reducing kernel goes first, else the first ready item in the original order, so with no
// reducing kernel to move the order is unchanged.
#include "tinygrad/schedule/memory_order.h"

#include <algorithm>
#include <optional>
#include <set>
#include <unordered_map>

#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg {

namespace {

constexpr size_t REDUCING_FACTOR = 4;  // a reducing kernel reads at least this many times what it writes

// The bytes of memory a buffer is: its base's (a view's base, through views of views) from
// `begin` to `end`.
struct Memory {
  const Buffer* base;
  size_t begin, end;
};

Memory memory_of(const Buffer* b) {
  size_t offset = 0;
  const size_t bytes = b->nbytes();
  for (; b->view_base(); b = b->view_base().get()) offset += b->view_offset();
  return {b, offset, offset + bytes};
}

bool is_reducing_kernel(const ScheduleItem& item) {
  if (item.kind != ScheduleItem::Kind::Kernel) return false;
  size_t written = 0, read = 0;
  for (size_t i = 0; i < item.buffers.size(); i++) (i < item.outputs ? written : read) += item.buffers[i]->nbytes();
  return written * REDUCING_FACTOR <= read;
}

// The items' dependency graph: for each item, the items that must run after it, and how many
// items each must wait for.
struct Dependencies {
  std::vector<std::vector<size_t>> after;
  std::vector<size_t> waits;
  explicit Dependencies(size_t n) : after(n), waits(n, 0) {}
  void add(size_t first, size_t then) {
    if (first == then) return;  // an item that reads and writes one buffer (in place)
    after[first].push_back(then);
    waits[then]++;
  }
};

// The accesses to one base buffer since the last write that covered all of them.
struct Access {
  size_t item, begin, end;
  bool write;
  bool overlaps(const Memory& m) const { return begin < m.end && m.begin < end; }
};

// An item reading memory m comes after the writes that overlap it; an item writing m after every
// access that overlaps it. A write drops the accesses it covers: later items that overlap them
// overlap the write, which comes after them.
void add_access(Dependencies& deps, std::vector<Access>& accesses, size_t item, const Memory& m, bool write) {
  for (const Access& a : accesses)
    if ((write || a.write) && a.overlaps(m)) deps.add(a.item, item);
  if (write)
    accesses.erase(std::remove_if(accesses.begin(), accesses.end(),
                                  [&](const Access& a) { return m.begin <= a.begin && a.end <= m.end; }),
                   accesses.end());
  accesses.push_back({item, m.begin, m.end, write});
}

Dependencies dependencies(const std::vector<ScheduleItem>& items) {
  Dependencies deps(items.size());
  std::unordered_map<const Buffer*, std::vector<Access>> accesses;  // by base buffer
  std::vector<size_t> since_fence;
  std::optional<size_t> fence;
  for (size_t i = 0; i < items.size(); i++) {
    const ScheduleItem& item = items[i];
    const bool is_fence = item.kind != ScheduleItem::Kind::Kernel;
    if (is_fence) {
      for (size_t j : since_fence) deps.add(j, i);
      since_fence.clear();
    } else if (fence) {
      deps.add(*fence, i);
    }
    for (size_t b = 0; b < item.buffers.size(); b++) {
      const Memory m = memory_of(item.buffers[b].get());
      add_access(deps, accesses[m.base], i, m, b < item.outputs);
    }
    if (is_fence) fence = i;
    else since_fence.push_back(i);
  }
  return deps;
}

}  // namespace

std::vector<ScheduleItem> reducing_kernels_early(std::vector<ScheduleItem> items) {
  std::vector<bool> reducing(items.size());
  for (size_t i = 0; i < items.size(); i++) reducing[i] = is_reducing_kernel(items[i]);
  if (std::none_of(reducing.begin(), reducing.end(), [](bool r) { return r; })) return items;  // nothing to move
  Dependencies deps = dependencies(items);
  std::set<size_t> ready_reducing, ready_other;  // by position in the original order
  auto make_ready = [&](size_t i) { (reducing[i] ? ready_reducing : ready_other).insert(i); };
  for (size_t i = 0; i < items.size(); i++)
    if (deps.waits[i] == 0) make_ready(i);
  std::vector<ScheduleItem> out;
  out.reserve(items.size());
  while (!ready_reducing.empty() || !ready_other.empty()) {
    std::set<size_t>& from = ready_reducing.empty() ? ready_other : ready_reducing;
    size_t i = *from.begin();
    from.erase(from.begin());
    out.push_back(std::move(items[i]));
    for (size_t next : deps.after[i])
      if (--deps.waits[next] == 0) make_ready(next);
  }
  TG_ASSERT(out.size() == items.size(), "schedule order: ", items.size() - out.size(), " items wait on a cycle");
  return out;
}

}  // namespace tg
