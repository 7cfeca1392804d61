// TinyJit (see jit.h and Note [what a captured step is]): recording a step, sorting its buffers
// into inputs, state, fresh, in-place and fixed ones, sharing fixed intermediates, and replaying
// it.
#include "tinygrad/engine/jit.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/engine/jit_arena.h"
#include "tinygrad/engine/jit_in_place.h"
#include "tinygrad/engine/observe.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

using Buffers = std::vector<std::shared_ptr<Buffer>>;

// What a capturing call saw. Note [recording without keeping intermediates]: a buffer that
// first appears as an item's output is held weakly, so the step's intermediates die when their
// last reader is done, as in a normal step, and the capture's peak memory is a normal step's.
// One that died is an intermediate nobody else sees; the capture gets a new buffer like it
// (items compare buffers by identity; owner_less keeps a dead buffer's identity apart from a
// new buffer at the same address). Buffers first seen as inputs of an item (parameters,
// constants made from host data inside the step) are held strongly. A dead view of a buffer
// (Note [concatenations stored in place] in schedule/concat_in_place.cpp) comes back as a view,
// at its offset, of its base as revived, so the capture's pieces still alias their concatenation.
struct Recording {
  struct Seen {
    std::weak_ptr<Buffer> buf;
    std::string device;
    DType dtype;
    int64_t numel;
    bool view = false;
    std::weak_ptr<Buffer> base;  // views only: the buffer viewed, its dtype and size, and the offset
    DType base_dtype = DType::UInt8;
    int64_t base_numel = 0;
    size_t offset = 0;
  };
  static Seen seen_of(const std::shared_ptr<Buffer>& b) {
    Seen s{b, b->device(), b->dtype(), b->numel()};
    if (const auto& base = b->view_base()) {
      s.view = true;
      s.base = base;
      s.base_dtype = base->dtype();
      s.base_numel = base->numel();
      s.offset = b->view_offset();
    }
    return s;
  }
  struct Item {
    ExecItem exec;  // buffers empty; see `bufs`
    std::vector<Seen> bufs;
  };
  std::vector<Item> items;
  std::set<std::weak_ptr<Buffer>, std::owner_less<std::weak_ptr<Buffer>>> seen;
  std::vector<std::shared_ptr<Buffer>> held;  // first seen as inputs
  ExecRecorder recorder = [this](const ExecItem& e) { record(e); };

  void record(const ExecItem& e) {
    Item it{ExecItem{ScheduleItem{e.item.kind, e.item.ast, {}, e.item.device, e.item.outputs}, e.launch}, {}};
    for (size_t p = 0; p < e.item.buffers.size(); p++) {
      auto& b = e.item.buffers[p];
      if (seen.insert(b).second && p >= e.item.outputs) held.push_back(b);
      it.bufs.push_back(seen_of(b));
    }
    items.push_back(std::move(it));
  }
  // The items with their buffers, dead intermediates replaced by new ones.
  std::vector<ExecItem> resolve() {
    Revived revived;
    std::vector<ExecItem> out;
    for (auto& it : items) {
      ExecItem e = std::move(it.exec);
      for (auto& s : it.bufs) e.item.buffers.push_back(revive(s, revived));
      out.push_back(std::move(e));
    }
    items.clear();
    return out;
  }
  using Revived = std::map<std::weak_ptr<Buffer>, std::shared_ptr<Buffer>, std::owner_less<std::weak_ptr<Buffer>>>;
  // The buffer s saw: itself while alive, else one new buffer like it (a view of its base revived).
  static std::shared_ptr<Buffer> revive(const Seen& s, Revived& revived) {
    if (auto b = s.buf.lock()) return b;
    auto& r = revived[s.buf];
    if (r) return r;
    if (s.view) {
      Seen base{s.base, s.device, s.base_dtype, s.base_numel};
      r = std::make_shared<Buffer>(revive(base, revived), s.offset, s.dtype, s.numel);
    } else {
      r = std::make_shared<Buffer>(s.device, s.dtype, s.numel);
    }
    return r;
  }
  struct Assign {  // the buffers of the target's parts (one on a single device); before is empty when it was lazy
    Tensor target;
    Buffers before, after;
  };
  std::vector<Assign> assigns;
  std::vector<std::function<void()>> hooks;
  std::string host_read;  // the first tensor read on the host, when one was
};
thread_local Recording* recording = nullptr;

