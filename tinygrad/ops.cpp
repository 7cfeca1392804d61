// UOp construction with hash-consing, op tables, and integer bounds of index expressions.
#include "tinygrad/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "tinygrad/error.h"

namespace tg {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); i++) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

// Note [shape products]: a shape is only valid when the product of its non-zero dimensions fits
// an int64. A zero among huge dimensions (say [2^32-1, 2^32-1, 0]) makes the element count 0, yet
// running products, strides and views of the shape still multiply the others together and
// overflow; such a shape is refused here, in the one place every element count goes through.
int64_t prod(const Shape& s) {
  int64_t nonzero = 1;
  bool has_zero = false;
  for (auto v : s) {
    if (v == 0) {
      has_zero = true;
      continue;
    }
    TG_CHECK(!__builtin_mul_overflow(nonzero, v, &nonzero), "shape ", shape_str(s),
             ": its dimensions multiply past the largest element count (2^63-1)");
  }
  return has_zero ? 0 : nonzero;
}

Shape without_ones(const Shape& s) {
  Shape r;
  for (auto d : s)
    if (d != 1) r.push_back(d);
  return r;
}

const char* op_name(Op op) {
  static const char* names[] = {
      "BUFFER", "CONST", "COPY", "NEG", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "TRUNC", "CAST",
      "BITCAST", "ADD", "MUL", "IDIV", "MOD", "MAX", "CMPLT", "CMPNE", "AND", "OR", "XOR", "SHL",
      "SHR", "WHERE", "REDUCE_AXIS", "RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP",
      "CONTIGUOUS", "DETACH", "CUSTOM_GRAD", "MULTI", "ALLREDUCE", "REDUCE_SCATTER", "ALLGATHER",
      "GATHER", "SCATTER_ADD",
      "DEFINE_GLOBAL", "RANGE", "ENDRANGE", "SPECIAL", "LOAD",
      "STORE", "REDUCE", "DEFINE_ACC", "ASSIGN", "SINK", "WMMA", "TEMPLATE_KERNEL"};
  return names[static_cast<int>(op)];
}

OpGroup op_group(Op op) {
  if (op <= Op::COPY) return OpGroup::Buffer;
  if (op <= Op::BITCAST) return OpGroup::Unary;
  if (op <= Op::SHR) return OpGroup::Binary;
  if (op == Op::WHERE) return OpGroup::Ternary;
  if (op == Op::REDUCE_AXIS) return OpGroup::Reduce;
  if (op <= Op::FLIP) return OpGroup::Movement;
  if (op <= Op::MULTI) return OpGroup::Marker;
  if (op <= Op::ALLGATHER) return OpGroup::Collective;
  if (op <= Op::SCATTER_ADD) return OpGroup::Indexed;
  return OpGroup::Kernel;
}

bool is_alu(Op op) {
  auto g = op_group(op);
  return g == OpGroup::Unary || g == OpGroup::Binary || g == OpGroup::Ternary;
}
bool is_comparison(Op op) { return op == Op::CMPLT || op == Op::CMPNE; }

// ---- hash-consing ----------------------------------------------------------------------------

namespace {

size_t hash_combine(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

size_t hash_arg(const Arg& a) {
  size_t h = a.index();
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) h = hash_combine(h, std::hash<int64_t>()(v));
        else if constexpr (std::is_same_v<T, double>) h = hash_combine(h, std::hash<double>()(v));
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          for (auto x : v) h = hash_combine(h, std::hash<int64_t>()(x));
        } else if constexpr (std::is_same_v<T, ReduceArg>) {
          h = hash_combine(h, static_cast<size_t>(v.op));
          for (auto x : v.axes) h = hash_combine(h, std::hash<int64_t>()(x));
        } else if constexpr (std::is_same_v<T, Op>) h = hash_combine(h, static_cast<size_t>(v));
        else if constexpr (std::is_same_v<T, std::shared_ptr<Buffer>>) h = hash_combine(h, std::hash<const void*>()(v.get()));
      },
      a);
  return h;
}

bool arg_equal(const Arg& a, const Arg& b) {
  if (a.index() != b.index()) return false;
  // doubles compare bitwise so that -0.0 and NaN constants stay distinct and findable
  if (auto* x = std::get_if<double>(&a)) {
    double y = std::get<double>(b);
    return std::memcmp(x, &y, sizeof(double)) == 0;
  }
  return a == b;
}

