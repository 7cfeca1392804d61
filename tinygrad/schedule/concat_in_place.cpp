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
// schedule, P already placed in another concatenation, views that reorder P's elements) are
// written by one kernel per run of neighbouring such pieces; a concatenation is stored in place
// only where at least one piece is placed and one kernel at most writes the others, so it never
// costs more kernels than before. A piece whose views reorder its elements (the CPU's channel-
// last weight gradient, Note [channel-last convolutions] in tensor_nn.cpp) is not computed in the
// concatenation's order instead: its kernel's register tiles follow its own order, and the
// 5x5 32->32 layer's second-stage sum took 21 ms a step instead of 2.4 that way (DEBUG=2, a
// loaded 2-core machine); so the CNN's bucket (four such pieces) stays a kernel on the CPU, and
// only its all-reduce runs in place.
//
// Views need a device whose buffers are addresses (Feature::AddressableMemory) and an offset that
// the device's policy allows (DevicePolicy::view_alignment: any element's on the CPU, 16 bytes
// on CUDA, for its matmul library's bias vectors). Data parallelism lays its buckets out so that
// every piece but a few odd-sized ones lands on that grid (Note [bucket layout] in
// distributed/data_parallel.cpp). P's other readers read
// the view like any buffer. The concatenation is "sealed" when nothing but it reads its placed
// pieces: then an all-reduce of it may run in place (schedule.cpp, Note [all-reduces in place]).
#include "tinygrad/schedule/concat_in_place.h"

#include <algorithm>

#include "tinygrad/device.h"
#include "tinygrad/lazy.h"

namespace tg {

namespace {

bool read_once(const ScheduleGraph& g, const UOp* n) { return readers_of(g, n).size() == 1; }

// The PADs that u adds up, each a piece of a 1-d concatenation, or nothing when u is not one. The
// additions under u and the PADs are read once, so they belong to u's kernel alone.
std::vector<const UOp*> concat_pads(const ScheduleGraph& g, const UOp* u, const NodeSet& realize) {
  std::vector<const UOp*> pads, stack{u};
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (n != u && (realize.count(n) || !read_once(g, n))) return {};
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
  bool in_order = true;           // the views keep the order of node's elements
  bool read_once = true;          // every node on the way, node included, has one reader
};

PieceSource piece_source(const ScheduleGraph& g, const UOpPtr& value, const NodeSet& realize) {
  PieceSource src;
  const UOp* n = value.get();
  std::vector<int64_t> run;  // the composed permutation of the current run of permutes
  auto end_run = [&](const UOp* below) {
    if (!run.empty() && !keeps_order(run, below->shape)) src.in_order = false;
    run.clear();
  };
  src.read_once = read_once(g, n);
  while (!realize.count(n) && !has_buffer(n) &&
         (n->op == Op::RESHAPE || n->op == Op::DETACH || n->op == Op::PERMUTE)) {
    if (n->op == Op::PERMUTE) {
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
    src.read_once = src.read_once && read_once(g, n);
  }
  end_run(n);
  src.node = n;
  return src;
}

// Whether the piece's source node can be computed straight into the concatenation's buffer.
bool placeable(const ScheduleGraph& g, const UOp* u, const PieceSource& src, const NodeSet& realize) {
  const UOp* n = src.node;
  return src.in_order && realize.count(n) && !has_buffer(n) && !g.output_set.count(n) && n->dtype == u->dtype &&
         n->device == u->device && computed_by_a_kernel(*n);
}

}  // namespace

ConcatsInPlace plan_concats_in_place(const ScheduleGraph& g, const NodeSet& realize) {
  ConcatsInPlace out;
  for (auto& node : g.order) {
    const UOp* u = node.get();
    if (!realize.count(u) || u->op != Op::ADD || u->shape.size() != 1 || has_buffer(u)) continue;
    Device& dev = get_device(u->device);
    if (!dev.supports(Feature::AddressableMemory)) continue;
    const size_t align = dev.policy().view_alignment;
    auto pads = concat_pads(g, u, realize);
    if (pads.empty()) continue;
    ConcatInPlace plan{tiling_pieces(u, pads), true};
    size_t placed = 0, runs = 0;
    bool in_run = false;
    NodeSet seen;
    for (auto& piece : plan.pieces) {
      const PieceSource src = piece_source(g, piece.value, realize);
      const size_t offset = static_cast<size_t>(piece.begin) * itemsize(u->dtype);
      const bool fits = placeable(g, u, src, realize) && !out.placed.count(src.node) &&
                        seen.insert(src.node).second && (align == 0 || offset % align == 0);
      if (fits) {
        piece.placed = src.node;
        plan.sealed = plan.sealed && src.read_once;
      }
      placed += fits;
      runs += !fits && !in_run;
      in_run = !fits;
    }
    if (placed == 0 || runs > 1) continue;
    for (auto& piece : plan.pieces)
      if (piece.placed) out.placed[piece.placed] = {u, piece.begin};
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
