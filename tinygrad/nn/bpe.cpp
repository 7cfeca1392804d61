// GPT-2's byte-level BPE (see bpe.h).
//
// Note [byte-level BPE]: GPT-2 first splits the text with one regular expression (contractions,
// runs of letters or of digits with at most one leading space, runs of other symbols, runs of
// whitespace), so no merge crosses a word boundary. Each piece is then a sequence of bytes, each
// byte written as one printable character (bytes_to_unicode: printable Latin-1 bytes stand for
// themselves, the others for code points from 256 up), which is how the vocabulary and merges
// files spell tokens. The merges are ranked by their line in the merges file; encoding repeatedly
// joins the adjacent pair of lowest rank, everywhere it occurs in the piece, until no pair has a
// rank, and looks the remaining symbols up in the vocabulary. Decoding concatenates the tokens'
// characters and maps them back to bytes. Pieces repeat (words), so encoded pieces are cached; an
// encoder is used by one thread at a time.
#include "tinygrad/nn/bpe.h"

#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tinygrad/error.h"
#include "tinygrad/nn/tokens.h"

#ifdef TG_WITH_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace fs = std::filesystem;

namespace tg::nn {

namespace {

// GPT-2's bytes_to_unicode: the code point that stands for each byte.
std::array<uint32_t, 256> byte_code_points() {
  std::array<uint32_t, 256> cp{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; b++) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; b++) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; b++) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; b++) cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
  return cp;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Each byte's character as UTF-8, and the way back.
struct ByteChars {
  std::array<std::string, 256> of_byte;
  std::unordered_map<std::string, uint8_t> byte_of;
  ByteChars() {
    auto cp = byte_code_points();
    for (int b = 0; b < 256; b++) {
      of_byte[b] = utf8(cp[b]);
      byte_of[of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteChars& byte_chars() {
  static const ByteChars c;
  return c;
}

// The UTF-8 characters of s (s is valid UTF-8).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TG_CHECK(in, "GPT-2 BPE: cannot open '", p.string(), "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<std::string, int32_t> read_vocab(const fs::path& p) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(p));
  } catch (const nlohmann::json::exception& e) {
    TG_FAIL("GPT-2 BPE: '", p.string(), "' is not JSON: ", e.what());
  }
  TG_CHECK(j.is_object(), "GPT-2 BPE: '", p.string(), "' must be a JSON object of token -> id");
  std::map<std::string, int32_t> vocab;
  for (auto& [token, id] : j.items()) {
    TG_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, "GPT-2 BPE: '",
             p.string(), "': the id of token '", token, "' is not a non-negative integer");
    vocab[token] = id.get<int32_t>();
  }
  return vocab;
}

std::vector<std::pair<std::string, std::string>> read_merges(const fs::path& p) {
  std::istringstream in(read_file(p));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    TG_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             "GPT-2 BPE: '", p.string(), "' line ", n, " is not a merge of two tokens ('left right'): '", line, "'");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return merges;
}

}  // namespace

Gpt2Bpe Gpt2Bpe::load(const std::string& dir) {
  fs::path d(dir);
  TG_CHECK(fs::is_directory(d), "GPT-2 BPE: '", dir, "' is not a directory (it should hold vocab.json and merges.txt, ",
           "or encoder.json and vocab.bpe)");
  for (auto [vocab, merges] : {std::pair<const char*, const char*>{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}})
    if (fs::is_regular_file(d / vocab) && fs::is_regular_file(d / merges)) {
      auto tokens = read_vocab(d / vocab);
      return Gpt2Bpe(std::move(tokens), read_merges(d / merges), (d / vocab).string());
    }
  TG_FAIL("GPT-2 BPE: '", dir, "' holds neither vocab.json and merges.txt nor encoder.json and vocab.bpe");
}

Gpt2Bpe::Gpt2Bpe(std::map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                 const std::string& source) {
  int32_t max_id = -1;
  for (auto& [t, id] : vocab) max_id = std::max(max_id, id);
  // ids index a table: a few gaps are fine, an id far past the vocabulary's size is an error
  constexpr size_t MAX_GAPS = size_t{1} << 16;
  TG_CHECK(max_id < 0 || static_cast<size_t>(max_id) < vocab.size() + MAX_GAPS, "GPT-2 BPE: ", source,
           " gives token id ", max_id, " among ", vocab.size(), " tokens (ids must be below ", vocab.size() + MAX_GAPS, ")");
  token_of_.assign(static_cast<size_t>(max_id + 1), std::string());
  std::vector<bool> used(token_of_.size(), false);
  for (auto& [t, id] : vocab) {
    TG_CHECK(!used[static_cast<size_t>(id)], "GPT-2 BPE: ", source, " gives id ", id, " to two tokens");
    used[static_cast<size_t>(id)] = true;
    token_of_[static_cast<size_t>(id)] = t;
    id_of_[t] = id;
  }
  for (auto& b : byte_chars().of_byte)
    TG_CHECK(id_of_.count(b), "GPT-2 BPE: ", source, " lacks the token of a byte ('", b,
             "'): a byte-level vocabulary has all 256");
  for (size_t r = 0; r < merges.size(); r++) {
    auto& [a, b] = merges[r];
    TG_CHECK(id_of_.count(a + b), "GPT-2 BPE: merge ", r + 1, " ('", a, " ", b, "') makes a token the vocabulary lacks");
    rank_.emplace(a + " " + b, static_cast<int>(r));  // the first of repeated merges ranks
  }
  if (auto it = id_of_.find("<|endoftext|>"); it != id_of_.end()) end_of_text_ = it->second;
}

