// Tensors over several devices of one process: the logical nodes on a device tuple, the rewrite
// that lowers them into per-device graphs, and the copies and reductions it inserts between the
// devices (the collectives of one process, as ordinary copy and add kernels).
#include "tinygrad/multi.h"

#include <algorithm>
#include <atomic>
#include <optional>
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
//    the device's slice where it lies (no copy; below its EXPAND: Note [cutting an expand]).
//    Operands split along different axes are refused;
//  - a reduction runs on each device; when it reduces over the split axis, its partial results
//    are all-reduced (every device adds all parts, in the same order, so the copies stay equal);
//  - reshape, permute and expand keep the split axis when it stays one dimension of the result
//    with the same elements before it (a reshape may also regroup it: Note [grouped splits]);
//    pad, shrink and flip that leave the split axis alone run per device. When they touch the
//    split axis, they first all-gather their operand (each device assembles the whole from every
//    part), then run replicated;
//  - GATHER (embeddings) reads the whole table at each device's part of the index, so its result
//    is split as the index is (a table split as the index is, along another axis, is read part
//    by part: cross-entropy's logits at the targets); SCATTER_ADD, its gradient, adds each device's part, and when the
//    split axis is the scatter axis the partial sums are all-reduced;
//  - a COPY from a tuple to one device gathers the parts there;
//  - an ALLREDUCE across the ranks (a collective node of the distributed layer) of a split
//    tensor is one such node per device, on that device's part: Note [an all-reduce across the
//    ranks of a split tensor].
// The parts are ordinary single-device graphs: the scheduler, the kernels and the JIT see nothing
// new, and the kernels of one device's part are the single-device kernels on smaller shapes.
// Uneven splits are refused (shard_uop names the sizes). "CPU" and "CPU:0" are one device
// (canonical_device), so a tuple written either way is the same tuple.
//
// Note [an all-reduce across the ranks of a split tensor]: under tensor parallel x data parallel
// (Note [split gradients across the ranks] in distributed/data_parallel.cpp) each rank holds a
// gradient split over its devices, and each device's part is to be summed with the same part on
// every other rank. The rank all-reduce of a split tensor is therefore lowered into one ALLREDUCE
// per device, each reading and writing that device's part only, and the result keeps the
// operand's layout: nothing is gathered or copied between the devices. The per-device nodes are
// ordinary collective items for the group's runner, issued in schedule order, which is the same
// on every rank. A replicated operand is refused: its copies are one value, and the caller
// all-reduces it from one device (Note [collectives of a tensor over several devices] in
// distributed/collective_runner.cpp).
//
// Note [grouped splits]: a split may also be grouped: the split axis, of size S, is viewed as
// [g, S/g] and each device holds its n-th of every group (device k: [k S/(g n), (k+1) S/(g n))
// of each). g = 1 is the plain split. Tensor parallel attention needs it: c_attn's output [.., 3D]
// holds q, k and v side by side, and split by heads (g = 3) each device holds its heads of all
// three. Over the flat elements, a split of g groups along axis a is the layout [outer, n, inner]
// with outer = (elements before a) * g, device k holding [:, k, :]. A reshape keeps the flat
// order, so its result is split along the dim j with P = (elements before j) dividing outer and
// out[j] a multiple of (outer / P) * n, in outer / P groups: [B, T, 3D] in 3 groups becomes
// [B, T, 3, H, hd] split along H (one group), and [B, T, H, hd] split along H becomes [B, T, D]
// split along D. At most one dim qualifies (P * out[j] > outer); when none does, the operand is
// gathered first. Slicing a replicated operand, assembling the whole and the gradient of a
// grouped MULTI go through the [.., g, S/g, ..] view, where the split is a plain one.
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
//
// Note [collectives through a device library]: where every device of the tuple has a library
// for collectives between devices (its policy's collective_library: NCCL on CUDA where libnccl
// loads) and MULTI_LIBRARY is on, the all-reduces and all-gathers run through it instead, as one
// call over all the devices (tuple_collectives in device.h decides, once per tuple, and DEBUG=1
// says which way a tuple goes). Device k's result is a collective node on device k whose sources
// are every device's operand (make_device_collective); the scheduler makes the n results one
// item (Note [one item for a collective between devices] in schedule/schedule.cpp), and the
// runner the library registered for the tuple runs it on the devices' communication streams,
// ordered with their compute streams by events (runtime/cuda_nccl.cpp). An all-reduce keeps its
// shape. An all-gather concatenates the parts' elements ([n * part] on every device), so each
// device views its result as [n, part] and moves the device axis to where the split was: a
// permute and reshape that fuse into the readers. Nothing else changes: the tuples of other
// devices (CPU:n, CL, a mixed tuple) keep the copy and add kernels, and so do gathers to one
// device and copies to a tuple. One pattern becomes a reduce-scatter: an all-reduce's result
// sharded again over its devices (as_reduce_scatter).

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

