// State tensors updated in place by a captured step's replays (see jit_in_place.h).
//
// Note [state updated in place]: a replay writes each assigned tensor's new value (parameters,
// optimizer moments, BatchNorm statistics) somewhere and points the tensor at it. Into a new
// buffer (Note [recycled fresh buffers] in jit.cpp), every state tensor is held twice, its value
// and the buffer its next value goes to: for GPT-2 124M's parameters and AdamW moments, 1.5 GB
// more at the step's peak. PyTorch's optimizers write in place, and so does a replay here
// wherever that cannot change what the step computes. At capture, a state's update qualifies
// when its new value is written by one kernel that
//   - reads the old value only at the element it writes, for the value it stores there (every
//     load of the old buffer has the index of the store into the new one and feeds that store,
//     so it runs before it; a plain store, no accumulating one),
//   - is the last item of the step to touch the old buffer and the first to touch the new one,
// and the new buffer is not one of the step's outputs, and neither buffer is a view or viewed.
// That kernel's two parameters are merged into one, the new buffer's, and the kernel is compiled
// again: it then reads and writes through one pointer, which every renderer declares as written
// (no noalias or __restrict__ pretends the two differ). The replay binds that parameter to the
// buffer the tensor holds (an in-place slot in jit.cpp), so the tensor keeps its buffer from step
// to step. When something besides the tensor still holds that buffer (a state dict or a detached
// copy taken before the call, a lazy graph over the parameter, a cached result), the replay first
// copies it into a new buffer and updates the copy, so the holders keep the values they saw (copy
// on write). The first call and the capturing one run normally, into new buffers; states over
// several devices, values written by copies or collectives (ZeRO's all-gathered parameters) and
// updates that read other elements of the old value keep new buffers on every replay.
#include "tinygrad/engine/jit_in_place.h"

#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {

bool touches(const ExecItem& e, const Buffer* b) {
  for (auto& x : e.item.buffers)
    if (x.get() == b) return true;
  return false;
}

// The position of b among e's buffers in [from, to), if it is there.
std::optional<size_t> position_of(const ExecItem& e, const Buffer* b, size_t from, size_t to) {
  for (size_t p = from; p < to && p < e.item.buffers.size(); p++)
    if (e.item.buffers[p].get() == b) return p;
  return std::nullopt;
}

bool is_param(const UOpPtr& u, int64_t i) { return u->op == Op::DEFINE_GLOBAL && u->arg_int() == i; }

// The plain STORE into parameter `out` of a kernel graph (a STORE or a SINK of them), or null.
const UOp* plain_store_into(const UOpPtr& ast, int64_t out) {
  auto plain = [&](const UOpPtr& s) {
    return s->op == Op::STORE && s->src.size() == 3 && is_param(s->src[0], out) &&
           std::holds_alternative<std::monostate>(s->arg);
  };
  if (plain(ast)) return ast.get();
  if (ast->op != Op::SINK) return nullptr;
  for (auto& s : ast->src)
    if (plain(s)) return s.get();
  return nullptr;
}

// Whether every use of parameter `in` in the kernel graph is a load at the index of `store`, of
// the dtype it stores, that the stored value is computed from: the load and the store then touch
// the same element, only it, and the load comes first (a load that only another output of the
// kernel reads could be placed after this store).
bool reads_only_the_stored_element(const UOpPtr& ast, const UOp& store, int64_t in) {
  std::unordered_set<const UOp*> feeds_store;
  for (auto& u : toposort({store.src[2]})) feeds_store.insert(u.get());
  for (auto& u : toposort({ast}))
    for (size_t i = 0; i < u->src.size(); i++) {
      if (!is_param(u->src[i], in)) continue;
      if (u->op != Op::LOAD || i != 0 || u->src[1] != store.src[1] || u->src[0]->dtype != store.src[0]->dtype ||
          !feeds_store.count(u.get()))
        return false;
    }
  return true;
}

