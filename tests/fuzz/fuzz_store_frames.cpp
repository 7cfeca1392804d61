// libFuzzer target: the rendezvous store's server (distributed/store_server.cpp and the wire
// format of store_protocol.cpp) on arbitrary bytes after a valid handshake. One server runs in the
// fuzzing process; each input opens a connection, authenticates as a client holding the token
// would, sends the input as the byte stream of frames that follows, and closes. A malformed frame
// may only close that connection: after every input an ordinary client must still set and get a
// key, else it is a finding (as is a crash or a sanitizer report).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "distributed/store.h"
#include "distributed/store_protocol.h"
#include "tinygrad/error.h"

namespace {

namespace wire = tg::dist::store_wire;
const char* TOKEN = "fuzz-token";

tg::dist::StoreServer& server() {
  static auto* s = [] {
    tg::dist::StoreServerOptions o;
    o.token = TOKEN;
    o.handshake_timeout = tg::dist::Seconds(30.0);
    return new tg::dist::StoreServer(o);
  }();
  return *s;
}

bool send_all(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

bool recv_all(int fd, std::string& out, size_t n) {
  out.resize(n);
  for (size_t at = 0; at < n;) {
    ssize_t got = ::recv(fd, out.data() + at, n - at, 0);
    if (got <= 0) return false;
    at += static_cast<size_t>(got);
  }
  return true;
}

bool recv_frame(int fd, std::string& payload) {
  std::string header;
  if (!recv_all(fd, header, 4)) return false;
  return recv_all(fd, payload, wire::frame_length(reinterpret_cast<const unsigned char*>(header.data())));
}

// A connection that has passed the handshake, or -1.
int authenticated_connection() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  // Each connection leaves a TIME_WAIT entry for a minute: from one source address the ephemeral
  // ports would run out within seconds, so the source rotates over 127.0.x.y.
  static uint32_t next = 0;
  const uint32_t n = next++ % 60000;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl((127u << 24) | ((n / 250) << 8) | (n % 250 + 2));
  ::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(server().port());
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  timeval tv{30, 0};  // generous: CI runs every fuzz target at once on two cores
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string greeting, answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || !recv_frame(fd, greeting) ||
      greeting.size() != 7 + wire::NONCE_BYTES) {
    ::close(fd);
    return -1;
  }
  const std::string server_nonce = greeting.substr(7), client_nonce(wire::NONCE_BYTES, 'c');
  const std::string proof = client_nonce + wire::hmac_sha256(TOKEN, "client" + server_nonce + client_nonce);
  if (!send_all(fd, wire::frame_header(proof.size()) + proof) || !recv_frame(fd, answer) || answer.rfind("OK", 0) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = -1;
  for (int attempt = 0; attempt < 3 && fd < 0; attempt++) fd = authenticated_connection();
  if (fd < 0) __builtin_trap();  // a fresh, correct client must get in
  send_all(fd, std::string(reinterpret_cast<const char*>(data), size));
  // Let the server read everything and close first; a session still in a WAIT is reset.
  ::shutdown(fd, SHUT_WR);
  timeval drain{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &drain, sizeof drain);
  char sink[4096];
  ssize_t got;
  while ((got = ::recv(fd, sink, sizeof sink, 0)) > 0) {
  }
  if (got < 0) {
    linger reset{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  }
  ::close(fd);
  static std::unique_ptr<tg::dist::StoreClient> probe = [] {
    tg::dist::StoreClientOptions o;
    o.port = server().port();
    o.token = TOKEN;
    o.prefix = "probe";
    o.connect_timeout = o.timeout = tg::dist::Seconds(30.0);
    return std::make_unique<tg::dist::StoreClient>(o);
  }();
  try {
    probe->set("alive", std::to_string(size));
    if (probe->get("alive") != std::to_string(size)) __builtin_trap();
  } catch (const tg::Error&) {
    __builtin_trap();  // the store stopped serving an ordinary client
  }
  return 0;
}
