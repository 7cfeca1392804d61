// libFuzzer target: GPT-2 BPE's vocabulary and merges files (tinygrad/nn/bpe.cpp). The input is
// split at its first zero byte into vocab.json and merges.txt; they are either loaded or refused
// with tg::Error. A vocabulary that loads encodes a fixed text, which must decode back to it.
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tg::fuzz::InputFile scratch("bpe");
  static const std::string dir = scratch.path() + ".d";
  std::filesystem::create_directories(dir);
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  std::ofstream(dir + "/vocab.json", std::ios::binary) << input.substr(0, cut);
  std::ofstream(dir + "/merges.txt", std::ios::binary) << (cut == std::string::npos ? "" : input.substr(cut + 1));
  try {
    tg::nn::Gpt2Bpe bpe = tg::nn::Gpt2Bpe::load(dir);
    const std::string text = "hello world's 42 caf\xc3\xa9!\n";
    if (tg::nn::Gpt2Bpe::available() && bpe.decode(bpe.encode(text)) != text) __builtin_trap();
  } catch (const tg::Error&) {
  }
  return 0;
}
