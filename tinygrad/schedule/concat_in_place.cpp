// Concatenations stored in place (see concat_in_place.h).
//
// Note [concatenations stored in place]: data parallelism all-reduces a bucket, the
// concatenation of many gradients flattened (Tensor::cat: the pieces padded to the full length
// and added). As a kernel of its own the concatenation reads every gradient back after backward
// wrote it and writes it again, one more kernel and one more pass over the gradients per step.
// PyTorch's DDP avoids it with gradient_as_bucket_view; here the scheduler does it for any 1-d
// concatenation that is a realize point: a piece whose value is a realize point P of the same
// schedule (under reshapes and detaches, which keep the elements' order) gets as its buffer a
// view of the concatenation's buffer at the piece's offset, so P's kernel stores its values
// where the concatenation has them, and the concatenation itself is no kernel. The pieces that
// cannot be placed (a constant, an existing buffer, a value of another dtype, an output of the
// schedule, P already placed in another concatenation) are written by one kernel per run of
// neighbouring such pieces; a concatenation is stored in place only where at least one piece is
// placed and one kernel at most writes the others, so it never costs more kernels than before.
//
// Views need a device whose buffers are addresses (Feature::AddressableMemory) and an offset that
// the device's policy allows (DevicePolicy::view_alignment: any element's on the CPU, 256 bytes
// on CUDA, whose library matmuls assume that of their buffers' starts). P's other readers read
// the view like any buffer. The concatenation is "sealed" when nothing but it reads its placed
// pieces: then an all-reduce of it may run in place (schedule.cpp, Note [all-reduces in place]).
#include "tinygrad/schedule/concat_in_place.h"

#include <algorithm>

#include "tinygrad/device.h"
#include "tinygrad/lazy.h"

namespace tg {

namespace {

using NodeSet = std::unordered_set<const UOp*>;
using ReadersFn = std::function<const std::vector<const UOp*>&(const UOp*)>;

bool read_once(const UOp* n, const ReadersFn& readers) { return readers(n).size() == 1; }

// The PADs that u adds up, each a piece of a 1-d concatenation, or nothing when u is not one. The
// additions under u and the PADs are read once, so they belong to u's kernel alone.
std::vector<const UOp*> concat_pads(const UOp* u, const NodeSet& realize, const ReadersFn& readers) {
  std::vector<const UOp*> pads, stack{u};
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (n != u && (realize.count(n) || !read_once(n, readers))) return {};
    if (n->op == Op::ADD) {
      stack.push_back(n->src[1].get());
      stack.push_back(n->src[0].get());
    } else if (n->op == Op::PAD && n->shape.size() == 1 && n != u) {
      pads.push_back(n);
    } else {
      return {};
    }
  }
  return pads;
}

// The pieces of the concatenation, by begin, or nothing when the PADs do not tile it exactly.
std::vector<ConcatPiece> tiling_pieces(const UOp* u, const std::vector<const UOp*>& pads) {
  std::vector<ConcatPiece> pieces;
  for (const UOp* p : pads) {
    const auto& pad = p->arg_ints();
    pieces.push_back({pad[0], u->shape[0] - pad[1], p->src[0], nullptr});
  }
  std::sort(pieces.begin(), pieces.end(), [](const ConcatPiece& a, const ConcatPiece& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (auto& p : pieces) {
    if (p.begin != at) return {};
    at = p.end;
  }
  if (at != u->shape[0]) return {};
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const ConcatPiece& p) { return p.begin == p.end; }),
               pieces.end());
  return pieces;
}

// The realize points whose buffer a view may be (a kernel computes them into the buffer it is
// given): not copies, collectives, template kernels or convolutions kept with their nodes.
bool computed_by_a_kernel(const UOp& n) {
  return n.op != Op::COPY && op_group(n.op) != OpGroup::Collective && n.op != Op::TEMPLATE_KERNEL &&
         n.op != Op::CUSTOM_GRAD;
}

