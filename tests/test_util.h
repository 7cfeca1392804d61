// Helpers shared by the test files: a knob value for one scope, catching a tg::Error's message,
// checking message parts, and a per-test temporary directory.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg::testutil {

// Note [knobs in tests]: a test that changes a knob (IntKnob or StringKnob) holds a KnobScope,
// so that the value it found is back when the scope ends: after the last assertion, and also
// when a failed ASSERT_* or an exception leaves the test early. set() changes the value again
// within the same scope. Fixtures hold one in a std::optional member that SetUp fills.
template <class Knob>
class KnobScope {
 public:
  using Value = std::decay_t<decltype(std::declval<const Knob&>().get())>;
  KnobScope(Knob& knob, Value value) : knob_(knob), prev_(knob.get()) { knob_.set(std::move(value)); }
  ~KnobScope() { knob_.set(prev_); }
  KnobScope(const KnobScope&) = delete;
  KnobScope& operator=(const KnobScope&) = delete;
  void set(Value value) { knob_.set(std::move(value)); }

 private:
  Knob& knob_;
  Value prev_;
};

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

}  // namespace tg::testutil

// EXPECT_HAS(message, part): the message contains part.
#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg) << "\nexpected: " << (part)