// The kernel graph with parameter `in` merged into `out` and the parameters after `in` numbered
// one lower.
UOpPtr merge_params(const UOpPtr& ast, int64_t in, int64_t out) {
  std::unordered_map<const UOp*, UOpPtr> from;
  for (auto& u : toposort({ast})) {
    if (u->op != Op::DEFINE_GLOBAL) continue;
    int64_t i = u->arg_int();
    if (i == in) from[u.get()] = make_uop(Op::DEFINE_GLOBAL, u->dtype, {}, Arg{out});
    else if (i > in) from[u.get()] = make_uop(Op::DEFINE_GLOBAL, u->dtype, {}, Arg{i - 1});
  }
  return substitute(ast, from);
}

// Rewrites kernel w to read its input at position `in` from its output at position `out` (the
// two parameters merged into the output's, the input's buffer left out of w's list) when the
// kernel reads that input only at the element it stores (Note [state updated in place]); true
// when it did. The caller recompiles w.
bool read_from_output(ExecItem& w, size_t out, size_t in) {
  const auto out_param = static_cast<int64_t>(out), in_param = static_cast<int64_t>(in);
  const UOp* store = plain_store_into(w.item.ast, out_param);
  if (!store || !reads_only_the_stored_element(w.item.ast, *store, in_param)) return false;
  w.item.ast = merge_params(w.item.ast, in_param, out_param);
  w.item.buffers.erase(w.item.buffers.begin() + static_cast<std::ptrdiff_t>(in));
  return true;
}

// Merges the update's old-value parameter into its new-value one when it qualifies (Note [state
// updated in place]); returns the position of the kernel it rewrote (not compiled yet).
std::optional<size_t> merge_update(std::vector<ExecItem>& items, const StateUpdate& u) {
  const Buffer* before = u.before.get();
  const Buffer* after = u.after.get();
  std::optional<size_t> writer;
  for (size_t i = 0; i < items.size(); i++) {
    if (!position_of(items[i], after, 0, items[i].item.outputs)) continue;
    if (writer) return std::nullopt;  // written twice
    writer = i;
  }
  if (!writer || items[*writer].item.kind != ScheduleItem::Kind::Kernel) return std::nullopt;
  for (size_t i = 0; i < items.size(); i++) {
    if (i < *writer && touches(items[i], after)) return std::nullopt;
    if (i > *writer && touches(items[i], before)) return std::nullopt;
  }
  ExecItem& w = items[*writer];
  auto out = position_of(w, after, 0, w.item.outputs);
  auto in = position_of(w, before, w.item.outputs, w.item.buffers.size());
  if (!in || !read_from_output(w, *out, *in)) return std::nullopt;
  return writer;
}

// Note [intermediates written over a dying input]: an intermediate's last reader often writes one
// of its own size from it element by element (a gradient from the activation it differentiates,
// the cross-entropy's gradient from the logits: 1.6 GB for GPT-2 at 16 x 1024). A captured step
// then keeps both alive at that kernel. Where the kernel reads the dying input only at the element
// it stores (the same test as an update in place), its output is written over the input instead:
// the kernel is rewritten to read and write the input's buffer, and the items after it read that
// buffer where they read the output. Both must be intermediates of the list (written by it, not
// an input, state or output of the step), of one device, dtype and size, neither a view nor
// viewed, and neither touched by a copy or collective. Returns the kernels it rewrote.
std::set<size_t> write_over_dying_inputs(std::vector<ExecItem>& items, const IsIntermediate& is_intermediate) {
  const std::unordered_set<const Buffer*> aliased = aliased_buffers(items);
  std::unordered_map<const Buffer*, size_t> last, writers;
  std::unordered_set<const Buffer*> moved;  // touched by a copy or collective
  for (size_t i = 0; i < items.size(); i++)
    for (size_t p = 0; p < items[i].item.buffers.size(); p++) {
      const Buffer* b = items[i].item.buffers[p].get();
      last[b] = i;
      if (p < items[i].item.outputs) writers[b]++;
      if (items[i].item.kind != ScheduleItem::Kind::Kernel) moved.insert(b);
    }
  auto candidate = [&](const std::shared_ptr<Buffer>& b) {
    return b && !b->view_base() && !aliased.count(b.get()) && !moved.count(b.get()) && is_intermediate(b.get());
  };
  std::set<size_t> rewritten;
  for (size_t i = 0; i < items.size(); i++) {
    ExecItem& w = items[i];
    if (w.item.kind != ScheduleItem::Kind::Kernel) continue;
    for (size_t out = 0; out < w.item.outputs; out++) {
      const std::shared_ptr<Buffer> a = w.item.buffers[out];
      if (!candidate(a) || writers[a.get()] != 1) continue;
      for (size_t in = w.item.outputs; in < w.item.buffers.size(); in++) {
        const std::shared_ptr<Buffer> b = w.item.buffers[in];
        if (!candidate(b) || last[b.get()] != i || b->device() != a->device() || b->dtype() != a->dtype() ||
            b->numel() != a->numel() || b == a || !read_from_output(w, out, in))
          continue;
        w.item.buffers[out] = b;
        for (size_t j = i + 1; j < items.size(); j++)
          for (auto& x : items[j].item.buffers)
            if (x == a) x = b;
        last[b.get()] = last[a.get()];
        rewritten.insert(i);
        break;
      }
    }
  }
  return rewritten;
}

}  // namespace

