// The host's description (runtime/cpu_host.h): /proc/cpuinfo and sysfs parsed from fake trees,
// the ISA and its restriction by CPU_ISA, the register tiles and cache blocks the kernel
// optimizer derives for a fake AVX2 and a fake AVX-512 host, what LLVM is asked to emit, and the
// BEAM cache keyed per CPU model and ISA.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"
#include "tinygrad/codegen/opt.h"
#include "tinygrad/codegen/pipeline.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/beam.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/runtime/cpu_host.h"
#include "tinygrad/schedule/schedule.h"
#include "tinygrad/tensor.h"
#ifdef TG_WITH_LLVM
#include "tinygrad/codegen/render_llvm.h"
#include "tinygrad/runtime/cpu_llvm.h"
#endif

using namespace tg;
using tg::testutil::expect_error;
using tg::testutil::KnobScope;

namespace {

const char* AVX2_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2";
const char* AVX512_FLAGS =
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl "
    "avx512_bf16 amx_bf16 amx_tile amx_int8";

CpuInfo fake_cpu(const std::string& model, const std::string& flags, const std::string& vendor = "GenuineIntel",
                 int family = 6) {
  return parse_cpuinfo("processor\t: 0\nvendor_id\t: " + vendor + "\ncpu family\t: " + std::to_string(family) +
                       "\nmodel name\t: " + model + "\nflags\t\t: " + flags + "\n\n");
}

CpuHost fake_host(const std::string& flags, const std::string& isa = "native",
                  CacheSizes caches = {int64_t{32} << 10, int64_t{1} << 20, int64_t{32} << 20}) {
  return describe_cpu(fake_cpu("Fake CPU", flags), caches, isa);
}

ScheduleItem only_kernel(const Tensor& t) {
  auto items = create_schedule({t.uop()});
  EXPECT_EQ(items.size(), 1u);
  return items.at(0);
}

Tensor realized_randn(const Shape& s, uint64_t seed) {
  Tensor::manual_seed(seed);
  return Tensor::randn(s).realize();
}

// The CPU device's limits: the host's, with bf16 dot tiles only where LLVM compiles the kernels
// (Note [bf16 dot tiles] in codegen/cpu_dot.cpp).
CpuLimits device_limits() {
  CpuLimits l = cpu_host().limits();
  l.bf16_dot = l.bf16_dot && cpu_compiler_kind() == "llvm";
  return l;
}

// The ISA one step below this host's, or "" where there is none (a generic CPU, sse2).
std::string isa_below_native() {
  const std::string native = cpu_host().native_isa;
  return native == "avx512" ? "avx2" : native == "avx2" ? "sse2" : "";
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

class CpuHostFiles : public testutil::TempDirTest {};

}  // namespace

TEST(CpuHost, ParsesCpuinfoOfTheFirstProcessor) {
  CpuInfo info = parse_cpuinfo(
      "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ "
      "2.70GHz\n"
      "flags\t\t: fpu sse2 avx2 fma avx512f\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n");
  EXPECT_EQ(info.model, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz");
  EXPECT_EQ(info.vendor, "GenuineIntel");
  EXPECT_EQ(info.flags, (std::set<std::string>{"fpu", "sse2", "avx2", "fma", "avx512f"}));
  EXPECT_EQ(parse_cpuinfo("").model, "");
}

TEST(CpuHost, ParsesCacheSizes) {
  EXPECT_EQ(parse_cache_size("32K\n"), 32 << 10);
  EXPECT_EQ(parse_cache_size("1024K"), 1 << 20);
  EXPECT_EQ(parse_cache_size("2M"), 2 << 20);
  EXPECT_EQ(parse_cache_size("4096"), 4096);
  EXPECT_EQ(parse_cache_size(""), 0);
  EXPECT_EQ(parse_cache_size("big"), 0);
  EXPECT_EQ(parse_cache_size("3Q"), 0);
}

// A sysfs cache directory as Linux writes it, in real files: an instruction cache beside the L1
// data cache must not be taken for it, and a missing size keeps the default.
TEST_F(CpuHostFiles, ReadsCacheSizesFromSysfs) {
  auto index = [&](int i, const char* level, const char* type, const char* size) {
    write(dir_ / ("index" + std::to_string(i)) / "level", std::string(level) + "\n");
    write(dir_ / ("index" + std::to_string(i)) / "type", std::string(type) + "\n");
    if (*size) write(dir_ / ("index" + std::to_string(i)) / "size", std::string(size) + "\n");
  };
  index(0, "1", "Instruction", "32K");
  index(1, "1", "Data", "48K");
  index(2, "2", "Unified", "2048K");
  index(3, "3", "Unified", "");
  write(dir_ / "uevent", "");
  CacheSizes c = read_cache_sizes(dir_.string());
  EXPECT_EQ(c.l1d_bytes, 48 << 10);
  EXPECT_EQ(c.l2_bytes, 2 << 20);
  EXPECT_EQ(c.l3_bytes, CacheSizes{}.l3_bytes);
  CacheSizes none = read_cache_sizes((dir_ / "missing").string());
  EXPECT_EQ(none.l1d_bytes, CacheSizes{}.l1d_bytes);
  EXPECT_EQ(none.l2_bytes, CacheSizes{}.l2_bytes);
}

TEST(CpuHost, DescribesTheIsaFromTheFlags) {
  CpuHost avx2 = fake_host(AVX2_FLAGS);
  EXPECT_EQ(avx2.isa, "avx2");
  EXPECT_EQ(avx2.vector_bits, 256);
  EXPECT_EQ(avx2.vector_registers, 16);
  EXPECT_TRUE(avx2.fma);
  EXPECT_FALSE(avx2.avx512_bf16);
  CpuHost avx512 = fake_host(AVX512_FLAGS);
  EXPECT_EQ(avx512.isa, "avx512");
  EXPECT_EQ(avx512.vector_bits, 512);
  EXPECT_EQ(avx512.vector_registers, 32);
  EXPECT_TRUE(avx512.avx512_bf16);
  EXPECT_TRUE(avx512.amx);
  EXPECT_HAS(avx512.str(),
             "Fake CPU, avx512: 512-bit vectors x 32 registers, FMA, AVX512-BF16, AMX; L1d 32 KB");
  EXPECT_EQ(fake_host("fpu sse sse2").isa, "sse2");
  EXPECT_EQ(fake_host("fpu sse2 avx2").isa, "sse2");  // AVX2 without FMA is not the avx2 level
  EXPECT_EQ(fake_host("fp asimd").isa, "generic");
}

// Note [the host's description]: AMD's Zen 4 (family 25) runs 512-bit operations in two halves
// and is tiled as an AVX2 core, while its kernels stay AVX-512; Zen 5 (family 26) is not.
TEST(CpuHost, Zen4IsTiledAsAvx2) {
  CpuInfo zen4 = fake_cpu("AMD EPYC 9B14", AVX512_FLAGS, "AuthenticAMD", 25);
  EXPECT_EQ(zen4.family, 25);
  CpuHost h = describe_cpu(zen4, {}, "native");
  EXPECT_EQ(h.isa, "avx512");
  EXPECT_EQ(h.vector_bits, 512);
  EXPECT_TRUE(h.split_512);
  EXPECT_EQ(h.limits(), (CpuLimits{.bf16_dot = true}));  // AVX2's tiles, and AVX512-BF16's products
  EXPECT_HAS(h.str(), "tiled as AVX2");
  CpuHost zen5 = describe_cpu(fake_cpu("AMD EPYC 9005", AVX512_FLAGS, "AuthenticAMD", 26), {}, "native");
  EXPECT_FALSE(zen5.split_512);
  EXPECT_EQ(zen5.limits().vector_bits, 512);
  EXPECT_EQ(zen5.limits().vector_registers, 32);
  EXPECT_FALSE(describe_cpu(zen4, {}, "avx2").split_512);
}

// Note [the host's description]: CPU_ISA restricts the description (and what the compilers
// emit) to a lower ISA; one the CPU lacks, or an unknown name, is an error naming both.
TEST(CpuHost, TheKnobRestrictsTheIsa) {
  CpuHost avx2 = fake_host(AVX512_FLAGS, "avx2");
  EXPECT_EQ(avx2.isa, "avx2");
  EXPECT_EQ(avx2.native_isa, "avx512");
  EXPECT_EQ(avx2.vector_bits, 256);
  EXPECT_EQ(avx2.vector_registers, 16);
  EXPECT_FALSE(avx2.avx512_bf16);
  EXPECT_FALSE(avx2.amx);
  EXPECT_HAS(avx2.str(), "avx2 (native avx512)");
  EXPECT_EQ(fake_host(AVX512_FLAGS, "sse2").vector_bits, 128);
  EXPECT_EQ(fake_host(AVX512_FLAGS, "avx512").isa, "avx512");
  expect_error([] { fake_host(AVX2_FLAGS, "avx512"); },
               {"CPU_ISA=avx512", "Fake CPU", "has avx2, not avx512"});
  expect_error([] { fake_host("fp asimd", "avx2"); }, {"CPU_ISA=avx2", "has generic, not avx2"});
  expect_error([] { fake_host(AVX2_FLAGS, "avx3"); },
               {"CPU_ISA=avx3: unknown ISA", "native, avx512, avx2 or sse2"});
  // the feature string LLVM gets: AVX-512 (and with it everything that implies it) off
  const std::string host = "+sse2,+avx,+avx2,+fma,+avx512f,+avx512bw,+amx-tile";
  EXPECT_EQ(llvm_features_for(host, fake_host(AVX512_FLAGS)), host);
  EXPECT_EQ(llvm_features_for(host, avx2), host + ",-avx512f,-amx-tile");
  EXPECT_EQ(llvm_features_for(host, fake_host(AVX512_FLAGS, "sse2")), host + ",-avx,-avx512f,-amx-tile");
  EXPECT_EQ(cc_isa_flags(avx2), " -mno-avx512f -mno-amx-tile");
  EXPECT_EQ(cc_isa_flags(fake_host(AVX512_FLAGS)), "");
  // the compiled-kernel and BEAM caches key on the model and the ISA
  EXPECT_NE(avx2.key(), fake_host(AVX512_FLAGS).key());
  EXPECT_NE(describe_cpu(fake_cpu("CPU A", AVX2_FLAGS), {}, "native").key(),
            describe_cpu(fake_cpu("CPU B", AVX2_FLAGS), {}, "native").key());
}

// Note [tiles from the host]: the AVX2 host's sizes are the constants the heuristics were tuned
// with; the AVX-512 host's register tile is two 512-bit vectors wide and up to 8 rows tall
// (Note [full-width tiles]: 16 accumulators, twice the FMAs two ports of latency 4 keep in flight).
TEST(CpuHost, TilesFollowTheHost) {
  CpuLimits avx2 = fake_host(AVX2_FLAGS).limits(), avx512 = fake_host(AVX512_FLAGS).limits();
  EXPECT_EQ(avx2, CpuLimits{});
  CpuTiles t2 = cpu_tiles(avx2), t5 = cpu_tiles(avx512);
  EXPECT_EQ(t2.wide_lanes, 16);
  EXPECT_EQ(t2.max_accumulators, 80);
  EXPECT_EQ(t2.max_tile_rows, 5);
  EXPECT_EQ(t2.k_block, 256);
  EXPECT_EQ(t2.row_block, 64);
  EXPECT_EQ(t2.min_panel_bytes, 512 << 10);
  EXPECT_EQ(t5.wide_lanes, 32);
  EXPECT_EQ(t5.max_accumulators, 256);  // 26 of the 32 registers, but at most 256 lanes
  EXPECT_EQ(t5.max_tile_rows, 8);
  EXPECT_EQ(t5.k_block, 128);
  EXPECT_EQ(t5.row_block, 128);
  EXPECT_HAS(cpu_tiles_str(avx512), "32 contiguous lanes x up to 8 rows");
  // Note [blocks of B panels]: from B panels, K blocks of a panel in 1/16 of the L2 and A blocks
  // of half the L2
  EXPECT_EQ(t2.panel_k_block, 1024);
  EXPECT_EQ(t2.a_block_bytes, 512 << 10);
  EXPECT_EQ(t5.panel_k_block, 512);
  EXPECT_EQ(t2.panel_whole_k, 2048);
  EXPECT_EQ(t5.panel_whole_k, 1024);
  // the 2-core Intel Xeon's caches: 48 KB L1d, 2 MB L2
  CpuTiles xeon = cpu_tiles(fake_host(AVX512_FLAGS, "native", {48 << 10, 2 << 20, 480 << 20}).limits());
  EXPECT_EQ(xeon.k_block, 192);
  EXPECT_EQ(xeon.panel_k_block, 1024);
  EXPECT_EQ(xeon.panel_whole_k, 2048);
  EXPECT_EQ(xeon.a_block_bytes, 1 << 20);
  EXPECT_HAS(cpu_tiles_str(avx512), "from B panels: K blocks of up to 512 (K of up to 1024 whole), A blocks of 512 KB");
  // Note [rows of a narrow tile]: a tile one vector wide gets twice the rows (48 columns: 16
  // lanes, one 512-bit vector or two 256-bit ones)
  Tensor p = realized_randn({64, 64}, 7), q = realized_randn({64, 48}, 8);
  ScheduleItem narrow = only_kernel(p.matmul(q));
  EXPECT_EQ(opts_str(hand_coded_opts(narrow.ast, avx2)), "UPCAST(0,4) UPCAST(1,16)");
  EXPECT_EQ(opts_str(hand_coded_opts(narrow.ast, avx512)), "UPCAST(0,16) UPCAST(1,16)");

  Tensor a = realized_randn({40, 64}, 1), b = realized_randn({64, 64}, 2);
  ScheduleItem mm = only_kernel(a.matmul(b));
  EXPECT_EQ(opts_str(hand_coded_opts(mm.ast, avx2)), "UPCAST(0,5) UPCAST(1,16)");
  EXPECT_EQ(opts_str(hand_coded_opts(mm.ast, avx512)), "UPCAST(0,8) UPCAST(1,32)");
  // a large matmul gets cache blocks from the caches: K blocks of a B panel in half the L1
  Tensor c = realized_randn({64, 512}, 3), d = realized_randn({512, 272}, 4);
  ScheduleItem large = only_kernel(c.matmul(d));
  EXPECT_EQ(opts_str(hand_coded_opts(large.ast, avx2)),
            "BLOCK(1,272) BLOCK(0,32) KBLOCK(2,256) UPCAST(4,4) UPCAST(3,16)");
  CpuLimits big_l1 = avx2;
  big_l1.l1d_bytes = 64 << 10;
  EXPECT_EQ(opts_str(hand_coded_opts(large.ast, big_l1)),
            "BLOCK(1,272) BLOCK(0,32) KBLOCK(2,256) UPCAST(4,4) UPCAST(3,16)")
      << "512 is not below the loop's size";
  CpuLimits small_l2 = avx2;
  small_l2.l2_bytes = 256 << 10;
  EXPECT_EQ(opts_str(hand_coded_opts(large.ast, small_l2)),
            "BLOCK(1,272) BLOCK(0,16) KBLOCK(2,256) UPCAST(4,4) UPCAST(3,16)");
  // partial sums along a contiguous reduce: two vectors of lanes
  ScheduleItem sum = only_kernel(a.sum(1));
  EXPECT_EQ(opts_str(hand_coded_opts(sum.ast, avx2)), "UNROLL(1,16)");
  EXPECT_EQ(opts_str(hand_coded_opts(sum.ast, avx512)), "UNROLL(1,32)");
}

// The CPU device tiles for this machine's description under CPU_ISA, and the compiler's cache
// key names the model and the ISA.
TEST(CpuHost, TheDeviceFollowsTheKnob) {
  KnobScope native_isa(knobs::CPU_ISA, "native");  // whatever the environment says
  Device& cpu = get_device("CPU");
  EXPECT_EQ(cpu.policy().cpu, device_limits());
  EXPECT_HAS(cpu.compiler().cache_key(), cpu_host().key());
  EXPECT_HAS(cpu.description(), cpu_host().str());
  {
    KnobScope isa(knobs::CPU_ISA, "avx3");
    expect_error([] { cpu_host(); }, {"CPU_ISA=avx3: unknown ISA"});
  }
  const std::string lower = isa_below_native();
  if (lower.empty()) GTEST_SKIP() << "this CPU (" << cpu_host().str() << ") has no lower ISA to restrict to";
  const std::string native_key = cpu.compiler().cache_key();
  KnobScope isa(knobs::CPU_ISA, lower);
  EXPECT_EQ(cpu_host().isa, lower);
  EXPECT_EQ(cpu.policy().cpu, device_limits());
  EXPECT_FALSE(cpu.policy().cpu.bf16_dot);
  EXPECT_NE(cpu.compiler().cache_key(), native_key);
  EXPECT_NE(codegen_key().find("CPU_ISA=" + lower), std::string::npos) << codegen_key();
  // kernels compiled for the lower ISA compute what the native ones do
  Tensor a = realized_randn({40, 64}, 5), b = realized_randn({64, 48}, 6);
  std::vector<float> restricted = (a.matmul(b) + 1.0).relu().to_vector<float>();
  std::vector<float> native;
  {
    KnobScope back(knobs::CPU_ISA, "native");
    native = (a.matmul(b) + 1.0).relu().to_vector<float>();
  }
  ASSERT_EQ(restricted.size(), native.size());
  for (size_t i = 0; i < native.size(); i++)
    ASSERT_NEAR(restricted[i], native[i], 1e-4 * (1 + std::abs(native[i])));
}

// The flags of the mapping of /proc/self/smaps that holds `p` (its VmFlags line), or "".
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) inside = lo <= at && at < hi;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Note [huge pages for large buffers] in runtime/cpu.cpp: a buffer of 4 MB or more is aligned to
// a 2 MB page and its mapping asks for transparent huge pages (VmFlags "hg"); a small one keeps
// cache-line alignment. Both hold what is written to them.
TEST(CpuHost, LargeBuffersAskForHugePages) {
  Allocator& allocator = get_device("CPU").allocator();
  const size_t large = (size_t{8} << 20) + 4, small = 1000;
  auto* big = static_cast<float*>(allocator.alloc(large));
  auto* little = static_cast<float*>(allocator.alloc(small));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % (size_t{2} << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(little) % 64, 0u);
  EXPECT_HAS(vm_flags_of(big), " hg");
  for (size_t i = 0; i < large / 4; i += 1021) big[i] = static_cast<float>(i);
  for (size_t i = 0; i < small / 4; i++) little[i] = static_cast<float>(i);
  for (size_t i = 0; i < large / 4; i += 1021) ASSERT_EQ(big[i], static_cast<float>(i));
  for (size_t i = 0; i < small / 4; i++) ASSERT_EQ(little[i], static_cast<float>(i));
  allocator.free(big, large);
  allocator.free(little, small);
}

#ifdef TG_WITH_LLVM
// What LLVM emits follows the ISA: a 32-lane tile is packed into 512-bit vectors on an AVX-512
// host, and into no vector wider than 256 bits with CPU_ISA=avx2.
TEST(CpuHost, LlvmEmitsTheRestrictedIsa) {
  if (cpu_host().native_isa != "avx512")
    GTEST_SKIP() << "needs an AVX-512 host, this is " << cpu_host().str();
  Tensor a = realized_randn({8, 64}, 7), b = realized_randn({64, 64}, 8);
  ScheduleItem item = only_kernel(a.matmul(b));
  std::vector<DType> dtypes = param_dtypes(item);
  LLVMRenderer renderer;
  DevicePolicy policy;
  auto ir_for = [&](const std::string& isa) {
    KnobScope scope(knobs::CPU_ISA, isa);
    auto k = lower_with_choice(item.ast, dtypes, CodegenTarget{renderer, policy},
                               KernelChoice::generated({{OptOp::UPCAST, 0, 2}, {OptOp::UPCAST, 1, 32}}));
    return llvm_optimized_ir(k.source);
  };
  std::string wide = ir_for("native"), narrow = ir_for("avx2");
  EXPECT_HAS(wide, "<16 x float>");
  EXPECT_EQ(narrow.find("<16 x float>"), std::string::npos);
  EXPECT_HAS(narrow, "<8 x float>");
  EXPECT_HAS(narrow, "-avx512f");
}
#endif

// A BEAM choice is cached per CPU model and ISA: the same kernel under a lower ISA is searched
// again into a cache entry of its own.
TEST_F(CpuHostFiles, BeamCachesPerIsa) {
  const std::string lower = isa_below_native();
  if (lower.empty()) GTEST_SKIP() << "this CPU (" << cpu_host().str() << ") has no lower ISA to restrict to";
  KnobScope cachedir(knobs::CACHEDIR, dir_.string());
  KnobScope native_isa(knobs::CPU_ISA, "native");  // whatever the environment says
  Tensor a = realized_randn({8, 16}, 9), b = realized_randn({16, 8}, 10);
  ScheduleItem item = only_kernel(a.matmul(b));
  auto entries = [&] {
    size_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir_ / "beam")) n += e.path().extension() == ".txt";
    return n;
  };
  beam_search(item, 1);
  EXPECT_EQ(entries(), 1u);
  beam_search(item, 1);
  EXPECT_EQ(entries(), 1u) << "the same host found its entry";
  KnobScope isa(knobs::CPU_ISA, lower);
  beam_search(item, 1);
  EXPECT_EQ(entries(), 2u) << "the entry of the native ISA served " << lower;
}
