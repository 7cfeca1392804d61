// libFuzzer target: the YAML config loader (launcher/config.cpp over yaml-cpp) on arbitrary text.
// The text is either resolved into a config or refused with tg::Error; any other exception, a
// crash or a sanitizer report is a finding. A config that resolves must also survive its own
// resolved YAML (what `tg train` writes to config.yaml) with the same values.
#include <cstdint>
#include <string>

#include "launcher/config.h"
#include "tinygrad/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tg::launcher::Config cfg;
  try {
    cfg = tg::launcher::parse_config(text, "fuzz.yaml");
  } catch (const tg::Error&) {
    return 0;
  }
  if (tg::launcher::parse_config(cfg.to_yaml(), "resolved.yaml").values() != cfg.values()) __builtin_trap();
  return 0;
}
