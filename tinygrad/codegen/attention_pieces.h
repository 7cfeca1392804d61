// The template text that fused attention's kernels share (attention_kernel.cpp for the plain
// forms, attention_tensor_cores.cpp for the tensor-core ones): filling a piece's holes, and the
// backward kernels' reads of L and D.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tinygrad/error.h"

namespace tg {

// Note [template pieces]: the kernels' text is written once where two kernels (or the two halves
// of one) would repeat it: a piece is a raw string with ${name} holes, and fill() replaces each
// hole by its value. Values are not searched again, so a value that holds a hole of its own is
// concatenated into the text before filling instead. A hole without a value is an internal error.
using TemplateValues = std::vector<std::pair<std::string_view, std::string>>;

inline std::string fill(std::string_view text, const TemplateValues& values) {
  std::string out;
  for (size_t at = 0;;) {
    size_t open = text.find("${", at);
    if (open == std::string_view::npos) return out.append(text.substr(at));
    size_t close = text.find('}', open);
    TG_ASSERT(close != std::string_view::npos, "template piece: an unclosed hole");
    std::string_view name = text.substr(open + 2, close - open - 2);
    auto value = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    TG_ASSERT(value != values.end(), "template piece: no value for ${", name, "}");
    out.append(text.substr(at, open - at)).append(value->second);
    at = close + 1;
  }
}

// The backward kernels' reads of a query row's logsumexp L (in log2 units) and of its D =
// rowsum(dO * O), both float32 in [batch, L, heads] order (Note [the forward's output] in
// attention_kernel.cpp); `row` is the row's index there (STAT(y, r)). The addresses are those that
// tensor-core kernels stage (L then still in natural-log units).
inline std::string lse_address(const std::string& row) { return "row_lse + " + row; }
inline std::string delta_address(const std::string& row) { return "dsum + " + row; }
inline std::string lse_read(const std::string& row) { return "*(" + lse_address(row) + ") * LOG2E"; }
inline std::string delta_read(const std::string& row) { return "*(" + delta_address(row) + ")"; }

}  // namespace tg
