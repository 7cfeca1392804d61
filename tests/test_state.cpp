// safetensors: round trips for every dtype, a file built byte by byte from the published format,
// strict refusal of malformed files (each with its named error) and atomic saving.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tinygrad/nn/state.h"
#include "test_util.h"

using namespace tg;
using namespace tg::nn;
using tg::testutil::error_of;
namespace fs = std::filesystem;

namespace {

class StateTest : public tg::testutil::TempDirTest {};

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
// A safetensors file: length prefix, the header text as given, then the data.
std::string file_of(const std::string& header, const std::string& data) {
  return u64le(header.size()) + header + data;
}


}  // namespace

TEST_F(StateTest, RoundTripEveryDtype) {
  std::vector<uint8_t> bools = {1, 0, 0, 1, 1, 0};
  std::vector<uint8_t> u8 = {0, 1, 127, 128, 254, 255};
  std::vector<int32_t> i32 = {0, -1, 2147483647, -2147483647 - 1, 12345, -54321};
  std::vector<int64_t> i64 = {0, -1, 9007199254740993LL /* 2^53+1: not a double */, INT64_MIN, INT64_MAX, 42};
  std::vector<uint16_t> f16 = {float_to_half(0.f), float_to_half(1.f), float_to_half(-2.5f), float_to_half(65504.f),
                               float_to_half(0.0001f), float_to_half(-0.f)};
  std::vector<uint16_t> bf16 = {float_to_bfloat(0.f), float_to_bfloat(1.f), float_to_bfloat(-3.140625f),
                                float_to_bfloat(1e30f), float_to_bfloat(-1e-30f), float_to_bfloat(7.f)};
  std::vector<float> f32 = {0.f, 1.5f, -2.25f, 3.4e38f, 1e-38f, 0.1f};
  std::vector<double> f64 = {0.0, 0.1, -1e300, 1e-300, 3.141592653589793, -0.0};
  StateDict sd;
  sd["bool"] = Tensor::from_data(bools.data(), DType::Bool, {2, 3});
  sd["u8"] = Tensor::from_data(u8.data(), DType::UInt8, {6});
  sd["i32"] = Tensor::from_data(i32.data(), DType::Int32, {3, 2});
  sd["i64"] = Tensor::from_data(i64.data(), DType::Int64, {6});
  sd["f16"] = Tensor::from_data(f16.data(), DType::Float16, {1, 6});
  sd["bf16"] = Tensor::from_data(bf16.data(), DType::BFloat16, {6, 1});
  sd["f32"] = Tensor::from_data(f32.data(), DType::Float32, {2, 3});
  sd["f64"] = Tensor::from_data(f64.data(), DType::Float64, {6});
  sd["scalar"] = Tensor::scalar(7.5);
  sd["empty"] = Tensor::zeros({0, 3});
  sd["view.permuted"] = Tensor::from_data(f32.data(), DType::Float32, {2, 3}).permute({1, 0});  // not contiguous
  sd["computed"] = Tensor::from_data(f32.data(), DType::Float32, {2, 3}) * 2.0;                 // lazy
  std::string p = path("all.safetensors");
  safe_save(sd, p, {{"format", "tinygrad++"}, {"step", "12"}});

  StateDict got = safe_load(p);
  ASSERT_EQ(got.size(), sd.size());
  for (auto& [name, t] : sd) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(got[name].dtype(), t.dtype()) << name;
    EXPECT_EQ(got[name].shape(), t.shape()) << name;
    if (t.dtype() != DType::Int64) {
      EXPECT_EQ(got[name].to_vector<double>(), t.to_vector<double>()) << name;
    }
  }
  EXPECT_EQ(got["u8"].to_vector<uint8_t>(), u8);
  EXPECT_EQ(got["i32"].to_vector<int32_t>(), i32);
  EXPECT_EQ(got["view.permuted"].to_vector<float>(), (std::vector<float>{0.f, 3.4e38f, 1.5f, 1e-38f, -2.25f, 0.1f}));
  EXPECT_EQ(got["f16"].to_vector<float>()[2], -2.5f);
  EXPECT_EQ(got["bf16"].to_vector<float>()[2], -3.140625f);
  Metadata want{{"format", "tinygrad++"}, {"step", "12"}};
  for (auto& [name, t] : sd) want[checksum_key(name)] = safe_metadata(p).at(checksum_key(name));  // and a checksum each
  want["tg.header_crc32"] = safe_metadata(p).at("tg.header_crc32");  // and one of the header
  EXPECT_EQ(want["tg.header_crc32"].size(), 8u);
  EXPECT_EQ(safe_metadata(p), want);

  // int64 must survive bit-exactly (a detour through double would turn 2^53+1 into 2^53): the
  // file holds the original bytes, and saving what was loaded gives the same file.
  auto header = safe_header(p);
  std::string bytes = read_bytes(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::vector<int64_t> stored(6);
  std::memcpy(stored.data(), bytes.data() + 8 + n + header["i64"].begin, 48);
  EXPECT_EQ(stored, i64);
  std::string p2 = path("again.safetensors");
  safe_save(got, p2, safe_metadata(p));
  EXPECT_EQ(read_bytes(p2), bytes);
}

