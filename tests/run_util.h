// Helpers for tests that run `tg`: a fresh scratch run directory, the records of a run's
// metrics.jsonl, and tg_main called in-process with its output captured.
#pragma once
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/run.h"

namespace tg::testutil {

// <tmp>/tg_test_<suite>_<name>_<pid>, removed if it exists.
inline std::filesystem::path fresh_run_dir(const std::string& suite, const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("tg_test_" + suite + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p;
}

// The metrics.jsonl records of `type` ("train", "eval", ...), in order.
inline std::vector<nlohmann::json> metrics_records(const std::filesystem::path& run_dir, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) out.push_back(j);
  }
  return out;
}

// tg_main on args (args[0] is "tg"): its exit status, stdout and stderr.
struct CliRun {
  int rc;
  std::string out, err;
};
inline CliRun tg_run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  int rc = tg::launcher::tg_main(static_cast<int>(argv.size()), argv.data());
  std::string out = testing::internal::GetCapturedStdout();
  return {rc, out, testing::internal::GetCapturedStderr()};
}

}  // namespace tg::testutil