struct Table {
  std::recursive_mutex mu;
  std::unordered_multimap<size_t, const UOp*> nodes;
  std::unordered_map<const UOp*, std::weak_ptr<const UOp>> owners;
};
Table& table() {
  static Table* t = new Table();  // never destroyed: UOps may outlive static destruction order
  return *t;
}

}  // namespace

UOp::~UOp() {
  auto& t = table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  auto range = t.nodes.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == this) {
      t.nodes.erase(it);
      break;
    }
  }
  t.owners.erase(this);
}

UOpPtr make_uop(Op op, DType dtype, std::vector<UOpPtr> src, Arg arg, Shape shape, std::string device) {
  size_t h = hash_combine(static_cast<size_t>(op), static_cast<size_t>(dtype));
  for (auto& s : src) h = hash_combine(h, std::hash<const void*>()(s.get()));
  h = hash_combine(h, hash_arg(arg));
  for (auto v : shape) h = hash_combine(h, std::hash<int64_t>()(v));
  h = hash_combine(h, std::hash<std::string>()(device));
  auto& t = table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  auto range = t.nodes.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const UOp* u = it->second;
    if (u->op != op || u->dtype != dtype || u->src.size() != src.size() || u->shape != shape ||
        u->device != device || !arg_equal(u->arg, arg))
      continue;
    bool same = true;
    for (size_t i = 0; i < src.size() && same; i++) same = u->src[i] == src[i];
    if (!same) continue;
    if (auto alive = t.owners[u].lock()) return alive;
  }
  auto node = std::make_shared<UOp>();
  auto* raw = const_cast<UOp*>(node.get());
  raw->op = op;
  raw->dtype = dtype;
  raw->src = std::move(src);
  raw->arg = std::move(arg);
  raw->shape = std::move(shape);
  raw->device = std::move(device);
  raw->hash = h;
  t.nodes.emplace(h, node.get());
  t.owners[node.get()] = node;
  return node;
}

size_t live_uop_count() {
  std::lock_guard<std::recursive_mutex> lock(table().mu);
  return table().owners.size();
}

// ---- accessors -------------------------------------------------------------------------------

int64_t UOp::arg_int() const {
  auto* v = std::get_if<int64_t>(&arg);
  TG_ASSERT(v, op_name(op), " has no integer arg");
  return *v;
}
double UOp::arg_float() const {
  auto* v = std::get_if<double>(&arg);
  TG_ASSERT(v, op_name(op), " has no float arg");
  return *v;
}
const std::vector<int64_t>& UOp::arg_ints() const {
  auto* v = std::get_if<std::vector<int64_t>>(&arg);
  TG_ASSERT(v, op_name(op), " has no int-list arg");
  return *v;
}
const ReduceArg& UOp::arg_reduce() const {
  auto* v = std::get_if<ReduceArg>(&arg);
  TG_ASSERT(v, op_name(op), " has no reduce arg");
  return *v;
}
const std::shared_ptr<Buffer>& UOp::arg_buffer() const {
  auto* v = std::get_if<std::shared_ptr<Buffer>>(&arg);
  TG_ASSERT(v, op_name(op), " has no buffer arg");
  return *v;
}
CollectiveArg UOp::arg_collective() const {
  TG_ASSERT(op_group(op) == OpGroup::Collective, "arg_collective of ", op_name(op));
  const auto& v = arg_ints();
  TG_ASSERT(v.size() == 3, op_name(op), " arg is not {reduce, group, ranks}");
  return CollectiveArg{static_cast<Op>(v[0]), v[1], v[2]};
}

namespace {
Shape collective_shape(Op op, const UOpPtr& x, const CollectiveArg& a) {
  TG_ASSERT(op_group(op) == OpGroup::Collective, "make_collective of ", op_name(op));
  TG_ASSERT(a.ranks >= 1 && a.group > 0, "make_collective: group ", a.group, " of ", a.ranks, " ranks");
  Shape shape = x->shape;
  if (op != Op::ALLREDUCE) {
    TG_CHECK(shape.size() == 1, op_name(op), ": takes a 1-d tensor, got ", shape_str(shape));
    if (op == Op::REDUCE_SCATTER) {
      TG_CHECK(shape[0] % a.ranks == 0, op_name(op), ": ", shape[0], " elements do not split into ", a.ranks,
               " equal blocks");
      shape[0] /= a.ranks;
    } else {
      shape[0] *= a.ranks;
    }
  }
  return shape;
}

Arg collective_arg(const CollectiveArg& a) {
  return Arg{std::vector<int64_t>{static_cast<int64_t>(a.reduce), a.group, a.ranks}};
}
}  // namespace

