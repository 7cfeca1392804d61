// The launcher's loggers (log.h): spdlog's stderr sink for the console, a file sink per train.log.
#include "launcher/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "tinygrad/error.h"

namespace tg::launcher {

namespace {

// Note [rank prefixes]: mpirun and srun interleave their ranks' stderr unmarked, so a line says
// which rank wrote it. `tg launch` reads its workers' output and writes every line as
// "[rank N] line" itself (launch.cpp), so a worker of `tg launch` (TG_RANK set) adds nothing,
// and its lines carry one prefix, not two. The rank is read at each line: a test (or a program)
// that changes the variables sees the prefix follow them.
const char* launcher_rank() {
  if (std::getenv("TG_RANK")) return nullptr;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return nullptr;
}

spdlog::logger& console() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = std::make_shared<spdlog::logger>("tg", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%v");
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *log;
}

void console_line(spdlog::level::level_enum level, const std::string& text) {
  std::fflush(stdout);
  console().log(level, rank_prefix() + text);
}

}  // namespace

std::string rank_prefix() {
  const char* rank = launcher_rank();
  return rank ? "[rank " + std::string(rank) + "] " : std::string();
}

void log_error(const std::string& text) { console_line(spdlog::level::err, "error: " + text); }
void log_note(const std::string& text) { console_line(spdlog::level::info, text); }

std::shared_ptr<spdlog::logger> file_log(const std::string& path) {
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  } catch (const spdlog::spdlog_ex& e) {
    TG_FAIL("cannot write '", path, "': ", e.what());
  }
  auto log = std::make_shared<spdlog::logger>("file", std::move(sink));
  log->set_pattern("%Y-%m-%d %H:%M:%S  %v");
  log->flush_on(spdlog::level::trace);
  return log;
}

}  // namespace tg::launcher
