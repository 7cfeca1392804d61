// The launcher's loggers (log.h): spdlog's stderr sink for the console, a file sink per train.log;
// without spdlog (TG_HAVE_SPDLOG unset) stdio writes the same lines.
#include "launcher/log.h"

#ifdef TG_HAVE_SPDLOG
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

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

#ifdef TG_HAVE_SPDLOG
spdlog::logger& console() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = std::make_shared<spdlog::logger>("tg", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%v");
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *log;
}
#endif

void console_line(const std::string& text) {
  std::fflush(stdout);
#ifdef TG_HAVE_SPDLOG
  console().info(rank_prefix() + text);
#else
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::string line = rank_prefix() + text + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
#endif
}

}  // namespace

std::string rank_prefix() {
  const char* rank = launcher_rank();
  return rank ? "[rank " + std::string(rank) + "] " : std::string();
}

void log_error(const std::string& text) { console_line("error: " + text); }
void log_note(const std::string& text) { console_line(text); }

#ifdef TG_HAVE_SPDLOG
struct FileLog::Impl {
  std::shared_ptr<spdlog::logger> log;
};

FileLog::FileLog(const std::string& path) : impl_(std::make_unique<Impl>()) {
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  } catch (const spdlog::spdlog_ex& e) {
    TG_FAIL("cannot write '", path, "': ", e.what());
  }
  impl_->log = std::make_shared<spdlog::logger>("file", std::move(sink));
  impl_->log->set_pattern("%Y-%m-%d %H:%M:%S  %v");
  impl_->log->flush_on(spdlog::level::trace);
}

void FileLog::line(const std::string& text) { impl_->log->info(text); }
#else
struct FileLog::Impl {
  std::FILE* file = nullptr;
  std::mutex mu;
};

FileLog::FileLog(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->file = std::fopen(path.c_str(), "a");
  TG_CHECK(impl_->file != nullptr, "cannot write '", path, "': ", std::strerror(errno));
}

void FileLog::line(const std::string& text) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::fprintf(impl_->file, "%s  %s\n", stamp, text.c_str());
  std::fflush(impl_->file);
}
#endif

FileLog::~FileLog() {
#ifndef TG_HAVE_SPDLOG
  if (impl_ && impl_->file) std::fclose(impl_->file);
#endif
}

}  // namespace tg::launcher
