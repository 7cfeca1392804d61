// The host's description: /proc/cpuinfo and sysfs parsed into a CpuHost, restricted by CPU_ISA.
//
// Note [the host's description]: the kernel optimizer's tiles (codegen/opt.cpp) depend on how
// many vector registers the target has and how wide they are, its cache blocks on the L1 and L2
// caches; the compilers must emit the same ISA the tiles were chosen for. One description per
// value of CPU_ISA holds all of it:
//   - the ISA: the best of avx512 (AVX-512 F, VL, BW, DQ: 32 registers of 512 bits), avx2 (with
//     FMA: 16 of 256) and sse2 (16 of 128) that /proc/cpuinfo's flags allow, or the one CPU_ISA
//     names (an ISA the CPU lacks is an error naming both). LLVM gets the host's features with
//     the rest turned off (llvm_features_for), and on avx512 functions that prefer 512-bit
//     vectors (LLVM's default for Intel's server cores is 256, which halves their FMA rate);
//     the C compiler gets -mno-avx512f or -mno-avx.
//   - the caches: L1d, L2 and L3 from /sys/devices/system/cpu/cpu0/cache/index*/ (level, type,
//     size); where sysfs has none (a container without it), 32 KB, 1 MB and 32 MB.
//   - tiles as for AVX2 on AMD's Zen 4 (cpu family 25 with AVX-512), which runs a 512-bit FMA as
//     two 256-bit halves: its FMA rate is AVX2's, the AVX2 tile of 16 x 5 lanes (five 512-bit
//     accumulators there) reached OpenBLAS's GFLOP/s on it, and the AVX-512 tile of 32 x 4
//     compiled for twice as long (the character GPT's first step 45 s against 21 s, a loaded
//     machine) without being faster in the runs docs/PERFORMANCE.md gives. LLVM still emits
//     AVX-512 there, as before. Intel's AVX-512 cores and Zen 5 get the AVX-512 tiles.
//   - the model name, which with the ISA keys the compiled-kernel and BEAM caches (CpuHost::key),
//     so a choice timed on one machine never serves another.
//   - AVX512-BF16 (the avx512_bf16 flag, under an avx512 ISA): bfloat16 products are laid out
//     around vdpbf16ps (Note [bf16 dot tiles] in codegen/cpu_dot.cpp). AMX tiles are described,
//     not used yet.
#include "tinygrad/runtime/cpu_host.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"

namespace tg {

namespace {

constexpr const char* ISAS[] = {"generic", "sse2", "avx2", "avx512"};  // from least to most

int isa_rank(const std::string& isa) {
  auto it = std::find(std::begin(ISAS), std::end(ISAS), isa);
  return it == std::end(ISAS) ? -1 : static_cast<int>(it - std::begin(ISAS));
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool has_all(const std::set<std::string>& flags, std::initializer_list<const char*> names) {
  return std::all_of(names.begin(), names.end(), [&](const char* n) { return flags.count(n) > 0; });
}

std::string kb(int64_t bytes) { return std::to_string(bytes >> 10) + " KB"; }

}  // namespace

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo info;
  std::istringstream in(text);
  std::string line;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "model name" && !have_model) info.model = value, have_model = true;
    if (key == "vendor_id" && info.vendor.empty()) info.vendor = value;
    if (key == "cpu family" && info.family == 0) info.family = std::atoi(value.c_str());
    if ((key == "flags" || key == "Features") && !have_flags) {  // x86, arm64
      std::istringstream words(value);
      for (std::string w; words >> w;) info.flags.insert(w);
      have_flags = true;
    }
  }
  return info;
}

int64_t parse_cache_size(const std::string& text) {
  std::string t = trim(text);
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) return 0;
  size_t used = 0;
  int64_t n = std::stoll(t, &used);
  std::string unit = t.substr(used);
  if (unit.empty()) return n;
  if (unit == "K" || unit == "KB") return n << 10;
  if (unit == "M" || unit == "MB") return n << 20;
  if (unit == "G" || unit == "GB") return n << 30;
  return 0;
}

CacheSizes read_cache_sizes(const std::string& cache_dir) {
  CacheSizes sizes;
  std::error_code ec;
  for (auto& entry : std::filesystem::directory_iterator(cache_dir, ec)) {
    if (entry.path().filename().string().rfind("index", 0) != 0) continue;
    std::string level = trim(read_text(entry.path() / "level")),
                type = trim(read_text(entry.path() / "type"));
    int64_t size = parse_cache_size(read_text(entry.path() / "size"));
    if (size <= 0) continue;
    if (level == "1" && (type == "Data" || type == "Unified")) sizes.l1d_bytes = size;
    if (level == "2" && type != "Instruction") sizes.l2_bytes = size;
    if (level == "3" && type != "Instruction") sizes.l3_bytes = size;
  }
  return sizes;
}