// Whether permutation q of a node of shape `in` keeps its elements' order (moves size-1 dims only).
bool keeps_order(const std::vector<int64_t>& q, const Shape& in) {
  int64_t last = -1;
  for (int64_t d : q) {
    if (in[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

// The way down from a piece's value to the node that computes it: reshapes, detaches and
// permutes (adjacent permutes composed), which either keep the elements' order or not.
struct PieceSource {
  const UOp* node = nullptr;      // the first realize point, resident node or computed node below the views
  const UOp* permuted = nullptr;  // the highest permute on the way (only reshapes and detaches above it)
  bool in_order = true;           // the views keep the order of node's elements
  bool read_once = true;          // every node on the way, node included, has one reader
};

PieceSource piece_source(const UOpPtr& value, const NodeSet& realize, const ReadersFn& readers,
                         const std::function<bool(const UOp*)>& is_resident) {
  PieceSource src;
  const UOp* n = value.get();
  std::vector<int64_t> run;  // the composed permutation of the current run of permutes
  auto end_run = [&](const UOp* below) {
    if (!run.empty() && !keeps_order(run, below->shape)) src.in_order = false;
    run.clear();
  };
  src.read_once = read_once(n, readers);
  while (!realize.count(n) && !is_resident(n) &&
         (n->op == Op::RESHAPE || n->op == Op::DETACH || n->op == Op::PERMUTE)) {
    if (n->op == Op::PERMUTE) {
      if (!src.permuted) src.permuted = n;
      const auto& inner = n->arg_ints();
      if (run.empty()) {
        run = inner;
      } else {  // the run so far reads this permute's output: compose
        for (auto& d : run) d = inner[static_cast<size_t>(d)];
      }
    } else if (n->op == Op::RESHAPE) {
      end_run(n);
    }
    n = n->src[0].get();
    src.read_once = src.read_once && read_once(n, readers);
  }
  end_run(n);
  src.node = n;
  return src;
}

// Where the piece can be computed in place: its source node when the views keep its order;
// else, where `relayout` allows, the permute above a realize point that only this piece reads
// and that is recomputable in the piece's order (a CONTIGUOUS copy: the CPU's channel-last weight
// gradient, Note [channel-last convolutions] in tensor_nn.cpp), which becomes the realize point
// in its stead. Null where neither.
// With `change`, makes the permute the realize point where it takes the source's place.
const UOp* place_of(const UOp* u, const PieceSource& src, const NodeSet& outputs,
                    const std::function<bool(const UOp*)>& is_resident, bool relayout, NodeSet& realize, bool change) {
  const UOp* n = src.node;
  if (!realize.count(n) || is_resident(n) || outputs.count(n) || n->dtype != u->dtype || n->device != u->device)
    return nullptr;
  if (src.in_order) return computed_by_a_kernel(*n) ? n : nullptr;
  if (!relayout || !src.permuted || !src.read_once || n->op != Op::CONTIGUOUS) return nullptr;
  if (change) {
    realize.erase(n);
    realize.insert(src.permuted);
  }
  return src.permuted;
}

}  // namespace

ConcatsInPlace plan_concats_in_place(const std::vector<UOpPtr>& order, NodeSet& realize, const NodeSet& outputs,
                                     const ReadersFn& readers, const std::function<bool(const UOp*)>& is_resident,
                                     const std::function<bool(const std::string&)>& relayout) {
  ConcatsInPlace out;
  for (auto& node : order) {
    const UOp* u = node.get();
    if (!realize.count(u) || u->op != Op::ADD || u->shape.size() != 1 || is_resident(u)) continue;
    Device& dev = get_device(u->device);
    if (!dev.supports(Feature::AddressableMemory)) continue;
    const size_t align = dev.policy().view_alignment;
    auto pads = concat_pads(u, realize, readers);
    if (pads.empty()) continue;
    ConcatInPlace plan{tiling_pieces(u, pads), true};
    // first without changing any realize point: is the concatenation worth storing in place?
    std::vector<PieceSource> sources;
    size_t placeable = 0, runs = 0;
    bool in_run = false;
    NodeSet seen;
    for (auto& piece : plan.pieces) {
      sources.push_back(piece_source(piece.value, realize, readers, is_resident));
      const PieceSource& src = sources.back();
      const size_t offset = static_cast<size_t>(piece.begin) * itemsize(u->dtype);
      const UOp* n = src.in_order ? src.node : src.permuted;
      const bool fits = n && !out.placed.count(n) && seen.insert(n).second && (align == 0 || offset % align == 0) &&
                        place_of(u, src, outputs, is_resident, relayout(u->device), realize, false);
      placeable += fits;
      runs += !fits && !in_run;
      in_run = !fits;
      if (!fits) sources.back().node = nullptr;
    }
    if (placeable == 0 || runs > 1) continue;
    for (size_t i = 0; i < plan.pieces.size(); i++) {
      if (!sources[i].node) continue;
      const UOp* n = place_of(u, sources[i], outputs, is_resident, relayout(u->device), realize, true);
      plan.pieces[i].placed = n;
      plan.sealed = plan.sealed && sources[i].read_once;
      out.placed[n] = {u, plan.pieces[i].begin};
    }
    out.concats.emplace(u, std::move(plan));
  }
  return out;
}

UOpPtr concat_run_value(const std::vector<ConcatPiece>& pieces, size_t first, size_t last) {
  const int64_t begin = pieces[first].begin, end = pieces[last - 1].end;
  UOpPtr sum;
  for (size_t i = first; i < last; i++) {
    UOpPtr padded = lazy::pad(pieces[i].value, {{pieces[i].begin - begin, end - pieces[i].end}});
    sum = sum ? lazy::alu(Op::ADD, sum, padded) : padded;
  }
  // a value that is itself a realize point is read from its buffer, not computed again
  return lazy::detach(sum);
}

}  // namespace tg