struct GraphFactories {
  std::mutex mu;
  std::unordered_map<std::string, GraphFactory> by_base;
};
GraphFactories& graph_factories() {
  static GraphFactories f;
  return f;
}

// Captures alive now, so an assign outside them can mark those that read the old value stale.
struct LiveCaptures {
  std::mutex mu;
  std::unordered_set<TinyJit::Capture*> all;
};
LiveCaptures& live_captures() {
  static LiveCaptures* l = new LiveCaptures();
  return *l;
}

std::string signature(const Tensors& ts) {
  std::string s;
  for (auto& t : ts) s += (s.empty() ? "" : ", ") + t.describe();
  return s.empty() ? "(no inputs)" : s;
}

// The buffer a realized tensor's value is in.
std::shared_ptr<Buffer> buffer_of(const Tensor& t) {
  auto b = TensorAccess::buffer(t);
  TG_ASSERT(b, "jit: tensor ", t.describe(), " was expected to be realized");
  return b;
}

// The buffers of a realized tensor's parts (Note [a state tensor over several devices]).
Buffers buffers_of(const Tensor& t) {
  auto b = TensorAccess::buffers(t);
  TG_ASSERT(!b.empty(), "jit: tensor ", t.describe(), " was expected to be realized");
  return b;
}

}  // namespace

bool jit_capturing() { return recording != nullptr; }

void jit_on_replay(std::function<void()> fn) {
  if (recording) recording->hooks.push_back(std::move(fn));
}

void register_graph_factory(const std::string& device_base_name, GraphFactory factory) {
  auto& f = graph_factories();
  std::lock_guard<std::mutex> lock(f.mu);
  f.by_base[device_base_name] = std::move(factory);
}

// ---- the capture ----

struct TinyJit::Capture {
  // InPlace: a state tensor's new value, written over its old one (Note [state updated in place]
  // in jit_in_place.cpp)
  enum class Part { Input, State, Fresh, InPlace };
  struct Slot {  // a buffer that is bound anew on every replay
    Part part;
    size_t index = 0;  // Input: the input's position; State, InPlace: the state tensor's
    size_t part_index = 0;  // State, InPlace: which of the tensor's parts (Note [a state tensor over several devices])
    std::string device;
    DType dtype;
    int64_t numel;
  };
  struct Use {  // items[item].item.buffers[pos] is slots[slot]
    size_t item, pos, slot;
  };
  struct Binding {  // a slot, or a fixed buffer
    std::optional<size_t> slot;
    std::shared_ptr<Buffer> fixed;
  };
  std::vector<ExecItem> items;  // non-fixed buffers are null between replays
  std::vector<Slot> slots;
  std::vector<Use> uses;
  struct Output {  // a returned tensor: its parts' bindings, rebuilt like the captured value
    std::vector<Binding> parts;
    std::vector<Shape> part_shapes;
    SplitLayout split;  // of a tensor over several devices
    bool multi = false;
  };
  std::vector<Tensor> states;                      // tensors the step assigns
  std::vector<std::vector<Binding>> state_after;  // what each part of each holds after the step
  std::vector<Output> outputs;
  std::vector<std::function<void()>> hooks;
  std::unique_ptr<ExecGraph> graph;
  size_t kernels = 0, copies = 0, collectives = 0;
  size_t states_in_place = 0;  // Note [state updated in place]
  size_t written_over = 0;     // kernels writing over a dying input: Note [intermediates written over a dying input]
  size_t arena_bytes = 0;  // Note [one arena for a captured step's intermediates] in jit_arena.cpp
  std::unordered_set<const Buffer*> fixed_inputs;  // fixed buffers the step reads but does not write
  bool stale = false;                              // one of them was assigned away since (see JitObserver)