TEST_F(StateTest, WrittenFileFollowsTheFormat) {
  StateDict sd;
  sd["z"] = Tensor::from_vector(std::vector<float>{1.f, 2.f}, {2});
  sd["a"] = Tensor::from_vector(std::vector<uint8_t>{9, 8, 7}, {3});
  sd["m"] = Tensor::from_vector(std::vector<int64_t>{-2}, {1, 1});
  std::string p = path("fmt.safetensors");
  safe_save(sd, p, {{"k", "v"}});
  std::string bytes = read_bytes(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header is padded to a multiple of 8";
  ASSERT_LE(8 + n, bytes.size());
  std::string text = bytes.substr(8, n);
  EXPECT_EQ(text.front(), '{');
  EXPECT_EQ(text.find_last_not_of(' ') + 1, text.find_last_of('}') + 1) << "padding is spaces after the object";
  auto h = nlohmann::json::parse(text);
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  // Sorted name order, contiguous offsets from 0.
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({0, 3}));
  EXPECT_EQ(h["m"]["data_offsets"], nlohmann::json({3, 11}));
  EXPECT_EQ(h["z"]["data_offsets"], nlohmann::json({11, 19}));
  EXPECT_EQ(h["a"]["dtype"], "U8");
  EXPECT_EQ(h["m"]["dtype"], "I64");
  EXPECT_EQ(h["m"]["shape"], nlohmann::json({1, 1}));
  EXPECT_EQ(h["z"]["dtype"], "F32");
  EXPECT_EQ(bytes.size(), 8 + n + 19);
  std::string data = bytes.substr(8 + n);
  EXPECT_EQ(data.substr(0, 3), std::string("\x09\x08\x07"));
  EXPECT_EQ(data.substr(3, 8), std::string("\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8));
  EXPECT_EQ(data.substr(11, 8), std::string("\x00\x00\x80\x3F\x00\x00\x00\x40", 8));  // 1.0f, 2.0f
}

TEST_F(StateTest, LoadsAFileBuiltByteByByte) {
  // The entries' data are deliberately not in name order, and the header is not padded.
  std::string header =
      R"({"__metadata__":{"format":"pt","source":"hand"},)"
      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[11,19]},)"
      R"("h":{"dtype":"F16","shape":[2],"data_offsets":[19,23]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[23,27]},)"
      R"("i":{"dtype":"I64","shape":[],"data_offsets":[3,11]},)"
      R"("u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  std::string data;
  data += std::string("\x00\x07\xFF", 3);                                  // u: 0, 7, 255
  data += std::string("\xFD\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8);               // i: -3
  data += std::string("\x00\x00\xC0\x3F\x00\x00\x00\xC0", 8);               // w: 1.5, -2
  data += std::string("\x00\x3C\x00\xB8", 4);                               // h: 1, -0.5
  data += std::string("\x40\x40\x00\x3F", 4);                               // b: 3, 0.5
  std::string p = path("hand.safetensors");
  write_bytes(p, file_of(header, data));
  StateDict sd = safe_load(p, "CPU");
  ASSERT_EQ(sd.size(), 5u);
  EXPECT_EQ(sd["u"].dtype(), DType::UInt8);
  EXPECT_EQ(sd["u"].to_vector<uint8_t>(), (std::vector<uint8_t>{0, 7, 255}));
  EXPECT_EQ(sd["i"].dtype(), DType::Int64);
  EXPECT_EQ(sd["i"].shape(), Shape{});
  EXPECT_EQ(sd["i"].item<int64_t>(), -3);
  EXPECT_EQ(sd["w"].dtype(), DType::Float32);
  EXPECT_EQ(sd["w"].to_vector<float>(), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(sd["h"].dtype(), DType::Float16);
  EXPECT_EQ(sd["h"].to_vector<float>(), (std::vector<float>{1.f, -0.5f}));
  EXPECT_EQ(sd["b"].dtype(), DType::BFloat16);
  EXPECT_EQ(sd["b"].shape(), (Shape{1, 2}));
  EXPECT_EQ(sd["b"].to_vector<float>(), (std::vector<float>{3.f, 0.5f}));
  EXPECT_EQ(sd["w"].device(), "CPU");
  EXPECT_EQ(safe_metadata(p), (Metadata{{"format", "pt"}, {"source", "hand"}}));

  // The same with the padding Python's safetensors writes, and a BOOL entry.
  std::string h2 = R"({"t":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  h2.append((8 - h2.size() % 8) % 8, ' ');
  write_bytes(p, file_of(h2, std::string("\x01\x00\x01", 3)));
  auto sd2 = safe_load(p);
  EXPECT_EQ(sd2["t"].dtype(), DType::Bool);
  EXPECT_EQ(sd2["t"].to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_TRUE(safe_metadata(p).empty());
}

TEST_F(StateTest, RefusesMalformedFiles) {
  std::string p = path("bad.safetensors");
  auto refuse = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    std::string m = error_of([&] { safe_load(p); });
    EXPECT_HAS(m, p);  // every message names the file
    return m;
  };
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  // Too short, bad header lengths.
  EXPECT_HAS(refuse(""), "shorter than the 8-byte header length");
  EXPECT_HAS(refuse("\x05\x00\x00"), "shorter than the 8-byte header length");
  EXPECT_HAS(refuse(u64le(1000) + "{}"), "header length 1000 is larger than the file");
  EXPECT_HAS(refuse(u64le(1ull << 40) + "{}"), "is absurd");
  // Not JSON, not an object.
  EXPECT_HAS(refuse(file_of(R"({"a": {"dtype": )", "")), "header is not valid JSON");
  EXPECT_HAS(refuse(file_of("[1, 2]", "")), "header must be a JSON object");
  EXPECT_HAS(refuse(file_of(R"({"a":1,"a":2})", "")), "names 'a' twice");
  // Entries with missing fields or wrong types.
  EXPECT_HAS(refuse(file_of(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))), "entry 'a': missing \"dtype\"");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0'))), "missing \"shape\"");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + "}}", std::string(8, '\0'))), "missing \"data_offsets\"");
  EXPECT_HAS(refuse(file_of(R"({"a":[1]})", "")), "entry 'a': must be an object");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":1,"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))), "\"dtype\" must be a string");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", std::string(8, '\0'))), "\"shape\" must be an array");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'))), "shape[0] must be a non-negative integer");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, '\0'))), "shape[0] must be a non-negative integer");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0]}})", std::string(8, '\0'))), "\"data_offsets\" must be [begin, end]");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":"0,8"}})", std::string(8, '\0'))), "\"data_offsets\" must be [begin, end]");
  EXPECT_HAS(refuse(file_of(R"({"__metadata__":{"k":1}})", "")), "\"__metadata__\" value of 'k' must be a string");
  EXPECT_HAS(refuse(file_of(R"({"__metadata__":[]})", "")), "\"__metadata__\" must be an object");
  // Dtypes.
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))), "unknown dtype 'F99'");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", std::string(8, '\0'))), "dtype 'I16' is a safetensors dtype tinygrad++ has no dtype for");
  // Offsets and sizes.
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[8,0]}})", std::string(8, '\0'))), "data_offsets begin 8 > end 0");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(4, '\0'))), "reach beyond the data section (4 bytes)");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,12]}})", std::string(12, '\0'))), "byte size 12 (data_offsets [0, 12]) does not match shape [2] of F32 (8 bytes)");
  EXPECT_HAS(refuse(file_of(R"({"a":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", std::string(8, '\0'))), "shape [4294967296,4294967296]: its dimensions multiply past");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[4,12]}})",
                            std::string(12, '\0'))),
             "entry 'b' data_offsets [4, 12] overlap entry 'a'");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[0,8]}})",
                            std::string(8, '\0'))),
             "overlap");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[12,20]}})",
                            std::string(20, '\0'))),
             "hole in the data section: bytes [8, 12) belong to no tensor");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[4,12]}})", std::string(12, '\0'))), "hole in the data section: bytes [0, 4)");
  EXPECT_HAS(refuse(file_of("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(10, '\0'))), "bytes [8, 10) at the end belong to no tensor");
  // A missing file.
  std::string missing = path("nope.safetensors");
  EXPECT_HAS(error_of([&] { safe_load(missing); }), "safetensors file '" + missing + "': no such file");
  EXPECT_HAS(error_of([&] { safe_metadata(missing); }), "no such file");
}

// A header value nested 70,000 deep (a 140 KB file) used to overflow the stack in nlohmann's
// recursive dump() while the error message was built (Note [header nesting] in state.cpp).
TEST_F(StateTest, RefusesDeeplyNestedHeadersWithoutRecursing) {
  std::string p = path("deep.safetensors");
  const int depth = 70000;
  std::string shape = std::string(depth, '[') + std::string(depth, ']');
  write_bytes(p, file_of(R"({"a":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,0]}})", ""));
  for (auto* reader : {+[](const std::string& f) { safe_load(f); }, +[](const std::string& f) { safe_metadata(f); }}) {
    std::string m = error_of([&] { reader(p); });
    EXPECT_HAS(m, p);
    EXPECT_HAS(m, "header nests arrays and objects more than 16 deep");
  }
  // Brackets inside strings do not count; 16 levels are still parsed (and refused as a shape).
  write_bytes(p, file_of(R"({"__metadata__":{"k":")" + std::string(100, '[') + R"("}})", ""));
  EXPECT_EQ(safe_metadata(p).at("k"), std::string(100, '['));
  write_bytes(p, file_of(R"({"a":{"dtype":"F32","shape":)" + std::string(14, '[') + std::string(14, ']') +
                             R"(,"data_offsets":[0,0]}})", ""));
  EXPECT_HAS(error_of([&] { safe_load(p); }), "shape[0] must be a non-negative integer, got [[[[");
}

// [4294967295, 4294967295, 0] holds no element, but its running product passes INT64_MAX and
// used to overflow tg::prod once Tensor::from_data saw it (Note [shape products] in ops.cpp).
TEST_F(StateTest, RefusesShapesWhoseDimensionsOverflow) {
  std::string p = path("overflow.safetensors");
  write_bytes(p, file_of(R"({"a":{"dtype":"F32","shape":[4294967295,4294967295,0],"data_offsets":[0,0]}})", ""));
  std::string m = error_of([&] { safe_load(p); });
  EXPECT_HAS(m, p);
  EXPECT_HAS(m, "entry 'a': shape [4294967295,4294967295,0]: its dimensions multiply past the largest element count");
  EXPECT_HAS(error_of([&] { Tensor::from_data(nullptr, DType::Float32, {4294967295, 4294967295, 0}); }),
             "shape [4294967295,4294967295,0]: its dimensions multiply past");
  EXPECT_EQ(tg::prod({4294967295, 0, 4294967295 / 2}), 0);
  EXPECT_EQ(tg::prod({3037000499, 3037000499}), 3037000499ll * 3037000499ll);
  EXPECT_HAS(error_of([&] { tg::prod({3037000500, 3037000500}); }), "multiply past");
}

// Bit rot in the tensor data used to load without a word (Note [checksums] in state.cpp).
TEST_F(StateTest, ChecksumsCatchEveryFlippedBitAndNameTheTensor) {
  std::string p = path("sum.safetensors");
  StateDict sd{{"a", Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3})},
               {"b", Tensor::from_vector(std::vector<int32_t>{7, -7}, {2})},
               {"empty", Tensor::zeros({0})}};
  safe_save(sd, p, {{"step", "3"}});
  Metadata meta = safe_metadata(p);
  EXPECT_EQ(meta.at("step"), "3");
  EXPECT_EQ(meta.at(checksum_key("a")), "b20e96b1");  // zlib.crc32(struct.pack('<3f', 1, 2, 3))
  EXPECT_EQ(meta.at(checksum_key("empty")), "00000000");
  EXPECT_EQ(safe_verify(p), 3u);
  const std::string good = read_bytes(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | static_cast<unsigned char>(good[i]);
  const size_t data_start = 8 + n;
  ASSERT_EQ(good.size(), data_start + 12 + 8);
  std::string bad = path("flipped.safetensors");
  for (size_t at = data_start; at < good.size(); at++) {
    std::string bytes = good;
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (at % 8)));
    write_bytes(bad, bytes);
    const std::string tensor = at < data_start + 12 ? "a" : "b";
    for (auto* reader : {+[](const std::string& f) { safe_load(f); }, +[](const std::string& f) { safe_verify(f); }}) {
      std::string m = error_of([&] { reader(bad); });
      EXPECT_HAS(m, "safetensors file '" + bad + "': tensor '" + tensor + "' is damaged: the CRC-32 of its");
    }
  }
  // Re-saving a loaded file's metadata writes its checksums afresh, byte for byte the same.
  safe_save(safe_load(p), bad, safe_metadata(p));
  EXPECT_EQ(read_bytes(bad), good);
}

