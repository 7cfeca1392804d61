// Helpers shared by the test files: catching a tg::Error's message, checking message parts,
// and a per-test temporary directory.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tinygrad/error.h"

namespace tg::testing_util {

// Runs f, expects a tg::Error, returns its message ("" and a test failure when none is thrown).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no tg::Error thrown";
  return "";
}

// Expects fn to throw tg::Error whose message contains every part.
template <class F>
void expect_error(F&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected tg::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tg_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

}  // namespace tg::testing_util

// EXPECT_HAS(message, part): the message contains part.
#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg) << "\nexpected: " << (part)