  Capture() = default;
  void go_live() {  // once fixed_inputs is complete
    auto& live = live_captures();
    std::lock_guard<std::mutex> lock(live.mu);
    live.all.insert(this);
  }
  ~Capture() {
    auto& live = live_captures();
    std::lock_guard<std::mutex> lock(live.mu);
    live.all.erase(this);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  const std::shared_ptr<Buffer>& bound(const Binding& b, const std::vector<std::shared_ptr<Buffer>>& slot_bufs) const {
    return b.slot ? slot_bufs[*b.slot] : b.fixed;
  }

  // Note [recycled fresh buffers]: a fresh slot's buffer for this replay. The buffers of earlier
  // replays that nothing outside the capture holds any more (the parameters' values of two steps
  // ago, a loss the caller dropped) are taken again, so in a steady loop each slot alternates
  // between two buffers and a replay's addresses repeat every second step, whatever order the
  // memory pool would hand blocks back in. That is what lets a device graph keep one instance per
  // set of addresses (Note [device graphs]). At most RECYCLED per slot are kept; a slot whose
  // buffers are all still held (a caller keeping every loss) gets a new one from the pool.
  static constexpr size_t RECYCLED = 2;
  std::vector<std::vector<std::shared_ptr<Buffer>>> recycled;  // by slot
  std::shared_ptr<Buffer> fresh_buffer(size_t s) {
    if (recycled.size() < slots.size()) recycled.resize(slots.size());
    for (auto& b : recycled[s])
      if (b.use_count() == 1) return b;
    auto b = std::make_shared<Buffer>(slots[s].device, slots[s].dtype, slots[s].numel);
    if (recycled[s].size() < RECYCLED) recycled[s].push_back(b);
    return b;
  }

  // Note [state updated in place]: an in-place slot's buffer for this replay: the one its state
  // tensor holds (`held`; `bound`: the replay's other slots, some of which may hold it too, as
  // the state slot the step's first readers of the value use does), unless something outside
  // the capture holds it too; then a copy of it, which the replay updates and the tensor takes.
  std::shared_ptr<Buffer> in_place_buffer(size_t s, const std::shared_ptr<Buffer>& held, const Buffers& bound) {
    if (recycled.size() < slots.size()) recycled.resize(slots.size());
    const auto ours = 1 + std::count(bound.begin(), bound.end(), held) + std::count(recycled[s].begin(), recycled[s].end(), held);
    if (TensorAccess::holds_buffer_alone(states[slots[s].index], static_cast<long>(ours))) return held;
    auto copy = fresh_buffer(s);
    copy_buffer(*copy, *held);
    return copy;
  }
};

namespace {

// The JIT's tensor observer (Note [tensor observers] in engine/observe.h): a capturing thread's
// assigns and host reads go into its recording; an assign on any thread, during a capture or
// between calls, marks the live captures that read the assigned-away buffer as fixed stale.
class JitObserver final : public TensorObserver {
 public:
  void on_assign(const Tensor& target, const std::shared_ptr<Buffer>& before,
                 const std::shared_ptr<Buffer>& after) override {
    on_assign_parts(target, before ? Buffers{before} : Buffers{}, {after});
  }
  void on_assign_parts(const Tensor& target, const Buffers& before, const Buffers& after) override {
    if (recording) recording->assigns.push_back({target, before, after});
    for (auto& b : before) mark_readers_stale(*b);
  }
  void on_host_read(const Tensor& t) override {
    if (recording && recording->host_read.empty()) recording->host_read = t.describe();
  }

