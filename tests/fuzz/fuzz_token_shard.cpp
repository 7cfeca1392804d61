// libFuzzer target: the llm.c token shard reader (tinygrad/nn/tokens.cpp, memory-mapped) on
// arbitrary bytes. A shard is either read or refused with tg::Error; any other exception, a crash
// or a sanitizer report is a finding. Every token of a shard it accepts is read.
#include "tests/fuzz/fuzz_input.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tg::fuzz::InputFile file("shard");
  const std::string& path = file.write(data, size);
  try {
    tg::nn::TokenShard shard(path);
    uint32_t sum = 0;
    for (int64_t i = 0; i < shard.size(); i++) sum += shard.tokens()[i];
    if (shard.size() < 0 || (shard.size() > 0 && sum == 0xFFFFFFFFu)) __builtin_trap();  // keeps the reads
  } catch (const tg::Error&) {
  }
  return 0;
}
