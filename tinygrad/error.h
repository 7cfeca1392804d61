// Errors for tinygrad++: tg::Error for user mistakes (TG_CHECK, TG_FAIL), tg::CompileError for
// generated code that a device compiler refuses (an internal error), and a separate internal
// assert (TG_ASSERT) for broken invariants. Messages name the op and the operands involved.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Note [compile errors]: tinygrad++ writes every kernel it compiles, so a compiler that refuses
// one (the C compiler, LLVM, NVRTC, the OpenCL driver) has met a bug in the code generator, not a
// mistake of the user. CompileError says so in its message, asks for a report, and carries what
// a report needs: the kernel's name, the compiler's log (in `failure`) and the numbered source.
// It derives from tg::Error so that front ends which print a tg::Error and carry on (the CLI,
// the trainer) print this one too. BEAM (engine/beam.cpp) tells a candidate that fails to
// compile by this type and skips it; every other error propagates.
class CompileError : public Error {
 public:
  CompileError(const std::string& kernel, const std::string& source, const std::string& failure);
  const std::string& kernel() const { return kernel_; }
  const std::string& source() const { return source_; }

 private:
  std::string kernel_, source_;
};

// " (rank N)" when this process is rank N of a job (OMPI_COMM_WORLD_RANK under mpirun, TG_RANK
// under tg launch, SLURM_PROCID under srun), else "": the
// suffix that device call wrappers append to their errors, so a failure names its process.
std::string process_rank_label();

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
[[noreturn]] void fail(const std::string& msg);
}  // namespace detail

}  // namespace tg

// TG_CHECK(cond, parts...): throws tg::Error with the concatenated parts when cond is false.
#define TG_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) throw ::tg::Error(::tg::detail::cat(__VA_ARGS__)); \
  } while (0)

// TG_FAIL(parts...): throws tg::Error with the concatenated parts (a TG_CHECK whose condition
// failed on a path of its own; the compiler knows that it does not return).
#define TG_FAIL(...) ::tg::detail::fail(::tg::detail::cat(__VA_ARGS__))

// TG_ASSERT(cond, parts...): an internal invariant; failing it is a bug in tinygrad++.
#define TG_ASSERT(cond, ...)                                                    \
  do {                                                                          \
    if (!(cond)) ::tg::detail::throw_internal(__FILE__, __LINE__, ::tg::detail::cat(__VA_ARGS__)); \
  } while (0)