 private:
  static void mark_readers_stale(const Buffer& fixed) {
    auto& live = live_captures();
    std::lock_guard<std::mutex> lock(live.mu);
    for (auto* c : live.all)
      if (c->fixed_inputs.count(&fixed)) c->stale = true;
  }
};

// Registers the observer, once, before the first capture begins; it stays for the process.
void observe_tensors() {
  static const bool registered = [] {
    add_tensor_observer(new JitObserver());
    return true;
  }();
  (void)registered;
}

}  // namespace

struct TinyJit::Entry {
  int64_t calls = 0;
  std::unique_ptr<Capture> capture;
};

namespace {

using Capture = TinyJit::Capture;

// The step's state: every assigned tensor once (in cap.states), with the buffer it held first
// and the one it holds last. A tensor whose first value was computed in the step itself is not
// state: replays recompute it.
struct StepState {
  struct Part {
    size_t state, part;
  };
  std::vector<Buffers> after;                        // by state tensor: its parts' buffers after the step
  std::unordered_map<const Buffer*, Part> state_of;  // a state tensor's part's buffer before the step
};

// Returns false and sets `why` when an assigned tensor held no value before the step.
bool collect_state(const Recording& rec, const std::unordered_set<const Buffer*>& written, Capture& cap,
                   StepState& st, std::string& why) {
  std::unordered_map<const void*, size_t> state_index;
  for (auto& a : rec.assigns) {
    auto [it, fresh] = state_index.emplace(TensorAccess::identity(a.target), cap.states.size());
    if (!fresh) {
      st.after[it->second] = a.after;
      continue;
    }
    if (a.before.empty()) {
      why = "it assigns " + a.target.describe() + ", which held no realized value before the step";
      return false;
    }
    cap.states.push_back(a.target);
    st.after.push_back(a.after);
    for (size_t p = 0; p < a.before.size(); p++)
      if (!written.count(a.before[p].get())) st.state_of.emplace(a.before[p].get(), StepState::Part{it->second, p});
  }
  return true;
}

// Sorts the captured buffers into those bound anew on every replay (slots: the inputs, the
// state tensors' values, and the step's results that escape it) and the fixed ones.
class SlotBinder {
 public:
  SlotBinder(Capture& cap, const Tensors& inputs, const StepState& st, const std::unordered_set<const Buffer*>& written,
             const Tensors& outputs, const std::unordered_map<const Buffer*, StepState::Part>& in_place)
      : cap_(cap), state_of_(st.state_of), in_place_(in_place), written_(written) {
    for (size_t i = 0; i < inputs.size(); i++) input_of_.emplace(buffer_of(inputs[i]).get(), i);
    for (auto& parts : st.after)
      for (auto& b : parts) escaping_.insert(b.get());
    for (auto& o : outputs)
      for (auto& b : buffers_of(o)) escaping_.insert(b.get());
  }

  Capture::Binding operator()(const std::shared_ptr<Buffer>& b) {
    if (auto it = slot_of_.find(b.get()); it != slot_of_.end()) return {it->second, nullptr};
    Capture::Slot s{Capture::Part::Fresh, 0, 0, b->device(), b->dtype(), b->numel()};
    if (auto i = input_of_.find(b.get()); i != input_of_.end()) {
      s.part = Capture::Part::Input;
      s.index = i->second;
    } else if (auto st = state_of_.find(b.get()); st != state_of_.end()) {
      s.part = Capture::Part::State;
      s.index = st->second.state;
      s.part_index = st->second.part;
    } else if (auto ip = in_place_.find(b.get()); ip != in_place_.end()) {
      s.part = Capture::Part::InPlace;
      s.index = ip->second.state;
      s.part_index = ip->second.part;
    } else if (!written_.count(b.get()) || !escaping_.count(b.get())) {
      if (!written_.count(b.get())) cap_.fixed_inputs.insert(b.get());
      return {std::nullopt, b};  // fixed
    }
    slot_of_.emplace(b.get(), cap_.slots.size());
    cap_.slots.push_back(s);
    return {cap_.slots.size() - 1, nullptr};
  }

