// Pattern matcher and graph_rewrite. Rules are data: a list of (ops it applies to, name,
// function returning the replacement or nullptr). The symbolic simplifier for kernel index
// arithmetic is one such rule list.
#pragma once
#include <array>
#include <functional>
#include <unordered_map>
#include <vector>

#include "tinygrad/ops.h"

namespace tg {

struct Rule {
  std::vector<Op> ops;  // empty: any op
  const char* name;
  std::function<UOpPtr(const UOpPtr&)> fn;
};

class PatternMatcher {
 public:
  explicit PatternMatcher(std::vector<Rule> rules);
  // The first rule that fires, or nullptr.
  UOpPtr rewrite(const UOpPtr& u) const;

 private:
  std::vector<Rule> rules_;
  std::array<std::vector<size_t>, 64> by_op_;
};

// Memo of rewrites; holds the keys alive so their addresses stay unique.
struct RewriteMemo {
  std::unordered_map<const UOp*, std::pair<UOpPtr, UOpPtr>> done;
};

// Rewrites bottom-up to a fixed point: sources first, then the node, until no rule fires.
UOpPtr graph_rewrite(const UOpPtr& root, const PatternMatcher& pm, RewriteMemo& memo);
UOpPtr graph_rewrite(const UOpPtr& root, const PatternMatcher& pm);

// root with every node in `from` replaced by its image, rebuilt bottom-up.
UOpPtr substitute(const UOpPtr& root, const std::unordered_map<const UOp*, UOpPtr>& from);

// The symbolic rules for kernel graphs: constant folding, canonical sums, division and modulo
// with bounds, comparisons decided by bounds, trivial gates and selects.
const PatternMatcher& symbolic();

// An integer index expression as a sum of terms times constant coefficients plus a constant,
// equal terms merged and zero terms dropped (Note [linear forms] in rewrite.cpp).
struct LinearForm {
  std::vector<std::pair<UOpPtr, int64_t>> terms;
  int64_t constant = 0;
};
LinearForm linear_form(const UOpPtr& index);

// A gated load's index simplified where its gate holds (Note [indices under a gate] in
// rewrite.cpp): the loop variables that the gate bounds take only the values it lets through.
UOpPtr simplify_under_gate(const UOpPtr& index, const UOpPtr& gate);

}  // namespace tg
