// graph_rewrite and the symbolic simplifier.
#include "tinygrad/rewrite.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>

#include "tinygrad/error.h"

namespace tg {

PatternMatcher::PatternMatcher(std::vector<Rule> rules) : rules_(std::move(rules)) {
  for (size_t i = 0; i < rules_.size(); i++) {
    if (rules_[i].ops.empty()) {
      for (auto& v : by_op_) v.push_back(i);
    } else {
      for (Op op : rules_[i].ops) by_op_[static_cast<size_t>(op)].push_back(i);
    }
  }
}

UOpPtr PatternMatcher::rewrite(const UOpPtr& u) const {
  for (size_t i : by_op_[static_cast<size_t>(u->op)]) {
    if (auto r = rules_[i].fn(u); r && r != u) return r;
  }
  return nullptr;
}

UOpPtr graph_rewrite(const UOpPtr& root, const PatternMatcher& pm, RewriteMemo& memo) {
  if (auto it = memo.done.find(root.get()); it != memo.done.end()) return it->second.second;
  auto order = toposort({root}, [&](const UOp& u) { return !memo.done.count(&u); });
  for (auto& node : order) {
    if (memo.done.count(node.get())) continue;
    std::vector<UOpPtr> src;
    bool changed = false;
    for (auto& s : node->src) {
      auto& r = memo.done.at(s.get()).second;
      changed |= r != s;
      src.push_back(r);
    }
    UOpPtr cur = changed ? make_uop(node->op, node->dtype, src, node->arg, node->shape, node->device) : node;
    for (int guard = 0; guard < 100; guard++) {
      UOpPtr next = pm.rewrite(cur);
      if (!next) break;
      // a rule may build new nodes whose sources are not yet rewritten
      cur = next == cur ? cur : graph_rewrite(next, pm, memo);
      if (memo.done.count(cur.get()) && memo.done.at(cur.get()).second == cur) break;
    }
    memo.done[node.get()] = {node, cur};
    if (!memo.done.count(cur.get())) memo.done[cur.get()] = {cur, cur};
  }
  return memo.done.at(root.get()).second;
}

UOpPtr graph_rewrite(const UOpPtr& root, const PatternMatcher& pm) {
  RewriteMemo memo;
  return graph_rewrite(root, pm, memo);
}

// ---- symbolic --------------------------------------------------------------------------------

namespace {

bool is_index(const UOpPtr& u) { return u->dtype == DType::Int64 || u->dtype == DType::Int32; }

// Note [linear forms]: integer index expressions are sums of terms times constant coefficients
// plus a constant. Division and modulo by a constant are decided on that form: a term whose
// coefficient the divisor divides leaves the remainder unchanged, and bounds (vmin/vmax, from
// RANGE trip counts) tell when what remains is below the divisor. Everything is non-negative in
// the index expressions the lowering builds; rules check that before they apply.
using Linear = LinearForm;

void add_linear(const UOpPtr& x, int64_t scale, Linear& out) {
  if (x->op == Op::CONST) {
    out.constant += scale * static_cast<int64_t>(x->const_value());
  } else if (x->op == Op::ADD) {
    add_linear(x->src[0], scale, out);
    add_linear(x->src[1], scale, out);
  } else if (x->op == Op::MUL && x->src[1]->op == Op::CONST) {
    add_linear(x->src[0], scale * static_cast<int64_t>(x->src[1]->const_value()), out);
  } else if (x->op == Op::MUL && x->src[0]->op == Op::CONST) {
    add_linear(x->src[1], scale * static_cast<int64_t>(x->src[0]->const_value()), out);
  } else {
    out.terms.push_back({x, scale});
  }
}

std::string term_key(const UOpPtr& u) {
  if (u->op == Op::RANGE || u->op == Op::SPECIAL) return "0" + std::to_string(1000000 + u->arg_int());
  return "1" + u->str(6);
}

UOpPtr build_linear(const Linear& l, DType dt);

Linear linear_of(const UOpPtr& x) {
  Linear l;
  add_linear(x, 1, l);
  // combine equal terms; order deterministically so rendered source is stable across runs
  std::map<std::string, std::pair<UOpPtr, int64_t>> merged;
  for (auto& [t, c] : l.terms) {
    auto& slot = merged[term_key(t)];
    slot.first = t;
    slot.second += c;
  }
  l.terms.clear();
  for (auto& [k, v] : merged)
    if (v.second != 0) l.terms.push_back(v);
  // (x // c) * (c*k) + (x % c) * k  ->  x * k, and (x // (c*d)) * (d*k) + ((x // c) % d) * k  ->
  // (x // c) * k: the digits of an index that a reshape split, put back together
  bool combined = false;
  for (size_t i = 0; i < l.terms.size() && !combined; i++) {
    UOpPtr t = l.terms[i].first;
    int64_t a = l.terms[i].second;
    if (t->op != Op::IDIV || t->src[1]->op != Op::CONST || a == 0) continue;
    auto c = static_cast<int64_t>(t->src[1]->const_value());
    if (c <= 0) continue;
    for (size_t j = 0; j < l.terms.size() && !combined; j++) {
      UOpPtr m = l.terms[j].first;
      int64_t b = l.terms[j].second;
      if (m->op != Op::MOD || m->src[1]->op != Op::CONST) continue;
      auto d = static_cast<int64_t>(m->src[1]->const_value());
      std::optional<std::pair<UOpPtr, int64_t>> whole;
      if (m->src[0] == t->src[0] && d == c && b * c == a) whole = {{t->src[0], b}};
      const UOpPtr& inner = m->src[0];
      if (inner->op == Op::IDIV && inner->src[0] == t->src[0] && inner->src[1]->op == Op::CONST && d > 0 &&
          static_cast<int64_t>(inner->src[1]->const_value()) * d == c && b * d == a)
        whole = {{inner, b}};
      if (!whole) continue;
      l.terms[i].second = 0;
      l.terms[j].second = 0;
      l.terms.push_back(*whole);
      combined = true;
    }
  }
  if (combined) {
    Linear again;
    again.constant = l.constant;
    for (auto& [t, c] : l.terms)
      if (c != 0) again.terms.push_back({t, c});
    return linear_of(build_linear(again, again.terms.empty() ? DType::Int64 : again.terms[0].first->dtype));
  }
  return l;
}

UOpPtr build_linear(const Linear& l, DType dt) {
  UOpPtr acc;
  for (auto& [t, c] : l.terms) {
    if (c == 0) continue;
    UOpPtr term = c == 1 ? t : make_uop(Op::MUL, dt, {t, kconst(dt, static_cast<double>(c))});
    acc = acc ? make_uop(Op::ADD, dt, {acc, term}) : term;
  }
  if (!acc) return kconst(dt, static_cast<double>(l.constant));
  if (l.constant != 0) acc = make_uop(Op::ADD, dt, {acc, kconst(dt, static_cast<double>(l.constant))});
  return acc;
}

bool nonneg(const Linear& l) {
  if (l.constant < 0) return false;
  for (auto& [t, c] : l.terms)
    if (c < 0 || t->vmin() < 0) return false;
  return true;
}

int64_t linear_max(const Linear& l) {
  int64_t m = l.constant;
  for (auto& [t, c] : l.terms) m += c * t->vmax();
  return m;
}

// Note [common factor]: a non-negative l = g*B + s with 0 <= s < g, where g divides the divisor
// c, divides as l // c = B // (c/g) and l % c = g*(B % (c/g)) + s: l lies in [g*B, g*B + g), an
// interval that no multiple of c splits. This turns the row split of a flattened 2-d index
// ((20*y + x) // 40 with x < 20: the pooling windows of a 20-wide row) back into y // 2. g is
// tried among the divisor's common factors with the coefficients, largest first.
struct CommonFactor {
  int64_t g = 0;
  Linear big;    // B
  Linear small;  // s
};

std::optional<CommonFactor> common_factor(const Linear& l, int64_t c) {
  std::vector<int64_t> candidates;
  for (auto& [t, a] : l.terms) {
    int64_t g = std::gcd(a, c);
    if (g > 1 && g < c) candidates.push_back(g);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (int64_t g : candidates) {
    CommonFactor f{g, {}, {}};
    f.big.constant = l.constant / g;
    f.small.constant = l.constant % g;
    for (auto& [t, a] : l.terms) {
      if (a % g == 0)
        f.big.terms.emplace_back(t, a / g);
      else
        f.small.terms.emplace_back(t, a);
    }
    if (linear_max(f.small) < g) return f;
  }
  return std::nullopt;
}

double fold(Op op, DType dt, const std::vector<double>& v) {
  bool f = is_float(dt);
  auto i = [&](size_t k) { return static_cast<int64_t>(v[k]); };
  switch (op) {
    case Op::NEG: return -v[0];
    case Op::EXP2: return std::exp2(v[0]);
    case Op::LOG2: return std::log2(v[0]);
    case Op::SIN: return std::sin(v[0]);
    case Op::SQRT: return std::sqrt(v[0]);
    case Op::RECIP: return 1.0 / v[0];
    case Op::TRUNC: return std::trunc(v[0]);
    case Op::ADD: return v[0] + v[1];
    case Op::MUL: return v[0] * v[1];
    case Op::IDIV: return static_cast<double>(i(0) / i(1));
    case Op::MOD: return static_cast<double>(i(0) % i(1));
    case Op::MAX: return std::max(v[0], v[1]);
    case Op::CMPLT: return v[0] < v[1];
    case Op::CMPNE: return v[0] != v[1];
    case Op::AND: return f ? 0 : static_cast<double>(i(0) & i(1));
    case Op::OR: return static_cast<double>(i(0) | i(1));
    case Op::XOR: return static_cast<double>(i(0) ^ i(1));
    case Op::WHERE: return v[0] != 0 ? v[1] : v[2];
    default: TG_ASSERT(false, "fold ", op_name(op));
  }
}

bool foldable(const UOpPtr& u) {
  if (!is_alu(u->op) || u->op == Op::BITCAST || u->op == Op::CAST) return false;
  if ((u->op == Op::IDIV || u->op == Op::MOD) && is_const(u->src[1], 0)) return false;
  if (u->op == Op::SHL || u->op == Op::SHR) return false;
  if (is_float(u->dtype) && (u->op == Op::AND || u->op == Op::OR || u->op == Op::XOR)) return false;
  for (auto& s : u->src)
    if (s->op != Op::CONST) return false;
  return true;
}

UOpPtr round_const(DType dt, double v) {
  if (dt == DType::Float32) v = static_cast<float>(v);
  return kconst(dt, v);
}

std::vector<Rule> symbolic_rules() {
  std::vector<Rule> r;
  r.push_back({{}, "constant folding", [](const UOpPtr& u) -> UOpPtr {
                 if (!foldable(u)) return nullptr;
                 std::vector<double> v;
                 for (auto& s : u->src) v.push_back(s->const_value());
                 return round_const(u->dtype, fold(u->op, u->dtype, v));
               }});
  r.push_back({{Op::CAST}, "cast of const", [](const UOpPtr& u) -> UOpPtr {
                 if (!is_const(u->src[0])) return nullptr;
                 double v = u->src[0]->const_value();
                 if (!is_float(u->dtype) && is_float(u->src[0]->dtype)) v = std::trunc(v);
                 return round_const(u->dtype, v);
               }});
  r.push_back({{Op::ADD, Op::MUL}, "canonical sum", [](const UOpPtr& u) -> UOpPtr {
                 if (!is_index(u)) return nullptr;
                 if (u->op == Op::MUL && !is_const(u->src[0]) && !is_const(u->src[1])) return nullptr;
                 return build_linear(linear_of(u), u->dtype);
               }});
  r.push_back({{Op::ADD}, "x+0", [](const UOpPtr& u) -> UOpPtr {
                 if (is_const(u->src[1], 0)) return u->src[0];
                 if (is_const(u->src[0], 0)) return u->src[1];
                 return nullptr;
               }});
  r.push_back({{Op::MUL}, "x*1", [](const UOpPtr& u) -> UOpPtr {
                 if (is_const(u->src[1], 1)) return u->src[0];
                 if (is_const(u->src[0], 1)) return u->src[1];
                 if (!is_float(u->dtype) && (is_const(u->src[0], 0) || is_const(u->src[1], 0))) return kconst(u->dtype, 0);
                 return nullptr;
               }});
  r.push_back({{Op::IDIV}, "divide linear form", [](const UOpPtr& u) -> UOpPtr {
                 if (!is_index(u) || u->src[1]->op != Op::CONST) return nullptr;
                 auto c = static_cast<int64_t>(u->src[1]->const_value());
                 if (c == 1) return u->src[0];
                 if (c <= 0) return nullptr;
                 Linear l = linear_of(u->src[0]);
                 if (!nonneg(l)) return nullptr;
                 if (linear_max(l) < c) return kconst(u->dtype, 0);
                 if (auto f = common_factor(l, c))  // Note [common factor]
                   return make_uop(
                       Op::IDIV, u->dtype,
                       {build_linear(f->big, u->dtype), kconst(u->dtype, static_cast<double>(c / f->g))});
                 Linear q, rem;
                 q.constant = l.constant / c;
                 rem.constant = l.constant % c;
                 for (auto& [t, a] : l.terms) {
                   if (a / c) q.terms.push_back({t, a / c});
                   if (a % c) rem.terms.push_back({t, a % c});
                 }
                 // (x // a) // b -> x // (a*b)
                 if (q.terms.empty() && q.constant == 0 && rem.terms.size() == 1 && rem.constant == 0 &&
                     rem.terms[0].second == 1 && rem.terms[0].first->op == Op::IDIV &&
                     is_const(rem.terms[0].first->src[1]) && rem.terms[0].first->src[0]->vmin() >= 0) {
                   auto& inner = rem.terms[0].first;
                   auto d = static_cast<int64_t>(inner->src[1]->const_value());
                   return make_uop(Op::IDIV, u->dtype, {inner->src[0], kconst(u->dtype, static_cast<double>(c * d))});
                 }
                 if (q.terms.empty() && q.constant == 0) return nullptr;  // nothing divides out
                 UOpPtr qexpr = build_linear(q, u->dtype);
                 if (linear_max(rem) < c) return qexpr;
                 UOpPtr rdiv = make_uop(Op::IDIV, u->dtype, {build_linear(rem, u->dtype), u->src[1]});
                 return make_uop(Op::ADD, u->dtype, {qexpr, rdiv});
               }});
  r.push_back({{Op::MOD}, "modulo linear form", [](const UOpPtr& u) -> UOpPtr {
                 if (!is_index(u) || u->src[1]->op != Op::CONST) return nullptr;
                 auto c = static_cast<int64_t>(u->src[1]->const_value());
                 if (c == 1) return kconst(u->dtype, 0);
                 if (c <= 0) return nullptr;
                 Linear l = linear_of(u->src[0]);
                 if (!nonneg(l)) return nullptr;
                 if (auto f = common_factor(l, c)) {  // Note [common factor]
                   auto dt = u->dtype;
                   UOpPtr inner = make_uop(
                       Op::MOD, dt, {build_linear(f->big, dt), kconst(dt, static_cast<double>(c / f->g))});
                   return make_uop(Op::ADD, dt,
                                   {make_uop(Op::MUL, dt, {inner, kconst(dt, static_cast<double>(f->g))}),
                                    build_linear(f->small, dt)});
                 }
                 Linear rem;
                 rem.constant = l.constant % c;
                 bool changed = rem.constant != l.constant;
                 for (auto& [t, a] : l.terms) {
                   changed |= a % c != a;
                   if (a % c) rem.terms.push_back({t, a % c});
                 }
                 if (linear_max(rem) < c) return build_linear(rem, u->dtype);
                 if (!changed) return nullptr;
                 return make_uop(Op::MOD, u->dtype, {build_linear(rem, u->dtype), u->src[1]});
               }});
  r.push_back({{Op::CMPLT}, "compare by bounds", [](const UOpPtr& u) -> UOpPtr {
                 if (!is_index(u->src[0])) return nullptr;
                 if (u->src[0]->vmax() < u->src[1]->vmin()) return kconst(DType::Bool, 1);
                 if (u->src[0]->vmin() >= u->src[1]->vmax()) return kconst(DType::Bool, 0);
                 return nullptr;
               }});
  r.push_back({{Op::AND}, "and with const", [](const UOpPtr& u) -> UOpPtr {
                 if (u->dtype != DType::Bool) return nullptr;
                 for (int i = 0; i < 2; i++) {
                   if (is_const(u->src[i], 1)) return u->src[1 - i];
                   if (is_const(u->src[i], 0)) return kconst(DType::Bool, 0);
                 }
                 return u->src[0] == u->src[1] ? u->src[0] : nullptr;
               }});
  r.push_back({{Op::WHERE}, "where with const condition", [](const UOpPtr& u) -> UOpPtr {
                 if (is_const(u->src[0])) return u->src[0]->const_value() != 0 ? u->src[1] : u->src[2];
                 if (u->src[1] == u->src[2]) return u->src[1];
                 return nullptr;
               }});
  r.push_back({{Op::LOAD}, "constant gate", [](const UOpPtr& u) -> UOpPtr {
                 if (u->src.size() < 3 || !is_const(u->src[2])) return nullptr;
                 if (u->src[2]->const_value() == 0) return kconst(u->dtype, 0);
                 return make_uop(Op::LOAD, u->dtype, {u->src[0], u->src[1]}, u->arg);
               }});
  return r;
}

}  // namespace

LinearForm linear_form(const UOpPtr& index) { return linear_of(index); }

UOpPtr substitute(const UOpPtr& root, const std::unordered_map<const UOp*, UOpPtr>& from) {
  std::unordered_map<const UOp*, UOpPtr> image;
  for (auto& n : toposort({root})) {
    if (auto it = from.find(n.get()); it != from.end()) {
      image[n.get()] = it->second;
      continue;
    }
    std::vector<UOpPtr> src;
    bool same = true;
    for (auto& s : n->src) {
      src.push_back(image.at(s.get()));
      same &= src.back() == s;
    }
    image[n.get()] = same ? n : make_uop(n->op, n->dtype, src, n->arg);
  }
  return image.at(root.get());
}

// Note [indices under a gate]: a load under a PAD's gate reads its source at the padded index
// minus the padding, and the divisions and remainders that reshapes below the PAD put on that
// index cannot be simplified for every value of the loop variables: where the gate is false the
// index is negative or past the source. GPT-2's q/k/v gradient assembly (three [16,12,1024,64]
// pieces concatenated flat and viewed as [16,1024,3,12,64]) kept six 64-bit divisions and
// remainders per element and source, and ran at a third of the memory's bandwidth. The load reads
// memory only where the gate holds, so its index need only be right there: each loop variable
// that a clause of the gate bounds by a constant (`c < r`, `r < c`, clauses joined by AND) is
// written as lo + r', r' a fresh variable running over the values the gate lets through, the
// index is simplified, and r' is put back as r - lo (a single value is put in as a constant).
// The result is kept only when it has fewer nodes.
namespace {

// The values a loop variable (a RANGE) takes where a gate holds.
struct GatedRange {
  UOpPtr var;
  int64_t lo, hi;
};

// The bounds that the gate's clauses put on loop variables, by variable.
void gate_bounds(const UOpPtr& gate, std::map<const UOp*, GatedRange>& bounds) {
  if (gate->op == Op::AND && gate->dtype == DType::Bool) {
    gate_bounds(gate->src[0], bounds);
    gate_bounds(gate->src[1], bounds);
    return;
  }
  if (gate->op != Op::CMPLT) return;
  const UOpPtr &a = gate->src[0], &b = gate->src[1];
  const UOpPtr& var = a->op == Op::RANGE ? a : b;
  const UOpPtr& other = a->op == Op::RANGE ? b : a;
  if (var->op != Op::RANGE || other->op != Op::CONST) return;
  GatedRange& r = bounds.try_emplace(var.get(), GatedRange{var, var->vmin(), var->vmax()}).first->second;
  const auto c = static_cast<int64_t>(other->const_value());
  if (var == a) r.hi = std::min(r.hi, c - 1);  // r < c
  else r.lo = std::max(r.lo, c + 1);           // c < r
}

}  // namespace

UOpPtr simplify_under_gate(const UOpPtr& index, const UOpPtr& gate) {
  std::map<const UOp*, GatedRange> bounds;
  gate_bounds(gate, bounds);
  std::unordered_map<const UOp*, UOpPtr> narrow, back;
  for (auto& [key, r] : bounds) {
    if ((r.lo == r.var->vmin() && r.hi == r.var->vmax()) || r.lo > r.hi) continue;
    if (r.lo == r.hi) {
      narrow[key] = kint(r.lo);
      continue;
    }
    // a variable of its own (ids of the lowering's loops are not negative)
    UOpPtr fresh = make_uop(Op::RANGE, r.var->dtype, {kint(r.hi - r.lo + 1)}, Arg{-1 - r.var->arg_int()});
    narrow[key] = kalu(Op::ADD, fresh, kint(r.lo));
    back[fresh.get()] = kalu(Op::ADD, r.var, kint(-r.lo));
  }
  if (narrow.empty()) return index;
  UOpPtr simpler = graph_rewrite(substitute(index, narrow), symbolic());
  if (!back.empty()) simpler = graph_rewrite(substitute(simpler, back), symbolic());
  return toposort({simpler}).size() < toposort({index}).size() ? simpler : index;
}

const PatternMatcher& symbolic() {
  static const PatternMatcher pm(symbolic_rules());
  return pm;
}

}  // namespace tg