 private:
  Capture& cap_;
  const std::unordered_map<const Buffer*, StepState::Part>& state_of_;
  const std::unordered_map<const Buffer*, StepState::Part>& in_place_;  // Note [state updated in place]
  const std::unordered_set<const Buffer*>& written_;
  std::unordered_map<const Buffer*, size_t> input_of_, slot_of_;
  std::unordered_set<const Buffer*> escaping_;
};

// Counts the captured items by kind and takes every slot's buffer out of the list (bound on
// each replay; the captured buffer is not kept).
void bind_items(Capture& cap, SlotBinder& binding) {
  for (size_t i = 0; i < cap.items.size(); i++) {
    auto& item = cap.items[i].item;
    switch (item.kind) {
      case ScheduleItem::Kind::Kernel: cap.kernels++; break;
      case ScheduleItem::Kind::Copy: cap.copies++; break;
      case ScheduleItem::Kind::Collective: cap.collectives++; break;
    }
    for (size_t p = 0; p < item.buffers.size(); p++) {
      auto b = binding(item.buffers[p]);
      if (!b.slot) continue;
      cap.uses.push_back({i, p, *b.slot});
      item.buffers[p] = nullptr;
    }
  }
}

// A graph of the list where all its items run on one device that turns captured lists into
// graphs (Note [device graphs]); null elsewhere, and for a list over several devices (their
// copies and collectives are run item by item).
std::unique_ptr<ExecGraph> device_graph(const std::vector<ExecItem>& items) {
  bool one_device = !items.empty();
  for (auto& e : items) one_device = one_device && canonical_device(e.item.device) == canonical_device(items[0].item.device);
  if (!one_device) return nullptr;
  const std::string& d = items[0].item.device;
  const std::string base = d.substr(0, d.find(':'));
  auto& f = graph_factories();
  std::lock_guard<std::mutex> lock(f.mu);
  if (auto it = f.by_base.find(base); it != f.by_base.end()) return it->second(items);
  return nullptr;
}

// How a replay rebuilds the returned tensor `o`: its parts' bindings and, over several devices,
// the shape of each part and the split.
Capture::Output captured_output(const Tensor& o, SlotBinder& binding) {
  Capture::Output out;
  for (auto& b : buffers_of(o)) out.parts.push_back(binding(b));
  const UOpPtr& u = o.uop()->realized_multi ? o.uop()->realized_multi : o.uop();
  out.multi = u->op == Op::MULTI;
  if (!out.multi) {
    out.part_shapes.push_back(o.shape());
    return out;
  }
  for (auto& part : u->src) out.part_shapes.push_back(part->shape);
  out.split = {u->arg_ints()[0], u->arg_ints()[1]};
  return out;
}

// The buffers that leave the step or enter it: inputs, the states' values before and after, outputs.
std::unordered_set<const Buffer*> step_boundary(const Tensors& inputs, const StepState& st, const Tensors& outputs) {
  std::unordered_set<const Buffer*> out;
  for (auto& [b, part] : st.state_of) out.insert(b);
  for (auto& parts : st.after)
    for (auto& a : parts) out.insert(a.get());
  for (const Tensors* ts : {&inputs, &outputs})
    for (auto& t : *ts)
      for (auto& x : buffers_of(t)) out.insert(x.get());
  return out;
}

// Note [state updated in place] (jit_in_place.cpp): the states of one part whose update kernel now
// writes over the old value, by the buffer of their new value.
std::unordered_map<const Buffer*, StepState::Part> update_in_place(std::vector<ExecItem>& items, const StepState& st,
                                                                   const Tensors& outputs) {
  std::unordered_map<const Buffer*, std::shared_ptr<Buffer>> held;  // the items' buffers, by address
  for (auto& e : items)
    for (auto& b : e.item.buffers) held.emplace(b.get(), b);
  std::vector<StateUpdate> updates;
  std::vector<StepState::Part> of;
  for (auto& [before, part] : st.state_of) {
    const Buffers& after = st.after[part.state];
    auto h = held.find(before);
    if (after.size() != 1 || h == held.end()) continue;  // a state over several devices, or one the step never reads
    updates.push_back({h->second, after[0]});
    of.push_back(part);
  }
  std::unordered_set<const Buffer*> returned;
  for (auto& o : outputs)
    for (auto& b : buffers_of(o)) returned.insert(b.get());
  const auto merged = merge_in_place_updates(items, updates, returned);
  std::unordered_map<const Buffer*, StepState::Part> out;
  for (size_t k = 0; k < updates.size(); k++)
    if (merged.count(updates[k].after.get())) out.emplace(updates[k].after.get(), of[k]);
  return out;
}

// Sorts a recording's buffers (Note [what a captured step is]). Returns null and sets `why`
// when the step cannot be replayed.
std::unique_ptr<Capture> build_capture(Recording& rec, const Tensors& inputs, const Tensors& outputs,
                                       std::string& why) {
  auto cap = std::make_unique<Capture>();
  std::vector<ExecItem> items = rec.resolve();
  std::unordered_set<const Buffer*> written;
  for (auto& e : items)
    for (size_t p = 0; p < e.item.outputs; p++) written.insert(e.item.buffers[p].get());
  StepState st;
  if (!collect_state(rec, written, *cap, st, why)) return nullptr;
  auto in_place = update_in_place(items, st, outputs);
  cap->states_in_place = in_place.size();
  const auto boundary = step_boundary(inputs, st, outputs);
  cap->written_over = write_intermediates_over_dying_inputs(
      items, [&](const Buffer* b) { return written.count(b) && !boundary.count(b); });

  SlotBinder binding(*cap, inputs, st, written, outputs, in_place);
  cap->items = std::move(items);
  bind_items(*cap, binding);
  cap->arena_bytes = share_intermediates(cap->items, written);  // only fixed ones are left in the list
  for (auto& parts : st.after) {
    cap->state_after.emplace_back();
    for (auto& b : parts) cap->state_after.back().push_back(binding(b));
  }
  for (auto& o : outputs) cap->outputs.push_back(captured_output(o, binding));
  cap->hooks = std::move(rec.hooks);
  cap->graph = device_graph(cap->items);
  cap->go_live();
  return cap;
}

// Inputs enter as plain buffers of exactly their shape, so any later input of the same shape
// can take a captured input's place (a view would be indexed as the captured one was). Inputs
// over several devices are only realized (inputs_refused).
Tensors as_plain_buffers(const Tensors& inputs) {
  Tensors in = inputs;
  Tensor::realize_all(in);
  for (auto& t : in) {
    if (is_device_tuple(t.device())) continue;
    auto b = TensorAccess::buffer(t);
    if (!b || b->numel() != t.numel()) {
      t = t.contiguous();
      t.realize();
      b = buffer_of(t);
    }
    if (t.uop()->op != Op::BUFFER) t = Tensor(lazy::buffer(b, t.shape()));
  }
  return in;
}

// Runs the step and realizes its outputs.
Tensors run_realized(const TinyJit::StepFn& fn, const Tensors& in) {
  Tensors out = fn(in);
  Tensor::realize_all(out);
  return out;
}

bool is_stale(const Capture& c) {
  std::lock_guard<std::mutex> lock(live_captures().mu);
  return c.stale;
}

// The buffer a state tensor's part holds now (a State or InPlace slot's).
std::shared_ptr<Buffer> state_buffer(const Capture& c, const Capture::Slot& sl, const std::string& jit_name) {
  auto parts = TensorAccess::buffers(c.states[sl.index]);
  auto b = sl.part_index < parts.size() ? parts[sl.part_index] : nullptr;
  TG_CHECK(b && b->numel() == sl.numel && b->dtype() == sl.dtype && b->device() == sl.device, "jit '", jit_name,
           "': the state tensor ", c.states[sl.index].describe(), " no longer holds a realized buffer like the captured one");
  return b;
}

// This replay's buffer for every slot of the capture.
std::vector<std::shared_ptr<Buffer>> slot_buffers(Capture& c, const Tensors& in, const std::string& jit_name) {
  std::vector<std::shared_ptr<Buffer>> bufs(c.slots.size());
  for (size_t s = 0; s < c.slots.size(); s++) {
    auto& sl = c.slots[s];
    switch (sl.part) {
      case Capture::Part::Input: bufs[s] = buffer_of(in[sl.index]); break;
      case Capture::Part::State: bufs[s] = state_buffer(c, sl, jit_name); break;
      case Capture::Part::Fresh: bufs[s] = c.fresh_buffer(s); break;
      case Capture::Part::InPlace: break;  // below, once every other slot holds what it holds
    }
  }
  for (size_t s = 0; s < c.slots.size(); s++) {
    if (c.slots[s].part != Capture::Part::InPlace) continue;
    auto held = state_buffer(c, c.slots[s], jit_name);
    bufs[s] = c.in_place_buffer(s, held, bufs);
    if (knobs::DEBUG >= 2 && bufs[s] != held)
      std::fprintf(stderr, "jit %s: %s is held outside the step too: updated in a copy (Note [state updated in place])\n",
                   jit_name.c_str(), c.states[c.slots[s].index].describe().c_str());
  }
  return bufs;
}

// Runs the step with this thread's kernels and tensor events going into rec.
Tensors record_step(const TinyJit::StepFn& fn, const Tensors& in, Recording& rec) {
  observe_tensors();
  struct Scope {
    Recording* prev_rec;
    ExecRecorder* prev_items;
    explicit Scope(Recording& r) : prev_rec(recording), prev_items(set_exec_recorder(&r.recorder)) { recording = &r; }
    ~Scope() {
      recording = prev_rec;
      set_exec_recorder(prev_items);
    }
  } scope(rec);
  return run_realized(fn, in);
}

// A returned tensor of a replay, over this replay's buffers.
Tensor replayed_output(const Capture& c, const Capture::Output& o, const Buffers& bufs) {
  std::vector<UOpPtr> parts;
  for (size_t i = 0; i < o.parts.size(); i++) parts.push_back(lazy::buffer(c.bound(o.parts[i], bufs), o.part_shapes[i]));
  return Tensor(o.multi ? make_multi(parts, o.split.axis, o.split.groups) : parts[0]);
}

// Why a call with these inputs cannot be captured (empty when it can).
std::string inputs_refused(const Tensors& inputs) {
  for (auto& t : inputs)
    if (is_device_tuple(t.device()))
      return "its input " + t.describe() +
             " is over several devices (pass it on one device and shard it inside the step, as the trainer does)";
  return "";
}

}  // namespace

// ---- TinyJit ----

TinyJit::TinyJit(StepFn fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {}
TinyJit::~TinyJit() = default;

size_t TinyJit::arena_bytes() const {
  size_t n = 0;
  for (auto& [sig, e] : entries_)
    if (e->capture) n += e->capture->arena_bytes;
  return n;
}

void TinyJit::reset() {
  entries_.clear();
  disabled_reason_.clear();
}

Tensors TinyJit::operator()(const Tensors& inputs) {
  Tensors in = as_plain_buffers(inputs);
  if (knobs::JIT.get() && disabled_reason_.empty() && !recording) {
    disabled_reason_ = inputs_refused(in);
    if (!disabled_reason_.empty() && knobs::DEBUG >= 1)
      std::fprintf(stderr, "jit %s: not captured: %s; every call runs normally\n", name_.c_str(), disabled_reason_.c_str());
  }
  // Off, or unusable, or inside another capture (whose record then holds this call's kernels).
  if (!knobs::JIT.get() || !disabled_reason_.empty() || recording) return run_realized(fn_, in);

  std::string sig = signature(in);
  auto& slot = entries_[sig];
  if (!slot) slot = std::make_unique<Entry>();
  Entry& e = *slot;
  if (e.capture && is_stale(*e.capture)) {  // a tensor it reads as fixed was assigned a new value: capture again now
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "jit %s: a tensor the capture of [%s] reads was assigned since; capturing again\n",
                   name_.c_str(), sig.c_str());
    e.capture.reset();
  }
  if (e.capture) return replay(*e.capture, in);
  if (e.calls++ == 0) {
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "jit %s: first call with [%s]: running normally, capturing on the next call\n", name_.c_str(),
                   sig.c_str());
    return run_realized(fn_, in);
  }
  return capture(e, in, sig);
}

