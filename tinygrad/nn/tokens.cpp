// llm.c token shards through mmap, shard writing, the byte-level tokenizer, text files through
// zlib, and TokenWindows (see tokens.h).
#include "tinygrad/nn/tokens.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tinygrad/error.h"

namespace tg::nn {

namespace fs = std::filesystem;

namespace {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this reader maps them as they are");

// A file descriptor that closes itself.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int32_t le_int32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}

}  // namespace

// ---- shards ----

TokenShard::TokenShard(const std::string& path) : path_(path) {
  std::error_code ec;
  TG_CHECK(fs::exists(path, ec), "tokens: '", path, "': no such file");
  TG_CHECK(fs::is_regular_file(path, ec), "tokens: '", path, "': not a regular file");
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TG_CHECK(f.fd >= 0, "tokens: '", path, "': cannot open: ", std::strerror(errno));
  struct stat st {};
  TG_CHECK(::fstat(f.fd, &st) == 0, "tokens: '", path, "': cannot stat: ", std::strerror(errno));
  const int64_t bytes = st.st_size;
  TG_CHECK(bytes >= TOKEN_SHARD_HEADER_BYTES, "tokens: '", path, "': ", bytes, " bytes, shorter than the ",
           TOKEN_SHARD_HEADER_BYTES, "-byte header of an llm.c token shard (truncated, or not a shard)");
  map_bytes_ = static_cast<size_t>(bytes);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, f.fd, 0);
  TG_CHECK(map_ != MAP_FAILED, "tokens: '", path, "': cannot map ", bytes, " bytes: ", std::strerror(errno));
  try {
    // Note [llm.c token shards] in tokens.h
    const auto* head = static_cast<const unsigned char*>(map_);
    const int32_t magic = le_int32(head), version = le_int32(head + 4), count = le_int32(head + 8);
    TG_CHECK(magic == TOKEN_SHARD_MAGIC, "tokens: '", path, "': bad magic ", magic,
             " (an llm.c token shard starts with ", TOKEN_SHARD_MAGIC, "); not a token shard");
    TG_CHECK(version == TOKEN_SHARD_VERSION, "tokens: '", path, "': version ", version,
             " is not supported (only version ", TOKEN_SHARD_VERSION, ", uint16 tokens",
             version == 2 ? "; version 2 is llm.c's uint32 LLaMA-3 format" : "", ")");
    TG_CHECK(count >= 0, "tokens: '", path, "': the header's token count is negative (", count, ")");
    const int64_t data_bytes = bytes - TOKEN_SHARD_HEADER_BYTES, want = int64_t{count} * 2;
    TG_CHECK(data_bytes >= want, "tokens: '", path, "': truncated: the header says ", count, " tokens (",
             want, " bytes after the header), the file has ", data_bytes, " bytes of tokens");
    TG_CHECK(data_bytes == want, "tokens: '", path, "': the header says ", count, " tokens (", want,
             " bytes after the header), but the file has ", data_bytes, " bytes of tokens (",
             data_bytes - want, " trailing bytes)");
    count_ = count;
    tokens_ = reinterpret_cast<const uint16_t*>(head + TOKEN_SHARD_HEADER_BYTES);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
}

void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t n) {
  TG_CHECK(n >= 0 && n <= INT32_MAX, "write_token_shard: '", path, "': ", n,
           " tokens do not fit one shard (its header counts at most 2^31 - 1)");
  int32_t header[TOKEN_SHARD_HEADER_INTS] = {TOKEN_SHARD_MAGIC, TOKEN_SHARD_VERSION, static_cast<int32_t>(n)};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TG_CHECK(out, "write_token_shard: cannot create '", tmp, "': ", std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(tokens), static_cast<std::streamsize>(n * 2));
    out.close();
    TG_CHECK(out, "write_token_shard: cannot write '", tmp, "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TG_CHECK(!ec, "write_token_shard: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::vector<std::string> write_token_shards(const std::string& path, const std::vector<uint16_t>& tokens,
                                            int64_t shard_tokens) {
  TG_CHECK(shard_tokens > 0 && shard_tokens <= INT32_MAX, "write_token_shards: shard size ", shard_tokens,
           " is outside [1, 2^31 - 1]");
  const auto n = static_cast<int64_t>(tokens.size());
  if (n <= shard_tokens) {
    write_token_shard(path, tokens.data(), n);
    return {path};
  }
  fs::path p(path);
  std::vector<std::string> out;
  for (int64_t begin = 0, k = 0; begin < n; begin += shard_tokens, k++) {
    char num[32];
    std::snprintf(num, sizeof num, "_%06lld", static_cast<long long>(k));
    std::string name = (p.parent_path() / (p.stem().string() + num + p.extension().string())).string();
    write_token_shard(name, tokens.data() + begin, std::min(shard_tokens, n - begin));
    out.push_back(name);
  }
  return out;
}

std::vector<std::string> glob_files(const std::string& pattern, const std::string& what) {
  TG_CHECK(!pattern.empty(), what, ": no file pattern given");
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  TG_CHECK(rc == 0 || rc == GLOB_NOMATCH, what, ": cannot expand '", pattern, "' (glob error ", rc, ")");
  TG_CHECK(!out.empty(), what, ": '", pattern, "' matches no file");
  std::sort(out.begin(), out.end());
  return out;
}

// ---- text ----

std::vector<uint16_t> byte_tokens(const std::string& text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); i++) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_text(const uint16_t* tokens, int64_t n) {
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; i++) {
    TG_CHECK(tokens[i] < BYTE_VOCAB_SIZE, "byte_text: token ", tokens[i], " at ", i,
             " is no byte (vocabulary 256)");
    out[static_cast<size_t>(i)] = static_cast<char>(tokens[i]);
  }
  return out;
}