// Note [reading parts of tensors]: SafeReader reads byte ranges of a tensor and counts them; a
// whole read is verified, a part returns its CRC-32, and the parts' CRC-32s join into the whole's.
TEST_F(StateTest, ReaderReadsPartsCountsThemAndJoinsTheirChecksums) {
  std::string p = path("parts.safetensors");
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f, 5.f};
  safe_save({{"a", Tensor::from_vector(a, {5})}, {"b", Tensor::from_vector(std::vector<int32_t>{7, -7}, {2})}}, p);
  SafeReader r(p);
  EXPECT_EQ(r.entry("a").shape, (Shape{5}));
  EXPECT_HAS(error_of([&] { r.entry("c"); }), "safetensors file '" + p + "': has no tensor 'c'");
  const uint64_t before = safe_bytes_read();
  float part[3] = {};
  uint32_t middle = r.read("a", 4, 16, part);
  EXPECT_EQ(std::vector<float>(part, part + 3), (std::vector<float>{2.f, 3.f, 4.f}));
  EXPECT_EQ(safe_bytes_read() - before, 12u);
  float first = 0, last = 0;
  uint32_t head = r.read("a", 0, 4, &first), tail = r.read("a", 16, 20, &last);
  EXPECT_EQ(first, 1.f);
  EXPECT_EQ(last, 5.f);
  EXPECT_EQ(crc32_concat(crc32_concat(head, middle, 12), tail, 4), *r.checksum("a"));
  float whole[5] = {};
  EXPECT_EQ(r.read("a", 0, 20, whole), *r.checksum("a"));
  EXPECT_EQ(safe_bytes_read() - before, 40u);
  // a flipped bit: a whole read names the tensor; a part's CRC-32 no longer joins into the recorded one
  std::string bytes = read_bytes(p);
  bytes[bytes.size() - 8 - 9] ^= 0x01;  // in a's element 2 (b's 8 bytes are last)
  std::string bad = path("bad.safetensors");
  write_bytes(bad, bytes);
  SafeReader d(bad);
  EXPECT_HAS(error_of([&] { d.read("a", 0, 20, whole); }), "safetensors file '" + bad + "': tensor 'a' is damaged");
  uint32_t damaged = d.read("a", 4, 16, part);
  EXPECT_NE(crc32_concat(crc32_concat(head, damaged, 12), tail, 4), *d.checksum("a"));
}

