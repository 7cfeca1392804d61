// Errors for tinygrad++: tg::Error for user mistakes (TG_CHECK) and a separate internal assert
// (TG_ASSERT) for broken invariants. Messages name the op and the operands involved.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  append(os, a...);
  return os.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace tg

// TG_CHECK(cond, parts...): throws tg::Error with the concatenated parts when cond is false.
#define TG_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) throw ::tg::Error(::tg::detail::cat(__VA_ARGS__)); \
  } while (0)

// TG_ASSERT(cond, parts...): an internal invariant; failing it is a bug in tinygrad++.
#define TG_ASSERT(cond, ...)                                                    \
  do {                                                                          \
    if (!(cond)) ::tg::detail::throw_internal(__FILE__, __LINE__, ::tg::detail::cat(__VA_ARGS__)); \
  } while (0)
