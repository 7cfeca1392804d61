// Vector loads and stores found in a laid-out kernel.
//
// Note [vector accesses]: a GPU elementwise kernel whose lanes are neighbouring elements (Note
// [contiguous lanes] in codegen/gpu_dims.cpp) loads and stores them one element at a time as
// the linearizer lays them out: with bfloat16, 2-byte accesses. A thread then has few bytes in
// flight and the memory system sees four times the instructions of 8-byte, eight times those of
// 16-byte accesses; GPT-2's bias-and-GELU kernel moved 1.5 TB/s on an H100 where PyTorch's moves
// 2.9. This pass finds what one wide access can do instead: a run of LOADs (or STOREs) of one
// buffer, in address order within one stretch of straight-line code, whose element indices are
// e + c, e + c + 1, ... for one expression e and constants (their linear forms, rewrite.h, have
// the same terms: hash-consing makes every lane's shared part one node). The members need not
// be adjacent (Note [runs across arithmetic]). A run is cut into pieces
// of a power of two elements, at most max_bytes, whose first index is provably a multiple of the
// piece's length: every term of e is (known_pow2_factor) and so is the constant part. The buffer's own address must then be a
// multiple of the piece's bytes for the access to be aligned; that is only known at run time,
// so the renderer emits a scalar path beside the vector one (render_c.cpp). Gated accesses,
// accumulating stores and prefetching loads keep their single-element form.
//
// Note [runs across arithmetic]: a grouped reduction's lanes (Note [reduce lanes] in
// codegen/gpu_dims.cpp) are one value per lane combined before the accumulator, and the
// linearizer lays each lane's loads out with the arithmetic that uses them. A run therefore
// continues past uops between its members, within limits that keep the wide access where the
// renderer puts it (a load run at its first member, a store run at its last) equal to the
// members one by one: no loop opens or closes in between (a group's combine, too, sits at a loop's
// end), a load run meets no store, and a store run meets no other access to its buffer. The
// element-by-element path indexes from the first member (index + m), whose index is defined
// before the access; a later member's may not be.
#include "tinygrad/codegen/vector_access.h"

#include <algorithm>
#include <unordered_set>

#include "tinygrad/dtype.h"
#include "tinygrad/rewrite.h"

namespace tg {

namespace {

constexpr int64_t MAX_FACTOR = 64;

// Two linear forms whose terms are the same nodes with the same coefficients.
bool same_terms(const LinearForm& a, const LinearForm& b) {
  return std::equal(a.terms.begin(), a.terms.end(), b.terms.begin(), b.terms.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first && x.second == y.second; });
}

// An access that may join a run: ungated, not accumulating, not prefetching.
bool candidate(const UOp& u) {
  if (u.op == Op::LOAD) return u.src.size() == 2 && !std::holds_alternative<int64_t>(u.arg);
  return u.op == Op::STORE && u.src.size() == 3 && !is_accumulating_store(u);
}

int64_t lowest_bit(int64_t v) {
  if (v == 0) return MAX_FACTOR;
  uint64_t m = static_cast<uint64_t>(v);
  return std::min<int64_t>(MAX_FACTOR, static_cast<int64_t>(m & (~m + 1)));
}

// The largest power of two (at most MAX_FACTOR) that an integer expression is provably a multiple of.
int64_t known_pow2_factor(const UOpPtr& u) {
  auto f = [](const UOpPtr& x) { return known_pow2_factor(x); };
  switch (u->op) {
    case Op::CONST: return is_float(u->dtype) ? 1 : lowest_bit(static_cast<int64_t>(u->const_value()));
    case Op::ADD: return std::min(f(u->src[0]), f(u->src[1]));
    case Op::MUL: return std::min(MAX_FACTOR, f(u->src[0]) * f(u->src[1]));
    case Op::MOD: return std::min(f(u->src[0]), f(u->src[1]));  // a - (a / b) * b
    case Op::SHL:
      if (u->src[1]->op == Op::CONST && u->src[1]->const_value() < 7)
        return std::min(MAX_FACTOR, f(u->src[0]) << static_cast<int>(u->src[1]->const_value()));
      return f(u->src[0]);
    case Op::CAST: return is_float(u->src[0]->dtype) || is_float(u->dtype) ? 1 : f(u->src[0]);
    default: return 1;
  }
}

// ... and of a linear form's terms (its constant aside).
int64_t terms_pow2_factor(const LinearForm& l) {
  int64_t f = MAX_FACTOR;
  for (auto& [t, c] : l.terms) f = std::min(f, std::min(MAX_FACTOR, lowest_bit(c) * known_pow2_factor(t)));
  return f;
}

// Note [runs across arithmetic]: the accesses after uops[i] (whose index has the linear form a)
// that continue its run, uops[i] first, in address order.
constexpr size_t RUN_WINDOW = 512;  // uops scanned past the last member
std::vector<UOpPtr> run_from(const std::vector<UOpPtr>& uops, size_t i, const LinearForm& a) {
  const UOp& first = *uops[i];
  std::vector<UOpPtr> run{uops[i]};
  for (size_t j = i + 1, last = i; j < uops.size() && j - last <= RUN_WINDOW; j++) {
    const UOp& u = *uops[j];
    if (u.op == Op::RANGE || u.op == Op::ENDRANGE) break;
    bool access = u.op == Op::LOAD || u.op == Op::STORE;
    if (!access) continue;
    if (first.op == Op::LOAD && u.op == Op::STORE) break;
    if (u.src[0] != first.src[0]) continue;
    bool member = candidate(u) && u.op == first.op;
    if (member) {
      LinearForm b = linear_form(u.src[1]);
      member = same_terms(a, b) && b.constant == a.constant + static_cast<int64_t>(run.size());
    }
    if (member) {
      run.push_back(uops[j]);
      last = j;
    } else if (first.op == Op::STORE) {
      break;
    }
  }
  return run;
}

}  // namespace

// Note [vector accesses]
VectorPlan plan_vector_accesses(const std::vector<UOpPtr>& uops, int64_t max_bytes) {
  VectorPlan plan;
  std::unordered_set<const UOp*> taken;  // members of a run found earlier
  for (size_t i = 0; i < uops.size(); i++) {
    const UOp& first = *uops[i];
    if (!candidate(first) || taken.count(&first)) continue;
    LinearForm a = linear_form(first.src[1]);
    std::vector<UOpPtr> run = run_from(uops, i, a);
    for (auto& m : run) taken.insert(m.get());
    auto elem = static_cast<int64_t>(itemsize(first.src[0]->dtype));
    int64_t factor = terms_pow2_factor(a);
    for (size_t p = 0; p < run.size();) {
      int64_t c = a.constant + static_cast<int64_t>(p), left = static_cast<int64_t>(run.size() - p);
      int64_t n = 1;  // the piece's elements: the most that fit, divide the start and are within the run
      while (2 * n * elem <= max_bytes && 2 * n <= left && 2 * n <= factor && c % (2 * n) == 0) n *= 2;
      if (n < 2 || n * elem < 4) {
        p++;
        continue;
      }
      auto begin = run.begin() + static_cast<std::ptrdiff_t>(p);
      VectorAccess v{{begin, begin + n}, n * elem};
      const UOp* key = first.op == Op::LOAD ? v.members.front().get() : v.members.back().get();
      for (auto& m : v.members) plan.member_of[m.get()] = key;
      plan.at.emplace(key, std::move(v));
      p += static_cast<size_t>(n);
    }
  }
  return plan;
}

}  // namespace tg