TEST_F(StateTest, FilesWithoutChecksumsStillLoadAndBadChecksumsAreRefused) {
  std::string p = path("plain.safetensors");
  const std::string entry = R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  write_bytes(p, file_of("{" + entry + "}", "\x01\x02"));
  EXPECT_EQ(safe_load(p).at("a").to_vector<uint8_t>(), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(safe_verify(p), 0u);
  auto with_sum = [&](const std::string& key, const std::string& value) {
    write_bytes(p, file_of(R"({"__metadata__":{")" + key + R"(":")" + value + R"("},)" + entry + "}", "\x01\x02"));
    return error_of([&] { safe_load(p); });
  };
  EXPECT_HAS(with_sum("tg.crc32.a", "12345"), "value of 'tg.crc32.a' must be 8 lowercase hex digits (a CRC-32), got \"12345\"");
  EXPECT_HAS(with_sum("tg.crc32.a", "-1234567"), "must be 8 lowercase hex digits");
  EXPECT_HAS(with_sum("tg.crc32.a", "0000000g"), "must be 8 lowercase hex digits");
  EXPECT_HAS(with_sum("tg.crc32.a", "0000000A"), "must be 8 lowercase hex digits");
  EXPECT_HAS(with_sum("tg.crc32.zz", "00000000"), "holds a checksum for tensor 'zz', which the file does not hold");
  EXPECT_HAS(with_sum("tg.crc32.a", "00000000"), "the header holds tensor checksums but no \"tg.header_crc32\"");
}

// Note [header checksum]: a flipped bit anywhere in a saved file's length or header (a metadata
// key, a checksum's key, the padding) is refused; before it, flips that renamed a key loaded.
TEST_F(StateTest, EveryFlippedHeaderBitIsRefused) {
  std::string p = path("h.safetensors"), bad = path("h_bad.safetensors");
  safe_save({{"a", Tensor::ones({3})}, {"b", Tensor::zeros({2, 2})}}, p, {{"optimizer", "SGD"}, {"step", "4"}});
  const std::string good = read_bytes(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | static_cast<unsigned char>(good[i]);
  int loaded = 0, flips = 0;
  for (size_t at = 0; at < 8 + n; at++)
    for (int bit = 0; bit < 8; bit++, flips++) {
      std::string bytes = good;
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
      write_bytes(bad, bytes);
      try {
        safe_load(bad);
        loaded++;
        ADD_FAILURE() << "a flip of bit " << bit << " of byte " << at << " loaded";
      } catch (const Error&) {
      }
    }
  EXPECT_EQ(loaded, 0) << "of " << flips << " flips";
  EXPECT_GT(flips, 8 * 100);
}

TEST_F(StateTest, RefusesTruncatedSavedFiles) {
  std::string p = path("good.safetensors");
  safe_save({{"w", Tensor::ones({4, 4})}, {"b", Tensor::zeros({4})}}, p);
  std::string good = read_bytes(p);
  std::string t = path("cut.safetensors");
  write_bytes(t, good.substr(0, good.size() - 3));  // data cut short
  EXPECT_HAS(error_of([&] { safe_load(t); }), "reach beyond the data section");
  write_bytes(t, good.substr(0, 20));  // header cut short
  EXPECT_HAS(error_of([&] { safe_load(t); }), "is larger than the file");
  write_bytes(t, good.substr(0, 7));
  EXPECT_HAS(error_of([&] { safe_load(t); }), "shorter than the 8-byte header length");
}

TEST_F(StateTest, SaveReplacesAnExistingFileAtomically) {
  std::string p = path("model.safetensors");
  safe_save({{"w", Tensor::full({3}, 1.0)}}, p);
  std::string first = read_bytes(p);
  struct stat before {};
  ASSERT_EQ(::stat(p.c_str(), &before), 0);
  std::ifstream reader(p, std::ios::binary);  // a reader holding the old file open

  safe_save({{"w", Tensor::full({3}, 2.0)}, {"v", Tensor::full({2}, 5.0)}}, p);
  struct stat after {};
  ASSERT_EQ(::stat(p.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino) << "the new file was renamed into place, not written over the old one";
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(safe_load(p)["w"].to_vector<float>(), (std::vector<float>{2.f, 2.f, 2.f}));
  std::string old_seen(std::istreambuf_iterator<char>(reader), {});
  EXPECT_EQ(old_seen, first) << "the open reader still sees the complete old file";

  // Saves that fail leave the good file as it was and no temporary behind.
  std::string good = read_bytes(p);
  EXPECT_HAS(error_of([&] { safe_save({{"__metadata__", Tensor::ones({1})}}, p); }), "'__metadata__' is reserved");
  EXPECT_HAS(error_of([&] { safe_save({{"bad\xFF", Tensor::ones({1})}}, p); }), "not valid UTF-8");
  fs::create_directory(p + ".tmp");  // the temporary cannot be created
  EXPECT_HAS(error_of([&] { safe_save({{"w", Tensor::ones({1})}}, p); }), "cannot create '" + p + ".tmp'");
  fs::remove(p + ".tmp");
  EXPECT_EQ(read_bytes(p), good);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(StateTest, EmptyStateDictAndHeaderOnlyReaders) {
  std::string p = path("empty.safetensors");
  safe_save({}, p, {{"only", "metadata"}});
  EXPECT_TRUE(safe_load(p).empty());
  EXPECT_EQ(safe_metadata(p).at("only"), "metadata");
  safe_save({{"x", Tensor::zeros({2, 5}, {.dtype = DType::Float16})}}, p);
  auto h = safe_header(p);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h["x"].dtype, DType::Float16);
  EXPECT_EQ(h["x"].shape, (Shape{2, 5}));
  EXPECT_EQ(h["x"].begin, 0u);
  EXPECT_EQ(h["x"].end, 20u);
  EXPECT_STREQ(safetensors_dtype(DType::BFloat16), "BF16");
  EXPECT_EQ(dtype_from_safetensors("BOOL"), DType::Bool);
}

// Note [python interop]: where python3 has the safetensors library and PyTorch (the GPU machine
// does; Debian 12 packages neither safetensors module), files go both ways: Python loads what
// safe_save wrote and checks every dtype and value, then writes its own file, which safe_load
// must read back with the same values and metadata.
TEST_F(StateTest, FilesGoBothWaysWithThePythonLibrary) {
  if (std::system("python3 -c 'import safetensors.torch, torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with the safetensors library and torch not found; interop not checked here";
  StateDict sd;
  sd.emplace("f32", Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f}, {2, 3}));
  sd.emplace("f16", Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 65504.0f}, {3}, {.dtype = DType::Float16}));
  sd.emplace("bf16", Tensor::from_vector(std::vector<float>{1.0f, -3.5f, 256.0f}, {3}, {.dtype = DType::BFloat16}));
  sd.emplace("i64", Tensor::from_vector(std::vector<int64_t>{1, -2, int64_t{1} << 40}, {3}));
  sd.emplace("u8", Tensor::from_vector(std::vector<uint8_t>{0, 7, 255}, {1, 3}));
  safe_save(sd, path("ours.safetensors"), {{"writer", "tinygrad++"}});
  write_bytes(path("check.py"), R"(import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
want = {"f32": torch.tensor([[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0]], dtype=torch.float32),
        "f16": torch.tensor([0.5, -1.0, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -3.5, 256.0], dtype=torch.bfloat16),
        "i64": torch.tensor([1, -2, 1 << 40], dtype=torch.int64),
        "u8": torch.tensor([[0, 7, 255]], dtype=torch.uint8)}
assert sorted(t) == sorted(want), sorted(t)
for k, v in want.items():
    assert t[k].dtype == v.dtype and t[k].shape == v.shape and torch.equal(t[k], v), (k, t[k])
with safe_open(sys.argv[1], "pt") as f:
    assert f.metadata() == {"writer": "tinygrad++"}, f.metadata()
save_file({"py_" + k: v.flip(-1).contiguous() for k, v in want.items()}, sys.argv[2], metadata={"writer": "python"})
print("python: ok")
)");
  std::string cmd = "python3 " + path("check.py") + " " + path("ours.safetensors") + " " + path("theirs.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  StateDict back = safe_load(path("theirs.safetensors"));
  ASSERT_EQ(back.size(), 5u);
  EXPECT_EQ(back.at("py_f32").shape(), (Shape{2, 3}));
  EXPECT_EQ(back.at("py_f32").to_vector<float>(), (std::vector<float>{3.25f, -2.0f, 1.5f, -7.0f, 1e-3f, 0.0f}));
  EXPECT_EQ(back.at("py_f16").dtype(), DType::Float16);
  EXPECT_EQ(back.at("py_f16").to_vector<float>(), (std::vector<float>{65504.0f, -1.0f, 0.5f}));
  EXPECT_EQ(back.at("py_bf16").dtype(), DType::BFloat16);
  EXPECT_EQ(back.at("py_bf16").to_vector<float>(), (std::vector<float>{256.0f, -3.5f, 1.0f}));
  EXPECT_EQ(back.at("py_i64").to_vector<int64_t>(), (std::vector<int64_t>{int64_t{1} << 40, -2, 1}));
  EXPECT_EQ(back.at("py_u8").to_vector<uint8_t>(), (std::vector<uint8_t>{255, 7, 0}));
  EXPECT_EQ(safe_metadata(path("theirs.safetensors")), (Metadata{{"writer", "python"}}));
}
