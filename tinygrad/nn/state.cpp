// safetensors reader and writer. Layout of a file:
//   u64 little-endian N | N bytes of JSON header (space padded) | data section
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section) and may hold "__metadata__": {string: string}, where safe_save
// also records a CRC-32 per tensor that loading verifies (Note [checksums]).
#include "tinygrad/nn/state.h"

#include <fcntl.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/ops.h"

namespace tg::nn {

// Note (byte order): safetensors data is little-endian and tinygrad++ buffers hold host-order
// elements, so tensor bytes are copied as they are. A big-endian port would byte-swap here.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

constexpr uint64_t MAX_HEADER_BYTES = 100ull * 1000 * 1000;  // as the Rust safetensors crate
// Note [header nesting]: nlohmann's dump() and comparisons (and, in some releases, its
// destructor) recurse once per level of nesting, so a header value nested some 70,000 deep (a
// 140 KB file) overflowed the stack once parsed and dumped into an error message. A valid header
// nests 3 deep (header -> entry -> shape), so the text is scanned for its bracket depth before
// json::parse sees it, and anything past MAX_HEADER_DEPTH is refused unparsed. The scan lexes
// strings as JSON does, so wherever the parser gets, the scan has counted the same depth.
constexpr int MAX_HEADER_DEPTH = 16;
// At most this many characters of a header value are quoted in an error message.
constexpr size_t MAX_QUOTED_CHARS = 120;
constexpr const char* CHECKSUM_PREFIX = "tg.crc32.";  // Note [checksums]
constexpr const char* HEADER_CHECKSUM_KEY = "tg.header_crc32";  // Note [header checksum]

struct DTypeCode {
  const char* code;
  DType dtype;
};
constexpr DTypeCode DTYPE_CODES[] = {
    {"BOOL", DType::Bool},     {"U8", DType::UInt8},     {"I32", DType::Int32},   {"I64", DType::Int64},
    {"F16", DType::Float16},   {"BF16", DType::BFloat16}, {"F32", DType::Float32}, {"F64", DType::Float64},
};
// Codes the format defines that have no tinygrad++ dtype; they get a more precise message.
constexpr const char* OTHER_CODES[] = {"I8",      "I16",     "U16",     "U32",    "U64", "F8_E4M3",
                                       "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

std::string supported_codes() {
  std::string s;
  for (auto& c : DTYPE_CODES) s += (s.empty() ? "" : ", ") + std::string(c.code);
  return s;
}

std::string where(const std::string& path) { return "safetensors file '" + path + "': "; }

// A header value as JSON text for an error message, cut short when long.
std::string quoted(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > MAX_QUOTED_CHARS) s = s.substr(0, MAX_QUOTED_CHARS) + "...";
  return s;
}

// Refuses header text whose arrays and objects nest deeper than MAX_HEADER_DEPTH (Note [header
// nesting]); brackets inside strings do not count.
void check_nesting(const std::string& path, const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); i++) {
    char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      TG_CHECK(++depth <= MAX_HEADER_DEPTH, where(path), "header nests arrays and objects more than ",
               MAX_HEADER_DEPTH, " deep (at byte ", 8 + i, "); a safetensors header nests 3 deep");
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
}

struct Header {
  std::map<std::string, SafeTensorInfo> entries;
  Metadata metadata;
  std::map<std::string, uint32_t> checksums;  // tensor name -> CRC-32 of its bytes (Note [checksums])
  uint64_t data_start = 0;  // file offset of the data section
  uint64_t data_size = 0;
};

