// The arena of a captured step's intermediates (see jit_arena.h).
//
// Note [sharing fixed intermediates]: a normal step frees each intermediate when its last
// reader is done, so the pool hands its memory to a later one; a capture keeps every fixed
// buffer, which would hold all of a step's intermediates at once. So intermediates whose lives
// (first to last item that uses them) do not overlap share memory. A later item never uses a
// buffer at the item where an earlier one's life ends (a kernel may read one view and write
// another), and a buffer that a collective touches keeps its memory until the collective has been
// waited for: run_exec_items waits for it only before the first later item that touches one of
// its buffer objects (or at the end of the list), and until then it may still run.
//
// Note [one arena for a captured step's intermediates]: where a buffer is an address
// (Feature::AddressableMemory: host memory, CUDA), a device's intermediates are views into one
// allocation, each at an offset where no buffer whose life overlaps its own lies: largest
// first, at the lowest offset that fits. Any two buffers whose lives do not overlap may then
// share memory, whatever their sizes, so the arena comes near the step's peak of live
// intermediates (the CNN step at batch 512 on the CPU: 511 MB held with exact-size sharing,
// a normal step's peak 326 MB). Elsewhere (OpenCL's buffers are handles) buffers of the same
// dtype and size share, taken greedily in order of first use.
#include "tinygrad/engine/jit_arena.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit_in_place.h"

namespace tg {

namespace {

struct Intermediate {
  std::shared_ptr<Buffer> buf;
  size_t first, last;
};

// Where run_exec_items waits for the collective at items[c]: before the first later item that
// touches one of its buffers, or at the end (items.size()).
size_t collective_waited_at(const std::vector<ExecItem>& items, size_t c) {
  const auto& mine = items[c].item.buffers;
  for (size_t j = c + 1; j < items.size(); j++)
    for (auto& b : items[j].item.buffers)
      if (std::find(mine.begin(), mine.end(), b) != mine.end()) return j;
  return items.size();
}

// The fixed intermediates of a captured list, in order of first use (views and their bases left out).
std::vector<Intermediate> intermediates(const std::vector<ExecItem>& items, const std::unordered_set<const Buffer*>& written) {
  std::vector<Intermediate> all;
  std::unordered_map<const Buffer*, size_t> index;
  const std::unordered_set<const Buffer*> aliased = aliased_buffers(items);
  for (size_t i = 0; i < items.size(); i++) {
    const bool collective = items[i].item.kind == ScheduleItem::Kind::Collective;
    const size_t until = collective ? collective_waited_at(items, i) : i;
    for (auto& b : items[i].item.buffers) {
      if (!b || !written.count(b.get()) || b->numel() == 0 || aliased.count(b.get())) continue;
      auto [it, fresh] = index.emplace(b.get(), all.size());
      if (fresh) all.push_back({b, i, i});
      auto& x = all[it->second];
      x.last = std::max(x.last, until);
    }
  }
  return all;
}

bool lives_overlap(const Intermediate& a, const Intermediate& b) { return !(a.last < b.first || b.last < a.first); }

constexpr size_t ARENA_ALIGN = 256;  // bytes: vector loads on the CPU, coalesced access on GPUs

// Note [one arena for a captured step's intermediates]. Returns the arena's size in bytes.
size_t place_in_arena(const std::string& device, std::vector<const Intermediate*> list,
                      std::unordered_map<const Buffer*, std::shared_ptr<Buffer>>& replaced) {
  std::stable_sort(list.begin(), list.end(),
                   [](const Intermediate* a, const Intermediate* b) { return a->buf->nbytes() > b->buf->nbytes(); });
  struct Placed {
    const Intermediate* x;
    size_t begin, end;
  };
  std::vector<Placed> placed;
  size_t total = 0;
  for (auto* x : list) {
    const size_t size = (x->buf->nbytes() + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    std::vector<std::pair<size_t, size_t>> busy;  // address ranges of buffers alive with x
    for (auto& p : placed)
      if (lives_overlap(*p.x, *x)) busy.emplace_back(p.begin, p.end);
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (auto [b, e] : busy) {
      if (at + size <= b) break;
      at = std::max(at, e);
    }
    placed.push_back({x, at, at + size});
    total = std::max(total, at + size);
  }
  auto arena = std::make_shared<Buffer>(device, DType::UInt8, static_cast<int64_t>(total));
  for (auto& p : placed)
    replaced[p.x->buf.get()] = std::make_shared<Buffer>(arena, p.begin, p.x->buf->dtype(), p.x->buf->numel());
  return total;
}

void share_equal_sizes(const std::vector<const Intermediate*>& list,
                       std::unordered_map<const Buffer*, std::shared_ptr<Buffer>>& replaced) {
  struct Owner {
    std::shared_ptr<Buffer> buf;
    size_t last;
  };
  std::map<std::tuple<std::string, DType, int64_t>, std::vector<Owner>> owners;
  for (auto* x : list) {
    auto& same = owners[{x->buf->device(), x->buf->dtype(), x->buf->numel()}];
    Owner* free = nullptr;
    for (auto& o : same)
      if (o.last < x->first) free = &o;
    if (free) {
      replaced.emplace(x->buf.get(), free->buf);
      free->last = x->last;
    } else {
      same.push_back({x->buf, x->last});
    }
  }
}

}  // namespace

size_t share_intermediates(std::vector<ExecItem>& items, const std::unordered_set<const Buffer*>& written) {
  std::vector<Intermediate> all = intermediates(items, written);
  std::map<std::string, std::vector<const Intermediate*>> by_arena;
  std::vector<const Intermediate*> by_size;
  for (auto& x : all)
    if (get_device(x.buf->device()).supports(Feature::AddressableMemory)) by_arena[x.buf->device()].push_back(&x);
    else by_size.push_back(&x);
  std::unordered_map<const Buffer*, std::shared_ptr<Buffer>> replaced;
  size_t arena_bytes = 0;
  for (auto& [device, list] : by_arena) arena_bytes += place_in_arena(device, list, replaced);
  share_equal_sizes(by_size, replaced);
  for (auto& e : items)
    for (auto& b : e.item.buffers)
      if (b)
        if (auto it = replaced.find(b.get()); it != replaced.end()) b = it->second;
  return arena_bytes;
}

}  // namespace tg
