// libFuzzer target: the IDX reader (tinygrad/nn/data.cpp, plain and gzipped) on arbitrary bytes.
// A file is either read or refused with tg::Error; any other exception, a crash or a sanitizer
// report is a finding.
#include "tests/fuzz/fuzz_input.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tg::fuzz::InputFile file("idx");
  const std::string& path = file.write(data, size);
  try {
    tg::nn::IdxArray a = tg::nn::read_idx(path);
    if (static_cast<size_t>(a.numel()) != a.data.size()) __builtin_trap();  // the reader's own promise
  } catch (const tg::Error&) {
  }
  return 0;
}