// Note [checksums]: every file safe_save writes carries the CRC-32 (zlib's) of each tensor's
// bytes in "__metadata__", as "tg.crc32.<tensor name>": "<8 lowercase hex digits>". Metadata
// values are strings, so the Python library still reads these files. Loading verifies every
// checksum present; files without them (older ones, other writers) load as before. A checksum
// names a tensor of the file and is well formed, or the header is refused.
uint32_t crc32_of(const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), static_cast<const Bytef*>(data), n));
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Note [header checksum]: the tensors' checksums do not cover the header itself, and a flipped
// bit there can rename a metadata key (or a checksum's key, leaving its tensor unchecked). So a
// file safe_save writes also carries "tg.header_crc32": the CRC-32 of the whole header text as
// written, with that value's own 8 digits as "00000000". Loading finds the value's text, puts
// the zeros back and compares. Files with tensor checksums always have it, so a file that has
// the one without the other, or a tensor without a checksum among checksummed ones, was damaged.
void verify_header_checksum(const std::string& path, const std::string& text, const Header& h) {
  auto it = h.metadata.find(HEADER_CHECKSUM_KEY);
  if (it == h.metadata.end()) {
    TG_CHECK(h.checksums.empty(), where(path), "the header holds tensor checksums but no \"", HEADER_CHECKSUM_KEY,
             "\" (the header is damaged)");
    return;
  }
  const std::string field = std::string("\"") + HEADER_CHECKSUM_KEY + "\":\"" + it->second + "\"";
  size_t at = text.find(field);
  TG_CHECK(it->second.size() == 8 && at != std::string::npos && text.find(field, at + 1) == std::string::npos,
           where(path), "\"", HEADER_CHECKSUM_KEY, "\" is not one 8-digit value in the header (the header is damaged)");
  uint32_t recorded = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + 8, recorded, 16);
  TG_CHECK(ec == std::errc() && end == it->second.data() + 8 && it->second == hex8(recorded), where(path), "\"",
           HEADER_CHECKSUM_KEY, "\" must be 8 lowercase hex digits, got \"", it->second, "\"");
  std::string zeroed = text;
  zeroed.replace(at + field.size() - 9, 8, "00000000");
  uint32_t actual = crc32_of(zeroed.data(), zeroed.size());
  TG_CHECK(actual == recorded, where(path), "the header is damaged: its CRC-32 is ", hex8(actual), ", the file recorded ",
           hex8(recorded), " when it was written");
  for (auto& [name, info] : h.entries)
    TG_CHECK(h.checksums.count(name), where(path), "tensor '", name, "' has no checksum while the file's others do ",
             "(the header is damaged)");
}

// The checksums of the metadata (Note [checksums]), checked against the header's entries.
std::map<std::string, uint32_t> parse_checksums(const std::string& path, const Header& h) {
  std::map<std::string, uint32_t> out;
  const std::string prefix = CHECKSUM_PREFIX;
  for (auto it = h.metadata.lower_bound(prefix); it != h.metadata.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    const std::string name = it->first.substr(prefix.size());
    const std::string& v = it->second;
    uint32_t crc = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), crc, 16);
    TG_CHECK(v.size() == 8 && ec == std::errc() && end == v.data() + v.size() && v == hex8(crc), where(path),
             "\"__metadata__\" value of '", it->first, "' must be 8 lowercase hex digits (a CRC-32), got \"",
             v.substr(0, MAX_QUOTED_CHARS), "\"");
    TG_CHECK(h.entries.count(name), where(path), "\"__metadata__\" holds a checksum for tensor '", name,
             "', which the file does not hold");
    out[name] = crc;
  }
  return out;
}

