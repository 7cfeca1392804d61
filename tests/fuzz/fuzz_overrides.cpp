// libFuzzer target: the `key=value` overrides of `tg train` (launcher/config.cpp), one per line of
// the input, applied over the defaults. They are either applied or refused with tg::Error; any
// other exception, a crash or a sanitizer report is a finding. Overrides that apply must give a
// config whose resolved YAML reads back to the same values.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "tinygrad/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<std::string> overrides;
  for (std::string line; std::getline(in, line);) overrides.push_back(line);
  tg::launcher::Config cfg;
  try {
    cfg = tg::launcher::parse_config("", "fuzz.yaml", overrides);
  } catch (const tg::Error&) {
    return 0;
  }
  if (tg::launcher::parse_config(cfg.to_yaml(), "resolved.yaml").values() != cfg.values()) __builtin_trap();
  return 0;
}
