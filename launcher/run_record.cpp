// Build info, run.json, the names of a resumed run's files and the progress mode (see
// run_record.h).
#include "launcher/run_record.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distributed/process_group.h"
#include "launcher/build_info.h"  // generated (Note [build info] in launcher/CMakeLists.txt)
#include "launcher/plot.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/runtime/cpu.h"

namespace fs = std::filesystem;

namespace tg::launcher {

std::string build_version() { return TG_VERSION; }
std::string build_commit() { return TG_GIT_DESCRIBE; }

std::vector<std::string> build_features() {
  std::string devices, backends;
  for (const auto& d : registered_devices()) devices += (devices.empty() ? "" : " ") + d;
  for (const auto& b : dist::built_backends()) backends += (backends.empty() ? "" : " ") + b;
  return {"devices: " + devices,
          "CPU kernels: " + cpu_compiler_kind() + " (LLVM backend " +
              (built_with_llvm() ? "built" : "not built") + ")",
          "process-group backends: " + backends, "NCCL: " + dist::nccl_status(), "tg plot: " + cairo_status()};
}

std::string version_text() {
  std::string out = "tinygrad++ " + build_version() + " (commit " + build_commit() + ")\n";
  for (const auto& f : build_features()) out += "  " + f + "\n";
  return out;
}

// Note [progress under a launcher]: mpirun gives rank 0's stdout a pseudo-terminal, so isatty
// says yes even when the user sent mpirun's output to a file, which then fills with \r-redrawn
// bars. A process a launcher started is therefore treated as not on a terminal: auto prints
// plain lines there. The launchers are recognised by the variables they set for their ranks.
bool started_by_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "TG_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

ProgressMode progress_mode(const std::string& setting, bool stdout_is_tty) {
  if (setting == "off") return ProgressMode::Off;
  if (setting == "bar") return ProgressMode::Bar;
  if (setting == "plain") return ProgressMode::Plain;
  TG_CHECK(setting == "auto", "config: train.progress must be one of auto, bar, plain, off, got '", setting,
           "'");
  return stdout_is_tty && !started_by_launcher() ? ProgressMode::Bar : ProgressMode::Plain;
}

RunFiles run_files(const std::string& run_dir, bool resume) {
  if (!resume) return {0, "config.yaml", "run.json"};
  for (int n = 1;; n++) {
    std::string suffix = ".resume-" + std::to_string(n);
    RunFiles f{n, "config" + suffix + ".yaml", "run" + suffix + ".json"};
    if (!fs::exists(fs::path(run_dir) / f.config) && !fs::exists(fs::path(run_dir) / f.record)) return f;
  }
}

namespace {

std::string utc_iso8601(std::time_t t) {
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown");
}

}  // namespace

std::string run_record_json(const RunRecord& r, const Config& cfg) {
  using nlohmann::json;
  const auto now = std::chrono::system_clock::now();
  std::error_code ec;
  json weights{{"source", r.initial_weights.source}};
  if (r.initial_weights.source == "random")
    weights["seed"] = cfg.get_int("train.seed");
  else
    weights["path"] = r.initial_weights.path;
  if (r.initial_weights.source == "checkpoint") weights["step"] = r.initial_weights.step;
  json j{{"command_line", r.command_line},
         {"working_directory", fs::current_path(ec).string()},
         {"started", utc_iso8601(std::chrono::system_clock::to_time_t(now))},
         {"started_unix", std::chrono::duration<double>(now.time_since_epoch()).count()},
         {"host", host_name()},
         {"version", build_version()},
         {"commit", build_commit()},
         {"build_features", build_features()},
         {"config_name", r.config_name},
         {"config_file", r.config_file},
         {"resume_index", r.resume_index},
         {"world_size", r.world_size},
         {"strategy", cfg.get_string("distributed.strategy")},
         {"devices", r.devices},
         {"device_description", r.device_description},
         {"precision", cfg.get_string("train.precision")},
         {"initial_weights", weights}};
  return j.dump(2) + "\n";
}

}  // namespace tg::launcher