// a * b, or nullopt on overflow.
std::optional<uint64_t> mul_checked(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

SafeTensorInfo parse_entry(const std::string& path, const std::string& name, const json& e) {
  const std::string at = where(path) + "entry '" + name + "': ";
  TG_CHECK(e.is_object(), at, "must be an object with dtype, shape and data_offsets, got ", e.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    TG_CHECK(e.contains(key), at, "missing \"", key, "\"");
  SafeTensorInfo info;
  const json& dt = e["dtype"];
  TG_CHECK(dt.is_string(), at, "\"dtype\" must be a string, got ", quoted(dt));
  try {
    info.dtype = dtype_from_safetensors(dt.get<std::string>());
  } catch (const Error& err) {
    throw Error(at + err.what());
  }
  const json& sh = e["shape"];
  TG_CHECK(sh.is_array(), at, "\"shape\" must be an array of integers, got ", quoted(sh));
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < sh.size(); i++) {
    TG_CHECK(sh[i].is_number_unsigned(), at, "shape[", i, "] must be a non-negative integer, got ", quoted(sh[i]));
    uint64_t d = sh[i].get<uint64_t>();
    TG_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), at, "shape[", i, "]=", d, " is too large");
    info.shape.push_back(static_cast<int64_t>(d));
    auto n = mul_checked(numel, d);
    if (!n) overflow = true;
    else numel = *n;
  }
  try {
    tg::prod(info.shape);  // Note [shape products] in tinygrad/ops.cpp
  } catch (const Error& err) {
    throw Error(at + err.what());
  }
  const json& off = e["data_offsets"];
  TG_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), at,
           "\"data_offsets\" must be [begin, end] with non-negative integers, got ", quoted(off));
  info.begin = off[0].get<uint64_t>();
  info.end = off[1].get<uint64_t>();
  TG_CHECK(info.begin <= info.end, at, "data_offsets begin ", info.begin, " > end ", info.end);
  auto nbytes = overflow ? std::nullopt : mul_checked(numel, itemsize(info.dtype));
  TG_CHECK(nbytes && *nbytes == info.end - info.begin, at, "byte size ", info.end - info.begin,
           " (data_offsets [", info.begin, ", ", info.end, "]) does not match shape ", shape_str(info.shape), " of ",
           dt.get<std::string>(), " (", nbytes ? std::to_string(*nbytes) : std::string("overflowing"), " bytes)");
  return info;
}