// Note [a traced replay runs item by item]: a device graph (a CUDA graph) runs the whole step as
// one launch, so a timeline would show the step as one span and no kernel in it. While a trace
// records, a replay therefore runs the captured items one by one, through the same buffers, as a
// list without a graph does: each kernel then has its own span with the device's measurement
// (Note [tracing costs nothing when off] in trace.h). The step is slower while it is traced, as
// every traced kernel already is; the replay span's device_graph argument says "no (tracing)".
Tensors TinyJit::replay(Capture& c, const Tensors& in) {
  for (auto& h : c.hooks) h();
  std::vector<std::shared_ptr<Buffer>> bufs = slot_buffers(c, in, name_);
  for (auto& u : c.uses) c.items[u.item].item.buffers[u.pos] = bufs[u.slot];
  struct Unbind {  // the captured list keeps only fixed buffers between replays
    Capture& c;
    ~Unbind() {
      for (auto& u : c.uses) c.items[u.item].item.buffers[u.pos] = nullptr;
    }
  } unbind{c};
  replays_++;
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr, "jit %s: replay %lld: %zu kernels, %zu copies, %zu collectives\n", name_.c_str(),
                 static_cast<long long>(replays_), c.kernels, c.copies, c.collectives);
  {
    trace::Span span("jit", "replay");
    span.arg("jit", name_);
    span.arg("replay", static_cast<double>(replays_));
    span.arg("kernels", static_cast<double>(c.kernels));
    // Note [a traced replay runs item by item]
    const bool as_graph = c.graph && !trace::enabled();
    span.arg("device_graph", as_graph ? "yes" : c.graph ? "no (tracing)" : "no");
    if (as_graph) c.graph->run(c.items);
    else run_exec_items(c.items);
  }
  for (size_t j = 0; j < c.states.size(); j++) {
    Buffers parts;
    for (auto& b : c.state_after[j]) parts.push_back(c.bound(b, bufs));
    TensorAccess::set_buffers(c.states[j], parts);
  }
  Tensors out;
  for (auto& o : c.outputs) out.push_back(replayed_output(c, o, bufs));
  return out;
}

