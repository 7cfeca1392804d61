// libFuzzer target: the safetensors reader (tinygrad/nn/state.cpp) on arbitrary bytes. A file is
// either loaded or refused with tg::Error; any other exception, a crash or a sanitizer report is
// a finding. What loads must also save and load again: saving it twice over gives the same bytes
// (names, dtypes, shapes, data, metadata and checksums all survive the round trip).
#include <fstream>
#include <iterator>

#include "tests/fuzz/fuzz_input.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/state.h"

namespace {

std::string contents(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// save(load(path)) -> once, save(load(once)) -> twice: the two files are the same.
void check_round_trip(const std::string& path) {
  static tg::fuzz::InputFile once("safetensors-once"), twice("safetensors-twice");
  tg::nn::safe_save(tg::nn::safe_load(path), once.path(), tg::nn::safe_metadata(path));
  tg::nn::safe_save(tg::nn::safe_load(once.path()), twice.path(), tg::nn::safe_metadata(once.path()));
  if (contents(once.path()) != contents(twice.path())) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tg::fuzz::InputFile file("safetensors");
  const std::string& path = file.write(data, size);
  try {
    tg::nn::safe_load(path);
  } catch (const tg::Error&) {
    return 0;
  }
  check_round_trip(path);  // a tg::Error here is a finding: what loads must save
  return 0;
}