std::vector<int32_t> Gpt2Bpe::encode_piece(const std::string& piece) const {
  if (auto it = cache_.find(piece); it != cache_.end()) return it->second;
  std::vector<std::string> sym;
  for (unsigned char b : piece) sym.push_back(byte_chars().of_byte[b]);
  while (sym.size() > 1) {
    int best = INT32_MAX;
    std::string best_pair;
    for (size_t i = 0; i + 1 < sym.size(); i++) {
      auto it = rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != rank_.end() && it->second < best) best = it->second, best_pair = it->first;
    }
    if (best == INT32_MAX) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < sym.size(); i++) {
      if (i + 1 < sym.size() && sym[i] + " " + sym[i + 1] == best_pair) {
        merged.push_back(sym[i] + sym[i + 1]);
        i++;
      } else {
        merged.push_back(sym[i]);
      }
    }
    sym = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (auto& s : sym) ids.push_back(id_of_.at(s));  // every byte and every merge's result is in the vocabulary
  return cache_[piece] = ids;
}

#ifdef TG_WITH_PCRE2

bool Gpt2Bpe::available() { return true; }

namespace {
// GPT-2's split (Note [byte-level BPE]), compiled once.
const pcre2_code* gpt2_split() {
  static pcre2_code* code = [] {
    const char* pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                  &err, &at, nullptr);
    TG_ASSERT(c, "GPT-2 BPE: the split pattern does not compile (PCRE2 error ", err, " at ", at, ")");
    return c;
  }();
  return code;
}
}  // namespace

std::vector<int32_t> Gpt2Bpe::encode(const std::string& text) const {
  size_t bad = first_invalid_utf8(text);
  TG_CHECK(bad == std::string::npos, "GPT-2 BPE: the text is not valid UTF-8 at byte ", bad);
  std::vector<int32_t> ids;
  const pcre2_code* re = gpt2_split();
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> m(pcre2_match_data_create_from_pattern(re, nullptr),
                                                                       pcre2_match_data_free);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (PCRE2_SIZE at = 0; at < text.size();) {
    int rc = pcre2_match(re, subject, text.size(), at, 0, m.get(), nullptr);
    TG_ASSERT(rc > 0, "GPT-2 BPE: the split matched nothing at byte ", at, " (PCRE2 ", rc, ")");
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.get());
    TG_ASSERT(ov[1] > at, "GPT-2 BPE: the split made an empty piece at byte ", at);
    for (int32_t id : encode_piece(text.substr(ov[0], ov[1] - ov[0]))) ids.push_back(id);
    at = ov[1];
  }
  return ids;
}

#else

bool Gpt2Bpe::available() { return false; }

std::vector<int32_t> Gpt2Bpe::encode(const std::string&) const {
  TG_FAIL("GPT-2 BPE: this build has no PCRE2 (install libpcre2-dev and rebuild), which splits the text as GPT-2 does");
}

#endif

std::string Gpt2Bpe::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    TG_CHECK(id >= 0 && static_cast<size_t>(id) < token_of_.size() && !token_of_[static_cast<size_t>(id)].empty(),
             "GPT-2 BPE: token id ", id, " is not in the vocabulary");
    for (auto& c : characters(token_of_[static_cast<size_t>(id)])) {
      auto it = byte_chars().byte_of.find(c);
      if (it != byte_chars().byte_of.end()) out += static_cast<char>(it->second);
      else out += c;  // special tokens ("<|endoftext|>") are plain text
    }
  }
  return out;
}

std::vector<uint16_t> gpt2_document_tokens(const Gpt2Bpe& bpe, const std::string& text) {
  TG_CHECK(bpe.vocab_size() <= 65536, "GPT-2 BPE: a vocabulary of ", bpe.vocab_size(),
           " tokens does not fit llm.c shards (uint16 tokens)");
  std::vector<uint16_t> out;
  if (bpe.end_of_text() >= 0) out.push_back(static_cast<uint16_t>(bpe.end_of_text()));
  for (int32_t id : bpe.encode(text)) out.push_back(static_cast<uint16_t>(id));
  return out;
}

}  // namespace tg::nn
