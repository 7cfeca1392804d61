// Long reductions with few outputs in two stages.
//
// Note [split reductions]: a GPU runs a reduction with few outputs as one work-group per output
// (Note [grouped reduction] in codegen/gpu_dims.cpp). BatchNorm's statistics and their gradient
// sums over N, H and W have one output per channel, 32 or 64 work-groups on a GPU of 132
// multiprocessors, each walking hundreds of thousands of elements: most of the chip idles. On
// devices without host memory (GPU-style ones) such a reduce (at most SPLIT_GROUPS / 2 outputs,
// at least SPLIT_MIN_LENGTH elements each) is cut in two: its outermost reduced axis that splits
// best, of size D, is reshaped into (S, D/S), the first stage reduces everything but S into
// partial results (outputs * S of them, at most SPLIT_GROUPS, each of at least SPLIT_MIN_PART
// elements), a kernel of its own with as many work-groups, and the kernel that held the reduce
// reduces the S partials instead (a short loop per output) and keeps its epilogue (a mean's
// scale). Neither stage needs atomics, so results do not depend on timing. Half-type reductions
// keep their partials in float32 and round once, as a one-stage reduce does. The CPU keeps one
// stage: its thread pool splits the output loop and a core walks a long reduction at memory speed.
// SPLIT_REDUCE=0 turns this off.
#include "tinygrad/schedule/split_reduce.h"

#include <unordered_map>
#include <unordered_set>

#include "tinygrad/lazy.h"

namespace tg {

namespace {

constexpr int64_t SPLIT_GROUPS = 1024;
constexpr int64_t SPLIT_MIN_LENGTH = 16384;
constexpr int64_t SPLIT_MIN_PART = 1024;

size_t value_src_count(const UOp& u) { return u.op == Op::CUSTOM_GRAD ? 1 : u.src.size(); }

// The largest divisor s of n with outputs * s <= SPLIT_GROUPS and length / s >= SPLIT_MIN_PART.
int64_t split_factor(int64_t n, int64_t outputs, int64_t length) {
  for (int64_t s = std::min(n, SPLIT_GROUPS / outputs); s >= 2; s--)
    if (n % s == 0 && length / s >= SPLIT_MIN_PART) return s;
  return 1;
}

}  // namespace

// Note [split reductions]
std::optional<SplitReduce> split_reduce(const UOpPtr& root, const std::function<bool(const UOp*)>& is_input) {
  // the kernel's reduces: nodes reached from the root before its inputs
  UOpPtr reduce;
  std::vector<const UOp*> stack{root.get()};
  std::unordered_set<const UOp*> seen;
  std::unordered_map<const UOp*, UOpPtr> owner;  // raw pointer -> shared pointer of the kernel's nodes
  owner[root.get()] = root;
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second || (n != root.get() && is_input(n))) continue;
    if (n->op == Op::REDUCE_AXIS) {
      if (reduce) return std::nullopt;
      reduce = owner.at(n);
    }
    for (size_t i = 0; i < value_src_count(*n); i++) {
      owner[n->src[i].get()] = n->src[i];
      stack.push_back(n->src[i].get());
    }
  }
  if (!reduce) return std::nullopt;
  const UOpPtr& x = reduce->src[0];
  const auto& ra = reduce->arg_reduce();
  int64_t outputs = prod(reduce->shape);
  if (outputs <= 0 || outputs * 2 > SPLIT_GROUPS) return std::nullopt;
  int64_t length = prod(x->shape) / outputs;
  if (length < SPLIT_MIN_LENGTH) return std::nullopt;
  int64_t axis = -1, s = 1;
  for (auto a : ra.axes) {
    int64_t f = split_factor(x->shape[static_cast<size_t>(a)], outputs, length);
    if (f > s) axis = a, s = f;
  }
  if (s < 2) return std::nullopt;

  // first stage: (.., D, ..) as (.., S, D/S, ..), reduced over all but S
  bool half = reduce->dtype == DType::Float16 || reduce->dtype == DType::BFloat16;
  UOpPtr src = half ? lazy::cast(x, DType::Float32) : x;
  Shape split = x->shape;
  auto at = split.begin() + axis;
  int64_t d = *at;
  *at = s;
  split.insert(at + 1, d / s);
  std::vector<int64_t> axes;
  for (auto a : ra.axes) axes.push_back(a < axis ? a : a + 1);
  UOpPtr partial = lazy::reduce(lazy::reshape(src, split), ra.op, axes);
  UOpPtr combined = lazy::reshape(lazy::reduce(partial, ra.op, {axis}), reduce->shape);
  if (half) combined = lazy::cast(combined, reduce->dtype);

  // the root again, with the reduce replaced (its inputs stay as they are)
  std::unordered_map<const UOp*, UOpPtr> memo{{reduce.get(), combined}};
  std::function<UOpPtr(const UOpPtr&)> rebuild = [&](const UOpPtr& n) -> UOpPtr {
    if (auto it = memo.find(n.get()); it != memo.end()) return it->second;
    if (n != root && is_input(n.get())) return n;
    auto srcs = n->src;
    for (size_t i = 0; i < value_src_count(*n); i++) srcs[i] = rebuild(n->src[i]);
    UOpPtr out = srcs == n->src ? n : make_uop(n->op, n->dtype, srcs, n->arg, n->shape, n->device);
    return memo[n.get()] = out;
  };
  return SplitReduce{partial, rebuild(root)};
}

}  // namespace tg