// The shape with the split axis viewed as [groups, size / groups] (Note [grouped splits]).
Shape grouped_shape(const Shape& s, int64_t axis, int64_t groups) {
  Shape out(s.begin(), s.begin() + axis);
  out.push_back(groups);
  out.push_back(s[static_cast<size_t>(axis)] / groups);
  out.insert(out.end(), s.begin() + axis + 1, s.end());
  return out;
}

// The bounds of part i of n along axis (every other dimension whole).
Pads part_bounds(const Shape& s, int64_t axis, size_t i, size_t n) {
  Pads b;
  for (int64_t d : s) b.push_back({0, d});
  int64_t size = s[static_cast<size_t>(axis)] / static_cast<int64_t>(n);
  b[static_cast<size_t>(axis)] = {size * static_cast<int64_t>(i), size * static_cast<int64_t>(i + 1)};
  return b;
}

// Part k of n of a whole node split along axis in groups (Note [grouped splits]).
UOpPtr part_of(const UOpPtr& whole, SplitLayout split, size_t k, size_t n) {
  if (split.groups == 1) return shrink(whole, part_bounds(whole->shape, split.axis, k, n));
  Shape view = grouped_shape(whole->shape, split.axis, split.groups);
  UOpPtr part = shrink(reshape(whole, view), part_bounds(view, split.axis + 1, k, n));
  return reshape(part, part_shape(whole->shape, split.axis, n));
}

// Part k of n of a replicated operand of a split op. Note [cutting an expand]: a broadcast operand
// (a matmul's A, expanded over the columns that the other operand splits) is cut below its
// EXPAND: the part is the source (cut itself where the split axis is not broadcast) expanded to
// the part's shape, the graph the single-device op on the smaller shapes has. A shrink above the
// EXPAND would hide the broadcast from the scheduler, which then recomputes a computed operand
// for every column (Note [product operands] in schedule/schedule.cpp).
UOpPtr cut(const UOpPtr& whole, SplitLayout split, size_t k, size_t n) {
  if (whole->op != Op::EXPAND || whole->realized) return part_of(whole, split, k, n);
  const UOpPtr& src = whole->src[0];
  bool broadcast = src->shape[static_cast<size_t>(split.axis)] == 1;
  return expand(broadcast ? src : part_of(src, split, k, n), part_shape(whole->shape, split.axis, n));
}

UOpPtr combine(Op op, const UOpPtr& a, const UOpPtr& b) {
  return alu(a->dtype == DType::Bool && op == Op::ADD ? Op::OR : op, a, b);
}

UOpPtr assemble_plain(const std::vector<UOpPtr>& parts, int64_t axis, const std::string& device);

// The whole of a node split as `split`, assembled on `device` from its parts.
UOpPtr assemble(const std::vector<UOpPtr>& parts, SplitLayout split, const std::string& device) {
  if (split.groups == 1) return assemble_plain(parts, split.axis, device);
  const size_t n = parts.size();
  Shape whole = parts[0]->shape;
  whole[static_cast<size_t>(split.axis)] *= static_cast<int64_t>(n);
  std::vector<UOpPtr> viewed;
  for (auto& p : parts) viewed.push_back(reshape(p, grouped_shape(p->shape, split.axis, split.groups)));
  return reshape(assemble_plain(viewed, split.axis + 1, device), whole);
}

