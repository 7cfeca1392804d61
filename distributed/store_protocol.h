// The rendezvous store's wire format, shared by its server and client (store.h): frames, the
// authentication handshake, request and reply encodings. Internal to distributed/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tg::dist::store_wire {

// Note [store wire protocol]: TCP, one request and one reply at a time per connection.
//   frame     = u32 big-endian payload length L (0 < L <= MAX_FRAME), then L payload bytes.
//               A longer (or empty) frame closes the connection before its payload is read.
//   handshake = (see Note [store authentication])
//     server -> "TGRDZV1" s_nonce[32]
//     client -> c_nonce[32] HMAC-SHA256(token, "client" s_nonce c_nonce)
//     server -> "OK" HMAC-SHA256(token, "server" s_nonce c_nonce)     (or closes: wrong token)
//   request   = op:u8 then fields; reply = status:u8 then fields
//     string  = u32 length, bytes;   i64 = 8 bytes big-endian (two's complement)
//     SET    key value                 -> OK
//     GET    key                       -> OK value | NOT_FOUND
//     WAIT   timeout_ms:i64 n:u32 key*n -> OK | TIMEOUT n:u32 missing-key*n
//     ADD    key delta:i64             -> OK sum:i64        (values are decimal text)
//     CAS    key expected desired      -> OK current-value
//     DELETE key                       -> OK existed:u8
//   A request that does not parse (unknown op, a field past the frame's end, bytes left over, an
//   ADD on a value that is not an integer) closes its connection; the server goes on serving the
//   others. Keys carry the client's run-id prefix; the server treats them as opaque bytes.
constexpr uint32_t MAX_FRAME = 1u << 20;  // 1 MiB: a value of the store is a few hundred bytes
constexpr size_t NONCE_BYTES = 32;
constexpr size_t MAC_BYTES = 32;
constexpr char GREETING[] = "TGRDZV1";  // 7 bytes, then the server's nonce
constexpr char ACCEPTED[] = "OK";       // 2 bytes, then the server's proof

enum class Op : uint8_t { Set = 1, Get = 2, Wait = 3, Add = 4, Cas = 5, Delete = 6 };
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2 };

// Note [store authentication]: torchrun's TCPStore accepts anyone who can reach its port. Here
// every connection proves that it holds the job's token without sending it: the server sends a
// fresh random nonce, the client answers with a nonce of its own and HMAC-SHA256(token, "client"
// || both nonces), and the server, after checking that in constant time, proves itself the same
// way with "server". A listener that records a handshake learns nothing it can replay (the next
// connection gets another nonce), and a client never sends values to a server that does not know
// the token. The connection is not encrypted: values (a NCCL id, host names) are not secrets,
// the token is. A failed check, or no answer within the server's handshake timeout, closes the
// connection.
std::string random_bytes(size_t n);
std::string hmac_sha256(const std::string& key, const std::string& message);
bool same_bytes(const std::string& a, const std::string& b);  // constant time for equal lengths

// Builds a request or reply payload.
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(const std::string& s);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads a payload; every read past the end sets failed() and returns a zero value.
class Reader {
 public:
  explicit Reader(std::string payload) : p_(std::move(payload)) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  bool failed() const { return failed_; }
  bool done() const { return !failed_ && pos_ == p_.size(); }

 private:
  bool take(size_t n);
  std::string p_;
  size_t pos_ = 0;
  bool failed_ = false;
};

// The 4-byte length prefix of a payload, and the length a prefix holds.
std::string frame_header(size_t payload_bytes);
uint32_t frame_length(const unsigned char header[4]);

}  // namespace tg::dist::store_wire
