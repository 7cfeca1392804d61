// The out-of-line parts of tinygrad/error.h: the throwing helpers behind TG_FAIL and TG_ASSERT,
// CompileError's message, and the rank label that device call wrappers append to their errors.
#include "tinygrad/error.h"

#include <cstdio>
#include <cstdlib>

namespace tg {

namespace {

// source with each line numbered as compilers number them in their logs ("  12| ...").
std::string numbered(const std::string& source) {
  std::istringstream in(source);
  std::ostringstream out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    char num[16];
    std::snprintf(num, sizeof num, "%4d| ", ++n);
    out << num << line << "\n";
  }
  return out.str();
}

}  // namespace

void detail::throw_internal(const char* file, int line, const std::string& msg) {
  throw std::logic_error(detail::cat("internal error, please report: ", msg, " (", file, ":", line, ")"));
}

void detail::fail(const std::string& msg) { throw Error(msg); }

CompileError::CompileError(const std::string& kernel, const std::string& source, const std::string& failure)
    : Error(detail::cat("internal error, please report: generated kernel '", kernel, "' does not compile",
                        process_rank_label(), ": ", failure, "\nsource of kernel '", kernel, "':\n",
                        numbered(source))),
      kernel_(kernel),
      source_(source) {}

std::string process_rank_label() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "TG_RANK", "SLURM_PROCID"}) {  // mpirun, tg launch, srun
    const char* rank = std::getenv(var);
    if (rank && *rank) return detail::cat(" (rank ", rank, ")");
  }
  return "";
}

}  // namespace tg
