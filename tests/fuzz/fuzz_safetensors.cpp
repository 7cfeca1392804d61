// libFuzzer target: the safetensors reader (tinygrad/nn/state.cpp) on arbitrary bytes. A file is
// either loaded or refused with tg::Error; any other exception, a crash or a sanitizer report is
// a finding.
#include "tests/fuzz/fuzz_input.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tg::fuzz::InputFile file("safetensors");
  const std::string& path = file.write(data, size);
  try {
    tg::nn::StateDict sd = tg::nn::safe_load(path);
    for (auto& [name, t] : sd) (void)t.numel();
  } catch (const tg::Error&) {
  }
  return 0;
}