// The whole of a node split along axis in one group, assembled on `device` from its parts.
UOpPtr assemble_plain(const std::vector<UOpPtr>& parts, int64_t axis, const std::string& device) {
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

// The library that runs collectives between the devices of `parts` (Note [collectives through a
// device library]): its runner's group id, or 0 for copy and add kernels.
int64_t library_group(const std::vector<UOpPtr>& parts) {
  if (prod(parts[0]->shape) == 0) return 0;
  std::vector<std::string> devices;
  for (auto& p : parts) devices.push_back(p->device);
  return tuple_collectives(devices).group;
}

// Device k's whole from its all-gathered [n * part] elements: [n, part], the device axis moved
// in front of the split's dimension (inside the groups of a grouped split: Note [grouped splits]).
UOpPtr whole_from_gathered(const UOpPtr& gathered, const Shape& part, SplitLayout split, size_t n) {
  Shape view = split.groups == 1 ? part : grouped_shape(part, split.axis, split.groups);
  const auto at = static_cast<size_t>(split.axis) + (split.groups == 1 ? 0 : 1);
  Shape stacked{static_cast<int64_t>(n)};
  stacked.insert(stacked.end(), view.begin(), view.end());
  std::vector<int64_t> order;
  for (size_t i = 1; i <= at; i++) order.push_back(static_cast<int64_t>(i));
  order.push_back(0);
  for (size_t i = at + 1; i < stacked.size(); i++) order.push_back(static_cast<int64_t>(i));
  Shape whole = part;
  whole[static_cast<size_t>(split.axis)] *= static_cast<int64_t>(n);
  return reshape(permute(reshape(gathered, stacked), order), whole);
}

// Note [collectives through a device library]
Lowered library_all_gather(const Lowered& x, int64_t group) {
  const size_t n = x.parts.size();
  const Shape part = x.parts[0]->shape;
  std::vector<UOpPtr> flat;
  for (auto& p : x.parts) flat.push_back(reshape(p, {prod(part)}));
  const CollectiveArg arg{Op::ADD, group, static_cast<int64_t>(n)};
  Lowered out;
  for (size_t k = 0; k < n; k++)
    out.parts.push_back(whole_from_gathered(make_device_collective(Op::ALLGATHER, flat, arg, k), part, x.layout(), n));
  multi_stats().library++;
  return out;
}

Lowered library_all_reduce(const std::vector<UOpPtr>& partials, Op op, int64_t group) {
  const CollectiveArg arg{op, group, static_cast<int64_t>(partials.size())};
  Lowered out;
  for (size_t k = 0; k < partials.size(); k++) out.parts.push_back(make_device_collective(Op::ALLREDUCE, partials, arg, k));
  multi_stats().library++;
  return out;
}

// Note [collectives through a device library]: a library all-reduce's result sharded over the
// same devices again (`x.shard(devices, 0).sum(0).shard(devices, 0)`: device k keeps block k) is a
// reduce-scatter: each device receives only its block. Taken where the blocks are contiguous (one
// group, every dimension before the axis of size 1). nullopt: x is not such a sharding.
std::optional<Lowered> as_reduce_scatter(const Lowered& x) {
  const size_t n = x.parts.size();
  if (x.axis < 0 || x.groups != 1 || n < 2) return std::nullopt;
  std::vector<UOpPtr> partials;
  CollectiveArg arg;
  for (size_t k = 0; k < n; k++) {
    const UOpPtr& block = x.parts[k];
    if (block->op != Op::SHRINK) return std::nullopt;
    const UOpPtr& viewed = block->src[0];  // the all-reduced value, perhaps reshaped (same element order)
    UOpPtr reduced = viewed;
    while (reduced->op == Op::RESHAPE) reduced = reduced->src[0];
    if (reduced->op != Op::ALLREDUCE || reduced->src.size() != n || (k > 0 && reduced->src != partials))
      return std::nullopt;
    if (k == 0) {
      partials = reduced->src;
      arg = reduced->arg_collective();
    }
    if (reduced->device != partials[k]->device) return std::nullopt;  // device k's result
    for (int64_t d = 0; d < x.axis; d++)
      if (viewed->shape[static_cast<size_t>(d)] != 1) return std::nullopt;
    std::vector<int64_t> bounds;
    for (auto [lo, hi] : part_bounds(viewed->shape, x.axis, k, n)) bounds.insert(bounds.end(), {lo, hi});
    if (block->arg_ints() != bounds) return std::nullopt;
  }
  std::vector<UOpPtr> flat;
  for (auto& p : partials) flat.push_back(reshape(p, {prod(p->shape)}));
  Lowered out{{}, x.axis, 1};
  for (size_t k = 0; k < n; k++)
    out.parts.push_back(reshape(make_device_collective(Op::REDUCE_SCATTER, flat, arg, k), x.parts[k]->shape));
  multi_stats().reduce_scatters++;
  return out;
}

Lowered all_gather(const Lowered& x) {
  if (x.axis < 0) return x;
  multi_stats().allgathers++;
  if (int64_t group = library_group(x.parts)) return library_all_gather(x, group);
  Lowered out;
  for (auto& part : x.parts) out.parts.push_back(assemble(x.parts, x.layout(), part->device));
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
  if (int64_t group = library_group(partials)) return library_all_reduce(partials, op, group);
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

// The split of a reshape of `in` split as `split` to `out` (Note [grouped splits]), or axis -1
// when no dimension of `out` carries it.
SplitLayout reshaped_split(const Shape& in, const Shape& out, SplitLayout split, size_t n) {
  int64_t outer = split.groups;
  for (int64_t i = 0; i < split.axis; i++) outer *= in[static_cast<size_t>(i)];
  const auto devices = static_cast<int64_t>(n);
  int64_t before = 1;
  for (size_t j = 0; j < out.size() && before > 0 && before <= outer; j++) {
    if (outer % before == 0 && out[j] % (outer / before * devices) == 0)
      return {static_cast<int64_t>(j), outer / before};
    before *= out[j];
  }
  return {};
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
  static Lowered one(UOpPtr u) { return Lowered{{std::move(u)}, -1, 1}; }

  Lowered multi_parts(const UOpPtr& multi) const {
    const auto& a = multi->arg_ints();
    Lowered out{{}, a[0], a[1]};
    for (auto& s : multi->src) out.parts.push_back(memo_.count(s.get()) ? of(s).parts.at(0) : s);
    if (auto scattered = as_reduce_scatter(out)) return *scattered;
    return out;
  }

  Lowered rewrite(const UOpPtr& u) {
    if (u->realized_multi) return multi_parts(u->realized_multi);
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
    return assemble(x.parts, x.layout(), device);
  }

  Lowered rewrite_tuple(const UOpPtr& u) {
    const auto devices = split_devices(u->device);
    switch (u->op) {
      case Op::MULTI: return multi_parts(u);
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
      case Op::ALLREDUCE: return rank_all_reduce_parts(u);
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
    Lowered out{{}, src.axis, src.groups};
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
    SplitLayout split;
    for (auto& s : u->src) {
      SplitLayout a = of(s).layout();
      TG_CHECK(a.axis < 0 || split.axis < 0 || a.axis == split.axis, op_name(u->op), ": operands of shape ",
               shape_str(u->shape), " are sharded along different axes (", split.axis, " and ", a.axis,
               "); reshard one of them first");
      TG_CHECK(a.axis < 0 || split.axis < 0 || a.groups == split.groups, op_name(u->op), ": operands of shape ",
               shape_str(u->shape), " are sharded along axis ", a.axis, " in different groups (", split.groups, " and ",
               a.groups, "); reshard one of them first");
      if (a.axis >= 0) split = a;
    }
    Lowered out{{}, split.axis, split.groups};
    for (size_t k = 0; k < n; k++)
      for (auto& s : u->src) {
        const Lowered& l = of(s);
        out.parts.push_back(l.axis == split.axis ? l.parts[k] : cut(l.parts[k], split, k, n));
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

  // GATHER reads x at the positions each device's part of the index holds: its result is split
  // as the index is. An x split as the index is, along another axis than the gathered one, is
  // read part by part (cross-entropy's logits, split by rows, at each row's target); any other x
  // is read whole (a replicated table, or all-gathered).
  Lowered gather_parts(const UOpPtr& u, size_t n) {
    const Lowered& index = of(u->src[1]);
    int64_t axis = u->arg_ints()[0], a = index.axis;
    Lowered out{{}, a, index.groups};
    const Lowered& split = of(u->src[0]);
    if (a >= 0 && a != axis && split.axis == a && split.groups == index.groups) {
      for (size_t k = 0; k < n; k++) out.parts.push_back(gather(split.parts[k], index.parts[k], axis));
      return out;
    }
    Lowered x = all_gather(split);
    for (size_t k = 0; k < n; k++) {
      UOpPtr whole = a < 0 || a == axis ? x.parts[k] : part_of(x.parts[k], index.layout(), k, n);
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
    return Lowered{out, parts.axis, parts.groups};
  }

  Lowered reduce_parts(const UOpPtr& u) {
    const Lowered& x = of(u->src[0]);
    const auto& ra = u->arg_reduce();
    std::vector<UOpPtr> partials;
    for (auto& p : x.parts) partials.push_back(reduce(p, ra.op, ra.axes));
    if (x.axis >= 0 && std::count(ra.axes.begin(), ra.axes.end(), x.axis)) return all_reduce(partials, ra.op);
    return Lowered{partials, x.axis, x.groups};
  }

  Lowered reshape_parts(const UOpPtr& u, size_t n) {
    const Lowered& x = of(u->src[0]);
    if (x.axis < 0) return per_part(x, [&](const UOpPtr& p) { return reshape(p, u->shape); });
    SplitLayout split = reshaped_split(u->src[0]->shape, u->shape, x.layout(), n);
    if (split.axis < 0) return replicated_op(u);
    Shape shape = part_shape(u->shape, split.axis, n);
    Lowered out = per_part(x, [&](const UOpPtr& p) { return reshape(p, shape); });
    out.axis = split.axis, out.groups = split.groups;
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

  // Note [an all-reduce across the ranks of a split tensor]
  Lowered rank_all_reduce_parts(const UOpPtr& u) {
    const Lowered& x = of(u->src[0]);
    TG_CHECK(x.axis >= 0, "ALLREDUCE across the ranks of a tensor replicated over ", u->device,
             ": all-reduce it from one of the devices (each copy would cross the network)");
    const CollectiveArg arg = u->arg_collective();
    return per_part(x, [&](const UOpPtr& p) { return make_collective(Op::ALLREDUCE, p, arg); });
  }

  template <class F>
  static Lowered per_part(const Lowered& x, F f) {
    Lowered out{{}, x.axis, x.groups};
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

SplitLayout multi_layout(const UOpPtr& x) {
  if (!is_device_tuple(x->device)) return {};
  MultiStats kept = multi_stats();  // an analysis, not a realization: nothing was inserted
  SplitLayout split = lower_multi({x})[0].layout();
  multi_stats() = kept;
  return split;
}

int64_t multi_axis(const UOpPtr& x) { return multi_layout(x).axis; }

UOpPtr make_multi(const std::vector<UOpPtr>& parts, int64_t axis, int64_t groups) {
  TG_ASSERT(!parts.empty(), "MULTI of no parts");
  std::vector<std::string> devices;
  for (auto& p : parts) {
    TG_ASSERT(p->shape == parts[0]->shape && p->dtype == parts[0]->dtype, "MULTI parts differ: ", p->str(0), " vs ",
              parts[0]->str(0));
    devices.push_back(p->device);
  }
  Shape shape = parts[0]->shape;
  if (axis >= 0) shape[static_cast<size_t>(axis)] *= static_cast<int64_t>(parts.size());
  TG_ASSERT(groups >= 1 && (axis >= 0 || groups == 1), "MULTI of ", groups, " groups along axis ", axis);
  return make_uop(Op::MULTI, parts[0]->dtype, parts, Arg{std::vector<int64_t>{axis, groups}}, shape,
                  join_devices(devices));
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

UOpPtr shard_uop(const UOpPtr& x, const std::vector<std::string>& devices, int64_t axis, int64_t groups) {
  auto devs = canonical_tuple(devices);
  std::string tuple = join_devices(devs);
  size_t n = devs.size();
  TG_CHECK(groups >= 1, "shard: groups must be at least 1, got ", groups);
  if (axis < 0) groups = 1;
  UOpPtr whole = x;
  if (is_device_tuple(x->device)) {
    SplitLayout now = multi_layout(x);
    if (x->device == tuple && now == SplitLayout{axis, groups}) return x;
    // a replicated tensor on the same tuple is cut where it lies; anything else is gathered first
    if (!(x->device == tuple && now.axis < 0)) whole = copy_to(x, split_devices(x->device)[0]);
  }
  if (axis < 0) return n == 1 ? copy_to(whole, devs[0]) : copy_to(whole, tuple);
  TG_CHECK(axis < static_cast<int64_t>(x->shape.size()), "shard: axis ", axis, " is out of range for shape ",
           shape_str(x->shape));
  int64_t size = x->shape[static_cast<size_t>(axis)], pieces = static_cast<int64_t>(n) * groups;
  TG_CHECK(size % pieces == 0, "shard: axis ", axis, " of size ", size, " (shape ", shape_str(x->shape),
           ") does not split evenly over ", n, " devices", groups > 1 ? " in " + std::to_string(groups) + " groups" : "",
           " (", size, " % ", pieces, " = ", size % pieces, ")");
  if (n == 1) return copy_to(whole, devs[0]);
  std::vector<UOpPtr> parts;
  for (size_t i = 0; i < n; i++) parts.push_back(copy_to(part_of(whole, {axis, groups}, i, n), devs[i]));
  return make_multi(parts, axis, groups);
}

std::vector<UOpPtr> multi_gradient(const UOpPtr& u, const UOpPtr& g) {
  SplitLayout split{u->arg_ints()[0], u->arg_ints()[1]};
  std::vector<UOpPtr> out;
  for (size_t i = 0; i < u->src.size(); i++) {
    const std::string& device = u->src[i]->device;
    if (split.axis < 0) out.push_back(i == 0 ? copy_to(g, device) : nullptr);  // the parts are one value
    else out.push_back(copy_to(part_of(g, split, i, u->src.size()), device));
  }
  return out;
}

}  // namespace tg