// Reads and validates the header of `f` (opened on `path`).
Header read_header(const std::string& path, std::ifstream& f) {
  std::error_code ec;
  TG_CHECK(std::filesystem::exists(path, ec), where(path), "no such file");
  TG_CHECK(std::filesystem::is_regular_file(path, ec), where(path), "not a regular file");
  uint64_t file_size = std::filesystem::file_size(path, ec);
  TG_CHECK(!ec, where(path), "cannot read its size: ", ec.message());
  f.open(path, std::ios::binary);
  TG_CHECK(f.is_open(), where(path), "cannot open: ", std::strerror(errno));
  TG_CHECK(file_size >= 8, where(path), "file is ", file_size,
           " bytes, shorter than the 8-byte header length (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  TG_CHECK(f, where(path), "cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len_bytes[i];
  TG_CHECK(n <= MAX_HEADER_BYTES, where(path), "header length ", n, " is absurd (more than ", MAX_HEADER_BYTES,
           " bytes); not a safetensors file?");
  TG_CHECK(n <= file_size - 8, where(path), "header length ", n, " is larger than the file (", file_size,
           " bytes, ", file_size - 8, " after the length); the file is truncated or not a safetensors file");
  std::string text(n, '\0');
  f.read(text.data(), static_cast<std::streamsize>(n));
  TG_CHECK(f, where(path), "cannot read the ", n, "-byte header");

  // Duplicate names would silently shadow each other in nlohmann's object; refuse them.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  check_nesting(path, text);
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& e) {
    throw Error(where(path) + "header is not valid JSON: " + e.what());
  }
  TG_CHECK(h.is_object(), where(path), "header must be a JSON object, got ", h.type_name());
  TG_CHECK(duplicate.empty(), where(path), "header names '", duplicate, "' twice");

  Header out;
  out.data_start = 8 + n;
  out.data_size = file_size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      TG_CHECK(it->is_object(), where(path), "\"__metadata__\" must be an object of strings, got ", it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m) {
        TG_CHECK(m->is_string(), where(path), "\"__metadata__\" value of '", m.key(), "' must be a string, got ",
                 quoted(*m));
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    out.entries[it.key()] = parse_entry(path, it.key(), *it);
  }

  // The ranges must tile the data section exactly: no overlap, no hole, nothing past the end.
  std::vector<std::pair<const std::string*, const SafeTensorInfo*>> order;
  for (auto& [name, info] : out.entries) {
    TG_CHECK(info.end <= out.data_size, where(path), "entry '", name, "': data_offsets [", info.begin, ", ",
             info.end, "] reach beyond the data section (", out.data_size, " bytes)");
    order.push_back({&name, &info});
  }
  std::sort(order.begin(), order.end(), [](auto& a, auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (auto& [name, info] : order) {
    TG_CHECK(info->begin >= pos, where(path), "entry '", *name, "' data_offsets [", info->begin, ", ", info->end,
             "] overlap entry '", (prev ? *prev : std::string()), "' (which ends at ", pos, ")");
    TG_CHECK(info->begin == pos, where(path), "hole in the data section: bytes [", pos, ", ", info->begin,
             ") belong to no tensor (before entry '", *name, "')");
    pos = info->end;
    prev = name;
  }
  TG_CHECK(pos == out.data_size, where(path), "hole in the data section: bytes [", pos, ", ", out.data_size,
           ") at the end belong to no tensor");
  out.checksums = parse_checksums(path, out);
  verify_header_checksum(path, text, out);
  return out;
}

std::atomic<uint64_t> bytes_read{0};  // safe_bytes_read()

std::string damaged(const std::string& path, const std::string& name, size_t n, uint32_t actual, uint32_t recorded) {
  return where(path) + "tensor '" + name + "' is damaged: the CRC-32 of its " + std::to_string(n) + " bytes is " +
         hex8(actual) + ", the file recorded " + hex8(recorded) + " when it was written";
}

// Reads the data of every entry in file order (so the disk sees one forward pass), verifies its
// checksum where the file has one, and hands it to `use(name, info, bytes)`.
template <class F>
void read_entries(const std::string& path, std::ifstream& f, const Header& h, F use) {
  std::vector<const std::pair<const std::string, SafeTensorInfo>*> order;
  for (auto& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->second.begin < b->second.begin; });
  std::vector<char> bytes;
  for (auto* e : order) {
    const SafeTensorInfo& info = e->second;
    bytes.resize(info.end - info.begin);
    f.seekg(static_cast<std::streamoff>(h.data_start + info.begin));
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    TG_CHECK(f, where(path), "cannot read the data of entry '", e->first, "' (file changed while reading?)");
    bytes_read += bytes.size();
    if (auto c = h.checksums.find(e->first); c != h.checksums.end()) {
      uint32_t actual = crc32_of(bytes.data(), bytes.size());
      TG_CHECK(actual == c->second, damaged(path, e->first, bytes.size(), actual, c->second));
    }
    use(e->first, info, bytes);
  }
}

// The tensor's elements in row-major order as raw host bytes, exactly (no conversion).
std::vector<uint8_t> host_bytes(const Tensor& t) {
  size_t n = static_cast<size_t>(t.numel()) * itemsize(t.dtype());
  std::vector<uint8_t> out(n);
  if (n == 0) return out;
  if (t.devices().size() > 1) return host_bytes(t.to(t.devices()[0]));  // gathered on its first device
  auto buffer_of = [&](const Tensor& x) -> std::shared_ptr<Buffer> {
    Tensor c = x;
    c.realize();
    const UOpPtr& u = c.uop();
    std::shared_ptr<Buffer> b = u->op == Op::BUFFER ? u->arg_buffer() : u->realized;
    if (b && b->dtype() == t.dtype() && b->numel() == t.numel()) return b;
    return nullptr;
  };
  auto buf = buffer_of(t);
  if (!buf) buf = buffer_of(t.contiguous());
  TG_ASSERT(buf, "safe_save: no contiguous buffer for ", t.describe());
  buf->copy_out(out.data(), n);
  return out;
}

// A file descriptor for path + ".tmp" that is removed again unless commit() renamed it.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TG_CHECK(fd_ >= 0, "safe_save: cannot create '", tmp_, "': ", std::strerror(errno));
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, 1 << 30));
      if (w < 0 && errno == EINTR) continue;
      TG_CHECK(w > 0, "safe_save: cannot write '", tmp_, "': ", std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  // Writes over bytes already written, at `offset` from the start of the file.
  void write_at(uint64_t offset, const void* data, size_t n) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, std::min<size_t>(n, 1 << 30), static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      TG_CHECK(w > 0, "safe_save: cannot write '", tmp_, "': ", std::strerror(errno));
      p += w;
      offset += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
    }
  }
  void commit() {
    TG_CHECK(::fsync(fd_) == 0, "safe_save: cannot flush '", tmp_, "': ", std::strerror(errno));
    int rc = ::close(fd_);
    fd_ = -1;
    TG_CHECK(rc == 0, "safe_save: cannot close '", tmp_, "': ", std::strerror(errno));
    TG_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "safe_save: cannot rename '", tmp_, "' to '", path_,
             "': ", std::strerror(errno));
    committed_ = true;
    // Make the rename itself durable (best effort: some file systems refuse fsync on directories).
    std::string dir = std::filesystem::path(path_).parent_path().string();
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

