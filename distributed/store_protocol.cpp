// The store's wire encodings and its cryptographic helpers (store_protocol.h), and the token
// sources of store.h.
#include "distributed/store_protocol.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "distributed/store.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace store_wire {

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  TG_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1,
           "store: the system's random source (OpenSSL RAND_bytes) failed");
  return out;
}

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  TG_ASSERT(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                 reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len) != nullptr,
            "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(mac), len);
}

bool same_bytes(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Writer& Writer::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out_.push_back(static_cast<char>((v >> s) & 0xff));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int s = 56; s >= 0; s -= 8) out_.push_back(static_cast<char>((u >> s) & 0xff));
  return *this;
}

Writer& Writer::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  out_ += s;
  return *this;
}

bool Reader::take(size_t n) {
  if (failed_ || p_.size() - pos_ < n) {
    failed_ = true;
    return false;
  }
  return true;
}

uint8_t Reader::u8() { return take(1) ? static_cast<uint8_t>(p_[pos_++]) : 0; }

uint32_t Reader::u32() {
  if (!take(4)) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = (v << 8) | static_cast<unsigned char>(p_[pos_++]);
  return v;
}

int64_t Reader::i64() {
  if (!take(8)) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | static_cast<unsigned char>(p_[pos_++]);
  return static_cast<int64_t>(v);
}

std::string Reader::str() {
  const uint32_t n = u32();
  if (!take(n)) return "";
  std::string s = p_.substr(pos_, n);
  pos_ += n;
  return s;
}

std::string frame_header(size_t payload_bytes) { return Writer().u32(static_cast<uint32_t>(payload_bytes)).take(); }

uint32_t frame_length(const unsigned char h[4]) {
  return (uint32_t(h[0]) << 24) | (uint32_t(h[1]) << 16) | (uint32_t(h[2]) << 8) | uint32_t(h[3]);
}

}  // namespace store_wire

namespace {

std::string trimmed(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t a = s.find_first_not_of(ws);
  return a == std::string::npos ? "" : s.substr(a, s.find_last_not_of(ws) - a + 1);
}

}  // namespace

std::string read_token_file(const std::string& path) {
  struct stat st {};
  TG_CHECK(::stat(path.c_str(), &st) == 0, "rendezvous token file '", path, "' does not exist");
  TG_CHECK(S_ISREG(st.st_mode), "rendezvous token file '", path, "' is not a regular file");
  TG_CHECK((st.st_mode & 077) == 0, "rendezvous token file '", path, "' has mode 0",
           std::oct, (st.st_mode & 0777), std::dec, ": others can read it; it must be readable by its owner alone (chmod 600 ",
           path, ")");
  std::ifstream in(path);
  TG_CHECK(in.good(), "rendezvous token file '", path, "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = trimmed(ss.str());
  TG_CHECK(!token.empty(), "rendezvous token file '", path, "' is empty");
  return token;
}

std::string store_token_from_env() {
  const char* token = std::getenv("TG_RDZV_TOKEN");
  if (token && *token) return token;
  const char* file = std::getenv("TG_RDZV_TOKEN_FILE");
  if (file && *file) return read_token_file(file);
  TG_FAIL("rendezvous store: no token; set TG_RDZV_TOKEN, or TG_RDZV_TOKEN_FILE to a file of mode 0600 that ",
          "holds it (the same token on every node)");
}

std::string random_token() {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : store_wire::random_bytes(32)) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

bool built_with_store() { return true; }

}  // namespace tg::dist
