// Token data for language models: llm.c's binary token shards (read through a read-only memory
// map, written by `tg tokenize`), the byte-level tokenizer, UTF-8 text files (plain or gzipped),
// and TokenWindows, the examples a DataLoader batches for next-token prediction: windows of
// T+1 consecutive tokens, x the first T and y the last T.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tinygrad/nn/data.h"

namespace tg::nn {

// ---- llm.c token shards ----

// Note [llm.c token shards]: a shard is a header of 256 little-endian int32 values, then the
// tokens as little-endian uint16. header[0] is the magic 20240520, header[1] the version (1:
// uint16 GPT-2 tokens; llm.c's version 2, uint32 LLaMA-3 tokens, is not read here), header[2]
// the token count; the rest is zero. The file is exactly 1024 + 2 * count bytes.
constexpr int32_t TOKEN_SHARD_MAGIC = 20240520;
constexpr int32_t TOKEN_SHARD_VERSION = 1;
constexpr int64_t TOKEN_SHARD_HEADER_INTS = 256;
constexpr int64_t TOKEN_SHARD_HEADER_BYTES = TOKEN_SHARD_HEADER_INTS * 4;
// llm.c's shard size (its fineweb.py writes 10^8 tokens a shard); the header's count is an
// int32, so no shard holds more than 2^31 - 1 tokens.
constexpr int64_t TOKEN_SHARD_DEFAULT_TOKENS = 100'000'000;

// One shard, mapped read-only. The constructor checks the header against the file's size and
// throws tg::Error naming the file and what is wrong (missing, too short for the header, wrong
// magic, unsupported version, negative count, truncated or trailing data). The tokens are read
// from the page cache as windows are gathered, so a shard must not be rewritten or truncated
// while it is mapped (reading a page cut off the file ends the process with SIGBUS).
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const uint16_t* tokens() const { return tokens_; }
  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// Writes one shard (atomically: a temporary file renamed into place). Throws for more than
// 2^31 - 1 tokens.
void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t n);
// Writes the tokens as shards of at most `shard_tokens` each: one file `path` when they fit,
// else path's stem + "_000000" + extension, "_000001", ... Returns the paths written.
std::vector<std::string> write_token_shards(const std::string& path, const std::vector<uint16_t>& tokens,
                                            int64_t shard_tokens = TOKEN_SHARD_DEFAULT_TOKENS);

// The files a glob pattern matches, sorted by name. An error when it matches none (naming the
// pattern and `what` it was for).
std::vector<std::string> glob_files(const std::string& pattern, const std::string& what);

// ---- text ----

// The text of the `text` dataset by default: the Jargon File 4.4.7 (public domain; 1.7 MB of
// English), as the Debian package jargon-text installs it.
constexpr const char* DEFAULT_TEXT_FILE = "/usr/share/doc/jargon-text/jargon.txt.gz";

// The vocabulary of the byte-level tokenizer: token t is the byte t.
constexpr int64_t BYTE_VOCAB_SIZE = 256;
std::vector<uint16_t> byte_tokens(const std::string& text);
std::string byte_text(const uint16_t* tokens, int64_t n);  // the inverse (tokens must be < 256)

// Reads a UTF-8 text file, plain or gzipped (detected from its content). Throws naming the file
// when it is missing, unreadable, or not UTF-8 (with the offset of the first bad byte).
std::string read_text_file(const std::string& path);
// The offset of the first byte of `s` that is not part of well-formed UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF included), or std::string::npos.
size_t first_invalid_utf8(const std::string& s);

// ---- windows ----

// A run of tokens that windows never cross (a shard, or a split of a text).
struct TokenSpan {
  const uint16_t* tokens = nullptr;
  int64_t size = 0;
  std::string name;  // for errors: "tokens: 'FILE'", "text: the validation split of 'FILE' ..."
};

// Examples for next-token prediction: windows of T+1 tokens starting at 0, T, 2T, ... of each
// span (those that fit: (size - 1) / T of them; a window never crosses into the next span).
// Example i: x = tokens[s, s+T), y = tokens[s+1, s+T+1) as int32 [T]. `owner` keeps the
// spans' memory alive (the shard maps, the text's tokens).
class TokenWindows : public Examples {
 public:
  // Throws when seq_len < 1 or a span holds fewer than seq_len + 1 tokens (naming it).
  TokenWindows(std::vector<TokenSpan> spans, int64_t seq_len, std::shared_ptr<const void> owner);
  int64_t size() const override { return starts_.empty() ? 0 : starts_.back(); }
  DType x_dtype() const override { return DType::Int32; }
  Shape x_shape() const override { return {seq_len_}; }
  DType y_dtype() const override { return DType::Int32; }
  Shape y_shape() const override { return {seq_len_}; }
  void gather(const int64_t* ids, int64_t n, void* x, void* y) const override;

  int64_t seq_len() const { return seq_len_; }
  int64_t tokens() const;  // in all spans
  const std::vector<TokenSpan>& spans() const { return spans_; }
  // Window i as (span index, first token's offset in the span).
  std::pair<size_t, int64_t> window(int64_t i) const;

 private:
  std::vector<TokenSpan> spans_;
  std::vector<int64_t> starts_;  // starts_[k]: windows in spans 0..k-1; one more entry than spans
  int64_t seq_len_ = 0;
  std::shared_ptr<const void> owner_;
};

// The windows of llm.c shards (the `tokens` dataset's split): every file mapped and checked.
std::shared_ptr<TokenWindows> shard_windows(const std::vector<std::string>& files, int64_t seq_len);

// A text file's bytes as tokens, split by position: train the first (1 - val_fraction) of the
// tokens, val the rest (the `text` dataset). Each split must hold at least seq_len + 1 tokens.
struct TextSplits {
  std::shared_ptr<TokenWindows> train, val;
};
TextSplits text_windows(const std::string& path, int64_t seq_len, double val_fraction);

}  // namespace tg::nn
