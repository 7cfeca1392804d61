// Helpers for tests that run `tg train`: a fresh scratch run directory and the records of a run's
// metrics.jsonl.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

}  // namespace tg::testutil