UOpPtr make_collective(Op op, const UOpPtr& x, const CollectiveArg& a) {
  return make_uop(op, x->dtype, {x}, collective_arg(a), collective_shape(op, x, a), x->device);
}

UOpPtr make_device_collective(Op op, const std::vector<UOpPtr>& parts, const CollectiveArg& a, size_t k) {
  TG_ASSERT(static_cast<int64_t>(parts.size()) == a.ranks && k < parts.size(), "device collective of ", parts.size(),
            " parts for ", a.ranks, " devices, part ", k);
  for (auto& p : parts)
    TG_ASSERT(p->shape == parts[0]->shape && p->dtype == parts[0]->dtype, "device collective parts differ: ",
              p->str(0), " vs ", parts[0]->str(0));
  return make_uop(op, parts[0]->dtype, parts, collective_arg(a), collective_shape(op, parts[0], a), parts[k]->device);
}

double UOp::const_value() const {
  TG_ASSERT(op == Op::CONST, "const_value of ", op_name(op));
  if (auto* d = std::get_if<double>(&arg)) return *d;
  return static_cast<double>(std::get<int64_t>(arg));
}

std::string UOp::str(int depth) const {
  std::ostringstream os;
  os << op_name(op) << ":" << dtype_name(dtype);
  if (!shape.empty()) os << shape_str(shape);
  if (op == Op::CONST) os << "(" << const_value() << ")";
  if (auto* v = std::get_if<int64_t>(&arg); v && op != Op::CONST) os << "{" << *v << "}";
  if (auto* v = std::get_if<std::vector<int64_t>>(&arg)) os << "{" << shape_str(*v) << "}";
  if (auto* v = std::get_if<ReduceArg>(&arg)) os << "{" << op_name(v->op) << "," << shape_str(v->axes) << "}";
  if (auto* v = std::get_if<Op>(&arg)) os << "{" << op_name(*v) << "}";
  if (depth > 0 && !src.empty()) {
    os << "(";
    for (size_t i = 0; i < src.size(); i++) os << (i ? ", " : "") << src[i]->str(depth - 1);
    os << ")";
  } else if (!src.empty()) {
    os << "(...)";
  }
  return os.str();
}

// ---- integer bounds --------------------------------------------------------------------------