std::unordered_set<const Buffer*> aliased_buffers(const std::vector<ExecItem>& items) {
  std::unordered_set<const Buffer*> out;
  for (auto& e : items)
    for (auto& b : e.item.buffers)
      for (const Buffer* v = b.get(); v && v->view_base(); v = v->view_base().get()) {
        out.insert(v);
        out.insert(v->view_base().get());
      }
  return out;
}

// Note [dying inputs in a normal run]: a step that is not replayed (the first call of a jitted
// step, JIT=0) frees each intermediate after its last reader, but the kernel that writes an
// output from a dying input still holds both: GPT-2 124M's first step at 16 x 1024 held the
// bfloat16 logits and their gradient, 1.6 GB each, at its peak, 1.65 GB above a replay's. So a
// normal run writes such outputs over their inputs too, under the same conditions.
void write_schedule_over_dying_inputs(std::vector<ScheduleItem>& schedule,
                                      const std::unordered_set<const Buffer*>& outlive) {
  std::vector<ExecItem> items;
  items.reserve(schedule.size());
  for (auto& s : schedule) items.push_back(ExecItem{std::move(s), KernelLaunch{}});
  write_over_dying_inputs(items, [&](const Buffer* b) { return !b->allocated() && !outlive.count(b); });
  for (size_t i = 0; i < items.size(); i++) schedule[i] = std::move(items[i].item);
}

size_t write_intermediates_over_dying_inputs(std::vector<ExecItem>& items, const IsIntermediate& is_intermediate) {
  std::set<size_t> rewritten = write_over_dying_inputs(items, is_intermediate);
  for (size_t w : rewritten) items[w].launch = kernel_launch(items[w].item);
  return rewritten.size();
}

std::unordered_set<const Buffer*> merge_in_place_updates(std::vector<ExecItem>& items,
                                                         const std::vector<StateUpdate>& updates,
                                                         const std::unordered_set<const Buffer*>& returned) {
  const std::unordered_set<const Buffer*> aliased = aliased_buffers(items);
  std::unordered_set<const Buffer*> merged;
  std::set<size_t> rewritten;  // kernels, compiled once each after all their merges (an optimizer's
                               // update writes a parameter and its moments)
  for (auto& u : updates) {
    if (!u.before || !u.after || u.before == u.after) continue;
    if (returned.count(u.after.get()) || aliased.count(u.before.get()) || aliased.count(u.after.get())) continue;
    if (u.before->device() != u.after->device()) continue;
    if (auto w = merge_update(items, u)) {
      merged.insert(u.after.get());
      rewritten.insert(*w);
    }
  }
  for (size_t w : rewritten) items[w].launch = kernel_launch(items[w].item);
  return merged;
}

}  // namespace tg