size_t first_invalid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return i;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; k++) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  TG_CHECK(fs::exists(path, ec), "text: '", path, "': no such file");
  TG_CHECK(fs::is_regular_file(path, ec), "text: '", path, "': not a regular file");
  gzFile g = gzopen(path.c_str(), "rb");  // reads plain files as they are (zlib's transparent mode)
  TG_CHECK(g, "text: '", path, "': cannot open: ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  int got = 0, errnum = Z_OK;
  while ((got = gzread(g, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
  const char* msg = gzerror(g, &errnum);
  std::string why = got < 0 || errnum != Z_OK ? (errnum == Z_ERRNO ? std::strerror(errno) : msg) : "";
  gzclose(g);
  TG_CHECK(why.empty(), "text: '", path, "': cannot read: ", why, " (a corrupt or cut-off gzip stream?)");
  size_t bad = first_invalid_utf8(out);
  TG_CHECK(bad == std::string::npos, "text: '", path, "': not UTF-8 text (an invalid byte at offset ", bad,
           ")");
  return out;
}

// ---- windows ----

TokenWindows::TokenWindows(std::vector<TokenSpan> spans, int64_t seq_len, std::shared_ptr<const void> owner)
    : spans_(std::move(spans)), seq_len_(seq_len), owner_(std::move(owner)) {
  TG_CHECK(seq_len_ >= 1, "token windows: seq_len must be at least 1, got ", seq_len_);
  starts_.push_back(0);
  for (const auto& s : spans_) {
    TG_CHECK(s.size >= seq_len_ + 1, s.name, ": ", s.size, " tokens, fewer than the ", seq_len_ + 1,
             " that one window of data.seq_len=", seq_len_, " needs (T+1)");
    starts_.push_back(starts_.back() + (s.size - 1) / seq_len_);
  }
}

int64_t TokenWindows::tokens() const {
  int64_t n = 0;
  for (const auto& s : spans_) n += s.size;
  return n;
}

std::pair<size_t, int64_t> TokenWindows::window(int64_t i) const {
  TG_CHECK(i >= 0 && i < size(), "token windows: window ", i, " is outside [0, ", size(), ")");
  auto k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin() - 1);
  return {k, (i - starts_[k]) * seq_len_};
}

void TokenWindows::gather(const int64_t* ids, int64_t n, void* x, void* y) const {
  auto* xi = static_cast<int32_t*>(x);
  auto* yi = static_cast<int32_t*>(y);
  for (int64_t r = 0; r < n; r++) {
    auto [k, start] = window(ids[r]);
    const uint16_t* src = spans_[k].tokens + start;
    int32_t* xr = xi + r * seq_len_;
    int32_t* yr = yi + r * seq_len_;
    for (int64_t t = 0; t < seq_len_; t++) {
      xr[t] = src[t];
      yr[t] = src[t + 1];
    }
  }
}

std::shared_ptr<TokenWindows> shard_windows(const std::vector<std::string>& files, int64_t seq_len) {
  TG_CHECK(!files.empty(), "tokens: no shard files");
  auto shards = std::make_shared<std::vector<std::unique_ptr<TokenShard>>>();
  std::vector<TokenSpan> spans;
  for (const auto& f : files) {
    shards->push_back(std::make_unique<TokenShard>(f));
    spans.push_back({shards->back()->tokens(), shards->back()->size(), "tokens: '" + f + "'"});
  }
  return std::make_shared<TokenWindows>(std::move(spans), seq_len, std::move(shards));
}

TextSplits text_windows(const std::string& path, int64_t seq_len, double val_fraction) {
  TG_CHECK(std::isfinite(val_fraction) && val_fraction > 0 && val_fraction < 1,
           "text: the validation fraction must be in (0, 1), got ", val_fraction);
  auto tokens = std::make_shared<const std::vector<uint16_t>>(byte_tokens(read_text_file(path)));
  const auto n = static_cast<int64_t>(tokens->size());
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  const int64_t n_train = n - n_val;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%g%%", val_fraction * 100);
  TokenSpan train{tokens->data(), n_train,
                  "text: the training split of '" + path + "' (the first " + std::to_string(n_train) +
                      " of its " + std::to_string(n) + " bytes)"};
  TokenSpan val{tokens->data() + n_train, n_val,
                "text: the validation split of '" + path + "' (its last " + pct + ", " +
                    std::to_string(n_val) + " bytes)"};
  TextSplits out;
  out.train = std::make_shared<TokenWindows>(std::vector<TokenSpan>{train}, seq_len, tokens);
  out.val = std::make_shared<TokenWindows>(std::vector<TokenSpan>{val}, seq_len, tokens);
  return out;
}

}  // namespace tg::nn