namespace {
int64_t clamp_to_i64(double v) {
  if (v >= 9.2e18) return std::numeric_limits<int64_t>::max();
  if (v <= -9.2e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}
constexpr int64_t BIG = int64_t{1} << 62;
bool small(int64_t v) { return v > -BIG && v < BIG; }
}  // namespace

int64_t UOp::vmin() const {
  if (!bounds_known_) compute_bounds();
  return vmin_;
}
int64_t UOp::vmax() const {
  if (!bounds_known_) compute_bounds();
  return vmax_;
}

void UOp::compute_bounds() const {
  int64_t lo = clamp_to_i64(dtype_min(dtype)), hi = clamp_to_i64(dtype_max(dtype));
  if (is_float(dtype)) lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  auto s = [&](size_t i) { return src[i].get(); };
  switch (op) {
    case Op::CONST:
      lo = hi = clamp_to_i64(const_value());
      break;
    case Op::RANGE:
    case Op::SPECIAL:
      lo = 0;
      hi = s(0)->vmax() - 1;
      break;
    case Op::ADD:
      if (small(s(0)->vmin()) && small(s(1)->vmin()) && small(s(0)->vmax()) && small(s(1)->vmax()))
        lo = s(0)->vmin() + s(1)->vmin(), hi = s(0)->vmax() + s(1)->vmax();
      break;
    case Op::MUL: {
      int64_t a = s(0)->vmin(), b = s(0)->vmax(), c = s(1)->vmin(), d = s(1)->vmax();
      if (small(a) && small(b) && small(c) && small(d) && std::max({std::abs(a), std::abs(b)}) < (1LL << 31) &&
          std::max({std::abs(c), std::abs(d)}) < (1LL << 31)) {
        int64_t p[] = {a * c, a * d, b * c, b * d};
        lo = *std::min_element(p, p + 4), hi = *std::max_element(p, p + 4);
      }
      break;
    }
    case Op::IDIV:
      if (s(1)->op == Op::CONST && s(1)->const_value() > 0 && s(0)->vmin() >= 0) {
        auto c = static_cast<int64_t>(s(1)->const_value());
        lo = s(0)->vmin() / c, hi = s(0)->vmax() / c;
      }
      break;
    case Op::MOD:
      if (s(1)->op == Op::CONST && s(1)->const_value() > 0 && s(0)->vmin() >= 0) {
        auto c = static_cast<int64_t>(s(1)->const_value());
        lo = 0, hi = std::min(c - 1, s(0)->vmax());
      }
      break;
    case Op::MAX:
      lo = std::max(s(0)->vmin(), s(1)->vmin()), hi = std::max(s(0)->vmax(), s(1)->vmax());
      break;
    case Op::CMPLT:
    case Op::CMPNE:
    case Op::AND:
    case Op::OR:
      if (dtype == DType::Bool) lo = 0, hi = 1;
      break;
    case Op::WHERE:
      lo = std::min(s(1)->vmin(), s(2)->vmin()), hi = std::max(s(1)->vmax(), s(2)->vmax());
      break;
    case Op::CAST:
      if (!is_float(src[0]->dtype)) lo = std::max(lo, s(0)->vmin()), hi = std::min(hi, s(0)->vmax());
      break;
    default:
      break;
  }
  vmin_ = lo;
  vmax_ = hi;
  bounds_known_ = true;
}

// ---- kernel-graph constructors ---------------------------------------------------------------

UOpPtr kconst(DType dtype, double v) {
  if (is_float(dtype)) return make_uop(Op::CONST, dtype, {}, Arg{v});
  if (dtype == DType::Bool) v = v != 0;
  return make_uop(Op::CONST, dtype, {}, Arg{static_cast<int64_t>(v)});
}
UOpPtr kint(int64_t v) { return make_uop(Op::CONST, dtypes::index, {}, Arg{v}); }

UOpPtr kalu(Op op, const UOpPtr& a, const UOpPtr& b) {
  DType out = is_comparison(op) ? DType::Bool : a->dtype;
  return make_uop(op, out, {a, b});
}
bool is_accumulating_store(const UOp& u) {
  auto* op = std::get_if<Op>(&u.arg);
  return u.op == Op::STORE && op && *op == Op::ADD;
}

UOpPtr kalu(Op op, const UOpPtr& a) { return make_uop(op, a->dtype, {a}); }
UOpPtr kwhere(const UOpPtr& c, const UOpPtr& a, const UOpPtr& b) { return make_uop(Op::WHERE, a->dtype, {c, a, b}); }
UOpPtr kcast(const UOpPtr& x, DType dtype) {
  if (x->dtype == dtype) return x;
  return make_uop(Op::CAST, dtype, {x});
}
bool is_const(const UOpPtr& u, double v) { return u->op == Op::CONST && u->const_value() == v; }
bool is_const(const UOpPtr& u) { return u->op == Op::CONST; }

std::vector<UOpPtr> toposort(const std::vector<UOpPtr>& roots, const std::function<bool(const UOp&)>& descend) {
  std::vector<UOpPtr> order;
  std::unordered_set<const UOp*> seen;
  // iterative DFS: graphs of training steps are deep. An entry is a node, the next source to
  // visit, and how many of its sources are visited (none where `descend` says so: asked once).
  struct Entry {
    const UOpPtr* node;
    size_t next, count;
  };
  std::vector<Entry> stack;
  auto push = [&](const UOpPtr& u) {
    stack.push_back({&u, 0, !descend || descend(*u) ? u->src.size() : 0});
  };
  for (auto& r : roots) {
    if (!seen.insert(r.get()).second) continue;
    push(r);
    while (!stack.empty()) {
      Entry& e = stack.back();
      if (e.next < e.count) {
        const UOpPtr& child = (*e.node)->src[e.next++];
        if (seen.insert(child.get()).second) push(child);
      } else {
        order.push_back(*e.node);
        stack.pop_back();
      }
    }
  }
  return order;
}

}  // namespace tg