Tensors TinyJit::capture(Entry& e, const Tensors& in, const std::string& sig) {
  trace::Span span("jit", "capture");
  span.arg("jit", name_);
  Recording rec;
  Tensors out = record_step(fn_, in, rec);
  std::string why;
  if (!rec.host_read.empty())
    why = "it reads " + rec.host_read + " on the host while it runs (a data-dependent decision cannot be replayed)";
  std::unique_ptr<Capture> cap = why.empty() ? build_capture(rec, in, out, why) : nullptr;
  if (!cap) {
    disabled_reason_ = why;
    entries_.clear();
    if (knobs::DEBUG >= 1)
      std::fprintf(stderr, "jit %s: not captured: %s; every call runs normally\n", name_.c_str(), why.c_str());
    return out;
  }
  captures_++;
  if (knobs::DEBUG >= 1)
    std::fprintf(stderr,
                 "jit %s: captured [%s]: %zu kernels (%zu writing over an input), %zu copies, %zu collectives; %zu state "
                 "tensors (%zu updated in place), %zu host hooks; "
                 "intermediates in %.2f MB of arena%s\n",
                 name_.c_str(), sig.c_str(), cap->kernels, cap->written_over, cap->copies, cap->collectives, cap->states.size(),
                 cap->states_in_place, cap->hooks.size(), static_cast<double>(cap->arena_bytes) / 1e6,
                 cap->graph ? "; replayed as a device graph" : "");
  e.capture = std::move(cap);
  return out;
}

}  // namespace tg
