// Tensors over several devices of one process: the logical nodes on a device tuple, the rewrite
// that lowers them into per-device graphs, and the copies and reductions it inserts between the
// devices (the collectives of one process, as ordinary copy and add kernels).
#include "tinygrad/multi.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"

namespace tg {

// Note [multi-device tensors]: as in tinygrad, a tensor over several devices is one logical
// tensor: its node has the logical (whole) shape, and its device is the tuple of devices (their
// names joined by ','). Every op builds logical nodes as it does on one device, and autograd
// differentiates the logical graph, so no op needs a gradient rule beyond the ones it has (MULTI
// and COPY have theirs). Where each device's part lies is decided only when the graph is
// realized: lower_multi walks the logical graph sources first and gives each node its parts and
// the axis they split (-1: each device holds the whole; "replicated"):
//  - MULTI nodes (Tensor::shard, host data, realized results) name their parts and axis;
//  - a CONST is a CONST on each device; a COPY from one device to a tuple is a copy to each;
//  - elementwise ops run on each device's parts; a replicated operand of a sharded op is cut to
//    the device's slice where it lies (no copy). Operands split along different axes are refused;
//  - a reduction runs on each device; when it reduces over the split axis, its partial results
//    are all-reduced (every device adds all parts, in the same order, so the copies stay equal);
//  - reshape, permute and expand keep the split axis when it stays one dimension of the result
//    with the same elements before it; pad, shrink and flip that leave the split axis alone run
//    per device. When they touch the split axis, they first all-gather their operand (each device
//    assembles the whole from every part), then run replicated;
//  - GATHER (embeddings) reads the whole table at each device's part of the index, so its result
//    is split as the index is; SCATTER_ADD, its gradient, adds each device's part, and when the
//    split axis is the scatter axis the partial sums are all-reduced;
//  - a COPY from a tuple to one device gathers the parts there.
// The parts are ordinary single-device graphs: the scheduler, the kernels and the JIT see nothing
// new, and the kernels of one device's part are the single-device kernels on smaller shapes.
// Uneven splits are refused (shard_uop names the sizes). "CPU" and "CPU:0" are one device
// (canonical_device), so a tuple written either way is the same tuple.
//
// Note [collectives between the devices of a process]: a small all-reduce of n parts is a direct
// exchange: every part is copied to every other device and added there (n*(n-1) copies of the
// whole partial, and n kernels of n-1 adds each, in the same order everywhere). One of at least
// RING_ALLREDUCE elements (that split into n equal chunks) goes around a ring instead: in the
// reduce-scatter, chunk j starts on device j+1 and moves to the next device n-1 times, each
// adding its own chunk j, so that it ends on device j summed; in the all-gather, each summed
// chunk moves on around the ring to every device, which assembles the whole. Each device then
// sends 2*(n-1)/n of the tensor instead of (n-1) times it, in 2*(n-1) steps of small copies and
// adds. Every chunk is summed once, so the devices' results are equal bit for bit. An all-gather
// copies every part to every device and assembles it with pads and adds. All of these are plain
// COPY and elementwise nodes, which the scheduler orders and fuses like any others.
// multi_stats() counts what the rewrite inserted.

MultiStats& multi_stats() {
  static MultiStats stats;
  return stats;
}

bool is_device_tuple(const std::string& device) { return device.find(',') != std::string::npos; }

std::vector<std::string> split_devices(const std::string& device) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = device.find(',', start);
    out.push_back(device.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

namespace {
std::atomic<bool> tuples_made{false};
}  // namespace

bool device_tuples_made() { return tuples_made.load(std::memory_order_relaxed); }

std::string join_devices(const std::vector<std::string>& devices) {
  if (devices.size() > 1) tuples_made.store(true, std::memory_order_relaxed);
  std::string out;
  for (auto& d : devices) out += (out.empty() ? "" : ",") + d;
  return out;
}

namespace {

using namespace lazy;

Shape part_shape(Shape s, int64_t axis, size_t n) {
  if (axis >= 0) s[static_cast<size_t>(axis)] /= static_cast<int64_t>(n);
  return s;
}

// The bounds of part i of n along axis (every other dimension whole).
Pads part_bounds(const Shape& s, int64_t axis, size_t i, size_t n) {
  Pads b;
  for (int64_t d : s) b.push_back({0, d});
  int64_t size = s[static_cast<size_t>(axis)] / static_cast<int64_t>(n);
  b[static_cast<size_t>(axis)] = {size * static_cast<int64_t>(i), size * static_cast<int64_t>(i + 1)};
  return b;
}

UOpPtr combine(Op op, const UOpPtr& a, const UOpPtr& b) {
  return alu(a->dtype == DType::Bool && op == Op::ADD ? Op::OR : op, a, b);
}

// The whole of a node split along axis, assembled on `device` from its parts.
UOpPtr assemble(const std::vector<UOpPtr>& parts, int64_t axis, const std::string& device) {
  size_t n = parts.size();
  UOpPtr whole;
  for (size_t j = 0; j < n; j++) {
    UOpPtr part = copy_to(parts[j], device);
    if (parts[j]->device != device) multi_stats().copies++;
    Pads p(part->shape.size(), {0, 0});
    int64_t size = part->shape[static_cast<size_t>(axis)];
    p[static_cast<size_t>(axis)] = {size * static_cast<int64_t>(j), size * static_cast<int64_t>(n - 1 - j)};
    UOpPtr placed = pad(part, p);
    whole = whole ? combine(Op::ADD, whole, placed) : placed;
  }
  return whole;
}

// The whole of a flat tensor from its equal chunks, all on one device.
UOpPtr assemble_local(const std::vector<UOpPtr>& chunks) {
  const int64_t size = chunks[0]->shape[0], n = static_cast<int64_t>(chunks.size());
  UOpPtr whole;
  for (int64_t j = 0; j < n; j++) {
    UOpPtr placed = pad(chunks[static_cast<size_t>(j)], {{size * j, size * (n - 1 - j)}});
    whole = whole ? combine(Op::ADD, whole, placed) : placed;
  }
  return whole;
}

Lowered all_gather(const Lowered& x) {
  if (x.axis < 0) return x;
  multi_stats().allgathers++;
  Lowered out;
  for (auto& part : x.parts) out.parts.push_back(assemble(x.parts, x.axis, part->device));
  return out;
}

// Note [collectives between the devices of a process]
Lowered ring_all_reduce(const std::vector<UOpPtr>& partials, Op op) {
  const size_t n = partials.size();
  const Shape shape = partials[0]->shape;
  const int64_t numel = prod(shape), chunk = numel / static_cast<int64_t>(n);
  auto piece = [&](size_t d, size_t j) {
    int64_t begin = chunk * static_cast<int64_t>(j);
    return shrink(reshape(partials[d], {numel}), {{begin, begin + chunk}});
  };
  auto device = [&](size_t d) { return partials[d]->device; };
  auto pass = [&](const UOpPtr& x, size_t d) {
    multi_stats().copies++;
    return copy_to(x, device(d));
  };
  std::vector<std::vector<UOpPtr>> at(n, std::vector<UOpPtr>(n));  // at[device][chunk], summed
  for (size_t j = 0; j < n; j++) {
    size_t d = (j + 1) % n;
    UOpPtr acc = piece(d, j);
    for (size_t step = 1; step < n; step++) {  // reduce-scatter: ends on device j
      d = (d + 1) % n;
      acc = combine(op, pass(acc, d), piece(d, j));
    }
    at[j][j] = acc;
    for (size_t step = 1; step < n; step++) {  // all-gather: on around the ring
      d = (d + 1) % n;
      acc = pass(acc, d);
      at[d][j] = acc;
    }
  }
  Lowered out;
  for (size_t d = 0; d < n; d++) out.parts.push_back(reshape(assemble_local(at[d]), shape));
  return out;
}

// Note [collectives between the devices of a process]
Lowered all_reduce(const std::vector<UOpPtr>& partials, Op op) {
  multi_stats().allreduces++;
  const size_t n = partials.size();
  const int64_t numel = prod(partials[0]->shape), ring = knobs::RING_ALLREDUCE.get();
  if (ring > 0 && numel >= ring && numel % static_cast<int64_t>(n) == 0) return ring_all_reduce(partials, op);
  Lowered out;
  for (auto& own : partials) {
    UOpPtr acc;
    for (auto& p : partials) {
      UOpPtr here = copy_to(p, own->device);
      if (p->device != own->device) multi_stats().copies++;
      acc = acc ? combine(op, acc, here) : here;
    }
    out.parts.push_back(acc);
  }
  return out;
}

// The output axis that a reshape of `in` split along `axis` to `out` keeps split, or -1 when the
// split axis does not survive as one dimension with the same elements before it.
int64_t reshaped_axis(const Shape& in, const Shape& out, int64_t axis, size_t n) {
  int64_t before = 1;
  for (int64_t i = 0; i < axis; i++) before *= in[static_cast<size_t>(i)];
  int64_t acc = 1;
  for (size_t j = 0; j < out.size(); j++) {
    if (acc == before && out[j] != 1) return out[j] % static_cast<int64_t>(n) == 0 ? static_cast<int64_t>(j) : -1;
    acc *= out[j];
    if (acc > before) return -1;
  }
  return -1;
}

class MultiRewriter {
 public:
  std::vector<Lowered> run(const std::vector<UOpPtr>& outputs) {
    auto descend = [](const UOp& u) { return !u.realized && !u.realized_multi; };
    for (auto& u : toposort(outputs, descend)) memo_[u.get()] = rewrite(u);
    std::vector<Lowered> out;
    for (auto& o : outputs) out.push_back(memo_.at(o.get()));
    return out;
  }

 private:
  std::unordered_map<const UOp*, Lowered> memo_;

  const Lowered& of(const UOpPtr& u) const { return memo_.at(u.get()); }
  static Lowered one(UOpPtr u) { return Lowered{{std::move(u)}, -1}; }

  Lowered rewrite(const UOpPtr& u) {
    if (u->realized_multi) return Lowered{u->realized_multi->src, u->realized_multi->arg_int()};
    if (u->realized) return one(u);
    if (!is_device_tuple(u->device)) return rewrite_single(u);
    return rewrite_tuple(u);
  }

  // A node on one device: unchanged unless it reads a tuple (a COPY gathering the parts) or its
  // sources were rewritten.
  Lowered rewrite_single(const UOpPtr& u) {
    if (u->op == Op::COPY && is_device_tuple(u->src[0]->device)) return one(gather_to(of(u->src[0]), u->device));
    bool changed = false;
    std::vector<UOpPtr> src;
    for (auto& s : u->src) {
      const Lowered& l = of(s);
      TG_ASSERT(l.parts.size() == 1, op_name(u->op), " on ", u->device, " reads ", s->device);
      changed |= l.parts[0] != s;
      src.push_back(l.parts[0]);
    }
    if (!changed) return one(u);
    return one(make_uop(u->op, u->dtype, std::move(src), u->arg, u->shape, u->device));
  }

  static UOpPtr gather_to(const Lowered& x, const std::string& device) {
    if (x.axis < 0) {
      for (auto& p : x.parts)
        if (p->device == device) return p;
      multi_stats().copies++;
      return copy_to(x.parts[0], device);
    }
    multi_stats().allgathers++;
    return assemble(x.parts, x.axis, device);
  }

  Lowered rewrite_tuple(const UOpPtr& u) {
    const auto devices = split_devices(u->device);
    switch (u->op) {
      case Op::MULTI: {
        Lowered out{{}, u->arg_int()};
        for (auto& s : u->src) out.parts.push_back(of(s).parts.at(0));
        return out;
      }
      case Op::CONST: {
        Lowered out;
        for (auto& d : devices) out.parts.push_back(make_uop(Op::CONST, u->dtype, {}, u->arg, u->shape, d));
        return out;
      }
      case Op::COPY: return replicate(u, devices);
      case Op::CUSTOM_GRAD: return of(u->src[0]);  // its gradient rule was used on the logical graph
      case Op::REDUCE_AXIS: return reduce_parts(u);
      case Op::RESHAPE: return reshape_parts(u, devices.size());
      case Op::PERMUTE: return permute_parts(u);
      case Op::EXPAND: return expand_parts(u, devices.size());
      case Op::PAD: case Op::SHRINK: case Op::FLIP: return window_parts(u, devices.size());
      case Op::GATHER: return gather_parts(u, devices.size());
      case Op::SCATTER_ADD: return scatter_add_parts(u, devices.size());
      default: break;
    }
    if (is_alu(u->op) || u->op == Op::CONTIGUOUS || u->op == Op::DETACH) return elementwise(u, devices.size());
    TG_FAIL(op_name(u->op), " is not supported on a device tuple (", u->device, ")");
  }

  Lowered replicate(const UOpPtr& u, const std::vector<std::string>& devices) {
    const UOpPtr& s = u->src[0];
    TG_CHECK(!is_device_tuple(s->device), "copy from devices ", s->device, " to devices ", u->device,
             " is not supported; copy to one device first");
    const UOpPtr& whole = of(s).parts[0];
    Lowered out;
    for (auto& d : devices) {
      if (d != whole->device) multi_stats().copies++;
      out.parts.push_back(copy_to(whole, d));
    }
    return out;
  }

  // Note [multi-device tensors]: sources split along one axis; replicated ones are cut to the slice.
  Lowered elementwise(const UOpPtr& u, size_t n) {
    Lowered src = elementwise_sources(u, n);
    size_t m = u->src.size();
    Lowered out{{}, src.axis};
    Shape shape = part_shape(u->shape, src.axis, n);
    for (size_t k = 0; k < n; k++) {
      std::vector<UOpPtr> own(src.parts.begin() + static_cast<std::ptrdiff_t>(k * m),
                              src.parts.begin() + static_cast<std::ptrdiff_t>((k + 1) * m));
      std::string device = own[0]->device;
      out.parts.push_back(make_uop(u->op, u->dtype, std::move(own), u->arg, shape, device));
    }
    return out;
  }

  // The sources of an op on one index space (elementwise, SCATTER_ADD), device by device (device
  // k's sources at [k * sources, (k + 1) * sources)), with the axis they are split along.
  Lowered elementwise_sources(const UOpPtr& u, size_t n) {
    int64_t axis = -1;
    for (auto& s : u->src) {
      int64_t a = of(s).axis;
      TG_CHECK(a < 0 || axis < 0 || a == axis, op_name(u->op), ": operands of shape ", shape_str(u->shape),
               " are sharded along different axes (", axis, " and ", a, "); reshard one of them first");
      if (a >= 0) axis = a;
    }
    Lowered out{{}, axis};
    for (size_t k = 0; k < n; k++)
      for (auto& s : u->src) {
        const Lowered& l = of(s);
        out.parts.push_back(l.axis == axis ? l.parts[k] : shrink(l.parts[k], part_bounds(s->shape, axis, k, n)));
      }
    return out;
  }

  // An op on the whole of its operands: applied on each device to all-gathered parts.
  Lowered replicated_op(const UOpPtr& u) {
    Lowered out;
    std::vector<Lowered> src;
    for (auto& s : u->src) src.push_back(all_gather(of(s)));
    for (size_t k = 0; k < src[0].parts.size(); k++) {
      std::vector<UOpPtr> parts;
      for (auto& l : src) parts.push_back(l.parts[k]);
      std::string device = parts[0]->device;
      out.parts.push_back(make_uop(u->op, u->dtype, std::move(parts), u->arg, u->shape, device));
    }
    return out;
  }

  // GATHER reads a whole (replicated) x at the positions each device's part of the index holds:
  // its result is split as the index is.
  Lowered gather_parts(const UOpPtr& u, size_t n) {
    Lowered x = all_gather(of(u->src[0]));
    const Lowered& index = of(u->src[1]);
    int64_t axis = u->arg_ints()[0], a = index.axis;
    Lowered out{{}, a};
    for (size_t k = 0; k < n; k++) {
      UOpPtr whole = a < 0 || a == axis ? x.parts[k] : shrink(x.parts[k], part_bounds(u->src[0]->shape, a, k, n));
      out.parts.push_back(gather(whole, index.parts[k], axis));
    }
    return out;
  }

  // SCATTER_ADD of values and index split along a: along another axis each device's part is its
  // own; along the scatter axis each device adds into the whole, and the partials are all-reduced.
  Lowered scatter_add_parts(const UOpPtr& u, size_t n) {
    Lowered parts = elementwise_sources(u, n);
    int64_t axis = u->arg_ints()[0], size = u->arg_ints()[1];
    std::vector<UOpPtr> out;
    for (size_t k = 0; k < n; k++) {
      const UOpPtr& values = parts.parts[2 * k];
      Shape shape = values->shape;
      shape[static_cast<size_t>(axis)] = size;
      out.push_back(make_uop(Op::SCATTER_ADD, u->dtype, {values, parts.parts[2 * k + 1]}, u->arg, shape, values->device));
    }
    if (parts.axis == axis) return all_reduce(out, Op::ADD);
    return Lowered{out, parts.axis};
  }

  Lowered reduce_parts(const UOpPtr& u) {
    const Lowered& x = of(u->src[0]);
    const auto& ra = u->arg_reduce();
    std::vector<UOpPtr> partials;
    for (auto& p : x.parts) partials.push_back(reduce(p, ra.op, ra.axes));
    if (x.axis >= 0 && std::count(ra.axes.begin(), ra.axes.end(), x.axis)) return all_reduce(partials, ra.op);
    return Lowered{partials, x.axis};
  }

  Lowered reshape_parts(const UOpPtr& u, size_t n) {
    const Lowered& x = of(u->src[0]);
    if (x.axis < 0) return per_part(x, [&](const UOpPtr& p) { return reshape(p, u->shape); });
    int64_t axis = reshaped_axis(u->src[0]->shape, u->shape, x.axis, n);
    if (axis < 0) return replicated_op(u);
    Shape shape = part_shape(u->shape, axis, n);
    Lowered out = per_part(x, [&](const UOpPtr& p) { return reshape(p, shape); });
    out.axis = axis;
    return out;
  }

  Lowered permute_parts(const UOpPtr& u) {
    const Lowered& x = of(u->src[0]);
    const auto& order = u->arg_ints();
    Lowered out = per_part(x, [&](const UOpPtr& p) { return permute(p, order); });
    if (x.axis >= 0) out.axis = std::find(order.begin(), order.end(), x.axis) - order.begin();
    return out;
  }

  Lowered expand_parts(const UOpPtr& u, size_t n) {
    const Lowered& x = of(u->src[0]);
    Shape shape = part_shape(u->shape, x.axis, n);
    Lowered out = per_part(x, [&](const UOpPtr& p) { return expand(p, shape); });
    out.axis = x.axis;
    return out;
  }

  // PAD, SHRINK and FLIP: per device when they leave the split axis whole, else on the whole.
  Lowered window_parts(const UOpPtr& u, size_t n) {
    const Lowered& x = of(u->src[0]);
    if (x.axis < 0 || touches_axis(u, x.axis)) return replicated_op(u);
    Lowered out = per_part(x, [&](const UOpPtr& p) {
      if (u->op == Op::FLIP) return flip(p, u->arg_ints());
      const auto& a = u->arg_ints();
      Pads pairs;
      for (size_t i = 0; i < p->shape.size(); i++) pairs.push_back({a[2 * i], a[2 * i + 1]});
      if (u->op == Op::PAD) return pad(p, pairs);
      pairs[static_cast<size_t>(x.axis)] = {0, p->shape[static_cast<size_t>(x.axis)]};
      return shrink(p, pairs);
    });
    out.axis = x.axis;
    (void)n;
    return out;
  }

  static bool touches_axis(const UOpPtr& u, int64_t axis) {
    const auto& a = u->arg_ints();
    auto ax = static_cast<size_t>(axis);
    if (u->op == Op::FLIP) return std::count(a.begin(), a.end(), axis) > 0;
    if (u->op == Op::PAD) return a[2 * ax] != 0 || a[2 * ax + 1] != 0;
    return a[2 * ax] != 0 || a[2 * ax + 1] != u->src[0]->shape[ax];  // SHRINK
  }

  template <class F>
  static Lowered per_part(const Lowered& x, F f) {
    Lowered out{{}, x.axis};
    for (auto& p : x.parts) out.parts.push_back(f(p));
    return out;
  }
};

}  // namespace

bool has_multi(const std::vector<UOpPtr>& outputs) {
  if (!device_tuples_made()) return false;  // no tuple was ever named: no walk over the graph
  bool found = false;
  toposort(outputs, [&](const UOp& u) {
    found |= is_device_tuple(u.device);
    return !found && !u.realized;
  });
  return found;
}

std::vector<Lowered> lower_multi(const std::vector<UOpPtr>& outputs) { return MultiRewriter().run(outputs); }

int64_t multi_axis(const UOpPtr& x) {
  if (!is_device_tuple(x->device)) return -1;
  MultiStats kept = multi_stats();  // an analysis, not a realization: nothing was inserted
  int64_t axis = lower_multi({x})[0].axis;
  multi_stats() = kept;
  return axis;
}

UOpPtr make_multi(const std::vector<UOpPtr>& parts, int64_t axis) {
  TG_ASSERT(!parts.empty(), "MULTI of no parts");
  std::vector<std::string> devices;
  for (auto& p : parts) {
    TG_ASSERT(p->shape == parts[0]->shape && p->dtype == parts[0]->dtype, "MULTI parts differ: ", p->str(0), " vs ",
              parts[0]->str(0));
    devices.push_back(p->device);
  }
  Shape shape = parts[0]->shape;
  if (axis >= 0) shape[static_cast<size_t>(axis)] *= static_cast<int64_t>(parts.size());
  return make_uop(Op::MULTI, parts[0]->dtype, parts, Arg{axis}, shape, join_devices(devices));
}

namespace {
std::vector<std::string> canonical_tuple(const std::vector<std::string>& devices) {
  TG_CHECK(!devices.empty(), "shard: no devices given");
  std::vector<std::string> out;
  for (auto& d : devices) {
    std::string c = canonical_device(d);
    TG_CHECK(!is_device_tuple(c), "shard: '", d, "' is not one device");
    TG_CHECK(std::find(out.begin(), out.end(), c) == out.end(), "shard: device ", c, " is named twice in ",
             join_devices(devices));
    get_device(c);  // fails early, naming the device, when it is not built
    out.push_back(c);
  }
  return out;
}
}  // namespace

UOpPtr shard_uop(const UOpPtr& x, const std::vector<std::string>& devices, int64_t axis) {
  auto devs = canonical_tuple(devices);
  std::string tuple = join_devices(devs);
  size_t n = devs.size();
  UOpPtr whole = x;
  if (is_device_tuple(x->device)) {
    int64_t now = multi_axis(x);
    if (x->device == tuple && now == axis) return x;
    // a replicated tensor on the same tuple is cut where it lies; anything else is gathered first
    if (!(x->device == tuple && now < 0)) whole = copy_to(x, split_devices(x->device)[0]);
  }
  if (axis < 0) return n == 1 ? copy_to(whole, devs[0]) : copy_to(whole, tuple);
  TG_CHECK(axis < static_cast<int64_t>(x->shape.size()), "shard: axis ", axis, " is out of range for shape ",
           shape_str(x->shape));
  int64_t size = x->shape[static_cast<size_t>(axis)];
  TG_CHECK(size % static_cast<int64_t>(n) == 0, "shard: axis ", axis, " of size ", size, " (shape ",
           shape_str(x->shape), ") does not split evenly over ", n, " devices (", size, " % ", n, " = ",
           size % static_cast<int64_t>(n), ")");
  if (n == 1) return copy_to(whole, devs[0]);
  std::vector<UOpPtr> parts;
  for (size_t i = 0; i < n; i++) parts.push_back(copy_to(shrink(whole, part_bounds(x->shape, axis, i, n)), devs[i]));
  return make_multi(parts, axis);
}

std::vector<UOpPtr> multi_gradient(const UOpPtr& u, const UOpPtr& g) {
  int64_t axis = u->arg_int();
  std::vector<UOpPtr> out;
  for (size_t i = 0; i < u->src.size(); i++) {
    const std::string& device = u->src[i]->device;
    if (axis < 0) out.push_back(i == 0 ? copy_to(g, device) : nullptr);  // the parts are one value
    else out.push_back(copy_to(shrink(g, part_bounds(u->shape, axis, i, u->src.size())), device));
  }
  return out;
}

}  // namespace tg