const char* safetensors_dtype(DType t) {
  for (auto& c : DTYPE_CODES)
    if (c.dtype == t) return c.code;
  TG_ASSERT(false, "no safetensors code for dtype ", dtype_name(t));
  return "";  // unreachable
}

DType dtype_from_safetensors(const std::string& code) {
  for (auto& c : DTYPE_CODES)
    if (code == c.code) return c.dtype;
  for (const char* c : OTHER_CODES)
    TG_CHECK(code != c, "dtype '", code, "' is a safetensors dtype tinygrad++ has no dtype for (supported: ",
             supported_codes(), ")");
  TG_FAIL("unknown dtype '", code, "' (supported: ", supported_codes(), ")");
}

namespace {

// The header text of `tensors` (in name order, contiguous from offset 0) and `metadata`, padded
// with spaces to a multiple of 8 bytes.
std::string header_text(const StateDict& tensors, const Metadata& metadata, const std::string& path) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    TG_CHECK(name != "__metadata__", "safe_save '", path, "': '__metadata__' is reserved and cannot name a tensor");
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * itemsize(t.dtype());
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw Error("safe_save '" + path + "': a tensor name or metadata string is not valid UTF-8 (" + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

// Note [writing checksums]: a tensor's bytes are only on the host while it is written, so the
// header goes out first with a placeholder checksum of the same width for every tensor, and is
// written again over itself once the data is out and every checksum is known.
void safe_save(const StateDict& tensors, const std::string& path, const Metadata& metadata) {
  TG_CHECK(!path.empty(), "safe_save: empty path");
  Metadata meta;
  for (auto& [k, v] : metadata)  // a loaded file's checksums are written afresh
    if (k.rfind(CHECKSUM_PREFIX, 0) != 0 && k != HEADER_CHECKSUM_KEY) meta[k] = v;
  for (auto& [name, t] : tensors) meta[checksum_key(name)] = hex8(0);
  meta[HEADER_CHECKSUM_KEY] = hex8(0);  // Note [header checksum]
  std::string text = header_text(tensors, meta, path);
  Tensors all;
  for (auto& [name, t] : tensors) all.push_back(t);
  // Compute everything before the file exists, in one schedule.
  Tensor::realize_all(all);

  AtomicFile file(path);
  uint64_t n = text.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  file.write(len_bytes, 8);
  file.write(text.data(), text.size());
  for (auto& [name, t] : tensors) {
    auto bytes = host_bytes(t);
    meta[checksum_key(name)] = hex8(crc32_of(bytes.data(), bytes.size()));
    file.write(bytes.data(), bytes.size());
  }
  std::string final_text = header_text(tensors, meta, path);
  meta[HEADER_CHECKSUM_KEY] = hex8(crc32_of(final_text.data(), final_text.size()));
  final_text = header_text(tensors, meta, path);
  TG_ASSERT(final_text.size() == text.size(), "safe_save: the header changed size with its checksums");
  file.write_at(8, final_text.data(), final_text.size());
  file.commit();
}

std::map<std::string, SafeTensorInfo> safe_header(const std::string& path) {
  std::ifstream f;
  return read_header(path, f).entries;
}

Metadata safe_metadata(const std::string& path) {
  std::ifstream f;
  return read_header(path, f).metadata;
}

StateDict safe_load(const std::string& path, const std::string& device) {
  std::ifstream f;
  Header h = read_header(path, f);
  StateDict out;
  read_entries(path, f, h, [&](const std::string& name, const SafeTensorInfo& info, std::vector<char>& bytes) {
    if (info.dtype == DType::Bool)
      for (auto& b : bytes) b = b != 0;  // the engine's bools are 0 or 1
    out.emplace(name, Tensor::from_data(bytes.data(), info.dtype, info.shape, {.device = device}));
  });
  return out;
}

size_t safe_verify(const std::string& path) {
  std::ifstream f;
  Header h = read_header(path, f);
  read_entries(path, f, h, [](const std::string&, const SafeTensorInfo&, std::vector<char>&) {});
  return h.checksums.size();
}

std::string checksum_key(const std::string& tensor) { return CHECKSUM_PREFIX + tensor; }

// Note [reading parts of tensors]: a sharded checkpoint is read by each rank in the parts its
// layout needs (Note [reading what a rank needs] in launcher/checkpoint.cpp), so SafeReader
// reads byte ranges of a tensor. A checksum covers a whole tensor: a whole read is verified
// here, and a part's CRC-32 is returned, which crc32_concat (zlib's crc32_combine) joins with
// the CRC-32 of the tensor's other parts, read elsewhere, into the one the file records.
struct SafeReader::Impl {
  std::string path;
  std::ifstream file;
  Header header;
};

SafeReader::SafeReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->header = read_header(path, impl_->file);
}

SafeReader::~SafeReader() = default;

const std::string& SafeReader::path() const { return impl_->path; }
const std::map<std::string, SafeTensorInfo>& SafeReader::entries() const { return impl_->header.entries; }
const Metadata& SafeReader::metadata() const { return impl_->header.metadata; }

const SafeTensorInfo& SafeReader::entry(const std::string& name) const {
  auto it = impl_->header.entries.find(name);
  TG_CHECK(it != impl_->header.entries.end(), where(impl_->path), "has no tensor '", name, "'");
  return it->second;
}

std::optional<uint32_t> SafeReader::checksum(const std::string& name) const {
  auto it = impl_->header.checksums.find(name);
  if (it == impl_->header.checksums.end()) return std::nullopt;
  return it->second;
}

uint32_t SafeReader::read(const std::string& name, uint64_t begin, uint64_t end, void* out) {
  const SafeTensorInfo& info = entry(name);
  TG_ASSERT(begin <= end && end <= info.end - info.begin, "SafeReader: bytes [", begin, ", ", end, ") of '", name,
            "' (", info.end - info.begin, " bytes)");
  const uint64_t n = end - begin;
  impl_->file.seekg(static_cast<std::streamoff>(impl_->header.data_start + info.begin + begin));
  impl_->file.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  TG_CHECK(impl_->file, where(impl_->path), "cannot read the data of entry '", name, "' (file changed while reading?)");
  bytes_read += n;
  uint32_t crc = crc32_of(out, n);
  auto recorded = checksum(name);
  if (recorded && n == info.end - info.begin) TG_CHECK(crc == *recorded, damaged(impl_->path, name, n, crc, *recorded));
  return crc;
}

uint64_t safe_bytes_read() { return bytes_read.load(); }

uint32_t crc32_concat(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

}  // namespace tg::nn