std::string best_isa(const std::set<std::string>& flags) {
  if (!flags.count("sse2")) return "generic";
  if (has_all(flags, {"avx512f", "avx512vl", "avx512bw", "avx512dq", "fma"})) return "avx512";
  if (has_all(flags, {"avx2", "fma"})) return "avx2";
  return "sse2";
}

CpuHost describe_cpu(const CpuInfo& info, const CacheSizes& caches, const std::string& isa_knob) {
  CpuHost h;
  h.model = info.model.empty() ? "unknown CPU" : info.model;
  h.native_isa = best_isa(info.flags);
  h.isa = isa_knob.empty() || isa_knob == "native" ? h.native_isa : isa_knob;
  TG_CHECK(isa_rank(h.isa) > 0 || h.isa == h.native_isa, "CPU_ISA=", isa_knob,
           ": unknown ISA (expected native, avx512, avx2 or sse2)");
  TG_CHECK(isa_rank(h.isa) <= isa_rank(h.native_isa) && (h.native_isa != "generic" || h.isa == "generic"),
           "CPU_ISA=", isa_knob, ": this CPU (", h.model, ") has ", h.native_isa, ", not ", h.isa);
  h.vector_bits = h.isa == "avx512" ? 512 : h.isa == "avx2" ? 256 : 128;
  h.vector_registers = h.isa == "avx512" || info.flags.count("asimd") ? 32 : 16;
  h.fma = h.isa == "avx512" || h.isa == "avx2" || info.flags.count("asimd");
  h.avx512_bf16 = h.isa == "avx512" && info.flags.count("avx512_bf16");
  h.amx = h.isa == "avx512" && has_all(info.flags, {"amx_tile", "amx_bf16"});
  h.split_512 = h.isa == "avx512" && info.vendor == "AuthenticAMD" && info.family == 25;
  h.cache = caches;
  return h;
}

CpuLimits CpuHost::limits() const {
  CpuLimits l{vector_bits, vector_registers, cache.l1d_bytes, cache.l2_bytes};
  if (split_512) l.vector_bits = 256, l.vector_registers = 16;  // Note [the host's description]
  l.bf16_dot = avx512_bf16;
  return l;
}

std::string CpuHost::str() const {
  std::string s = model + ", " + isa + (isa == native_isa ? "" : " (native " + native_isa + ")") + ": " +
                  std::to_string(vector_bits) + "-bit vectors x " + std::to_string(vector_registers) +
                  " registers";
  if (fma) s += ", FMA";
  if (avx512_bf16) s += ", AVX512-BF16";
  if (amx) s += ", AMX";
  if (split_512) s += ", 512-bit operations in two halves (tiled as AVX2)";
  return s + "; L1d " + kb(cache.l1d_bytes) + ", L2 " + kb(cache.l2_bytes) + ", L3 " + kb(cache.l3_bytes);
}

const CpuHost& cpu_host() {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<CpuHost>> described;  // by CPU_ISA; lives until exit
  std::string knob = knobs::CPU_ISA.get();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = described[knob];
  if (!slot) {
    static const CpuInfo info = parse_cpuinfo(read_text("/proc/cpuinfo"));
    static const CacheSizes caches = read_cache_sizes("/sys/devices/system/cpu/cpu0/cache");
    slot = std::make_unique<CpuHost>(describe_cpu(info, caches, knob));
  }
  return *slot;
}

std::string llvm_features_for(const std::string& host_features, const CpuHost& host) {
  if (host.isa == host.native_isa) return host_features;
  // a feature turned off turns off every feature that implies it (all of AVX-512 with avx512f)
  std::string off = host.isa == "avx2" ? "-avx512f,-amx-tile" : "-avx,-avx512f,-amx-tile";
  return host_features.empty() ? off : host_features + "," + off;
}

std::string llvm_prefer_vector_width(const CpuHost& host) { return std::to_string(host.vector_bits); }

std::string cc_isa_flags(const CpuHost& host) {
  if (host.isa == host.native_isa) return "";
  return host.isa == "avx2" ? " -mno-avx512f -mno-amx-tile" : " -mno-avx -mno-amx-tile";
}

}  // namespace tg
