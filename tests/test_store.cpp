// The rendezvous store (distributed/store.h) over real sockets on 127.0.0.1, ephemeral ports:
// every operation, waits that time out naming their keys, the handshake refusing wrong and
// missing tokens, bad frames dropping only their own connection, the token file's mode, and the
// one address the server listens on (read back from /proc/net/tcp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "distributed/rendezvous.h"
#include "distributed/store.h"
#include "tinygrad/error.h"
#ifdef TG_WITH_STORE
#include "distributed/store_protocol.h"
#endif

using namespace tg;
using namespace tg::dist;
using Clock = std::chrono::steady_clock;

namespace {

#define SKIP_WITHOUT_STORE() \
  if (!built_with_store()) GTEST_SKIP() << "the rendezvous store is not built (needs libboost-dev and libssl-dev)"

const std::string TOKEN = "test-token-0123456789";

StoreClientOptions client_of(const StoreServer& s, const std::string& token = TOKEN, const std::string& prefix = "run") {
  StoreClientOptions o;
  o.port = s.port();
  o.token = token;
  o.prefix = prefix;
  o.connect_timeout = Seconds(5);
  o.timeout = Seconds(5);
  return o;
}

StoreServerOptions server_opts(Seconds handshake = Seconds(10)) {
  StoreServerOptions o;
  o.token = TOKEN;
  o.handshake_timeout = handshake;
  return o;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A plain TCP connection for speaking the protocol by hand.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~RawConnection() { ::close(fd_); }
  void send_bytes(const std::string& b) { ASSERT_EQ(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size())); }
  // The next frame's payload ("" when the connection closed first).
  std::string read_frame() {
    unsigned char h[4];
    if (!read_exact(h, 4)) return "";
    std::string p((size_t(h[0]) << 24) | (size_t(h[1]) << 16) | (size_t(h[2]) << 8) | h[3], '\0');
    return read_exact(p.data(), p.size()) ? p : "";
  }
  // True when the server closes the connection within `limit` (all data before that is skipped).
  bool closed_within(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    char buf[256];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  bool read_exact(void* dst, size_t n) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, 5000) <= 0) return false;
      const ssize_t k = ::recv(fd_, p, n, 0);
      if (k <= 0) return false;
      p += k;
      n -= size_t(k);
    }
    return true;
  }
  int fd_ = -1;
};

#ifdef TG_WITH_STORE
std::string framed(const std::string& payload) { return store_wire::frame_header(payload.size()) + payload; }

// A raw connection that has passed the handshake with `token`.
std::unique_ptr<RawConnection> authenticated_raw(uint16_t port, const std::string& token) {
  auto c = std::make_unique<RawConnection>(port);
  const std::string greeting = c->read_frame();
  EXPECT_EQ(greeting.size(), 7 + store_wire::NONCE_BYTES);
  const std::string cn(store_wire::NONCE_BYTES, 'c');
  c->send_bytes(framed(cn + store_wire::hmac_sha256(token, "client" + greeting.substr(7) + cn)));
  EXPECT_EQ(c->read_frame().substr(0, 2), "OK");
  return c;
}
#endif

}  // namespace

TEST(Store, SetGetDeleteAddCompareSet) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  StoreClient a(client_of(server)), b(client_of(server));
  a.set("x", "hello");
  EXPECT_EQ(b.get("x"), "hello");
  EXPECT_EQ(b.try_get("nothing"), std::nullopt);
  std::string big(100000, 'v');
  b.set("big", big);
  EXPECT_EQ(a.get("big"), big);
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_EQ(a.get("n"), "3");
  EXPECT_EQ(a.compare_set("c", "", "first"), "first");     // missing key, expected "": set
  EXPECT_EQ(b.compare_set("c", "wrong", "second"), "first");  // mismatch: unchanged
  EXPECT_EQ(b.compare_set("c", "first", "second"), "second");
  EXPECT_TRUE(a.remove("x"));
  EXPECT_FALSE(a.remove("x"));
  EXPECT_EQ(b.try_get("x"), std::nullopt);
}

TEST(Store, KeysLiveUnderTheRunPrefix) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  StoreClient one(client_of(server, TOKEN, "job1")), two(client_of(server, TOKEN, "job2")),
      bare(client_of(server, TOKEN, ""));
  one.set("k", "1");
  EXPECT_EQ(two.try_get("k"), std::nullopt);
  EXPECT_EQ(bare.get("job1/k"), "1");
}

TEST(Store, WaitReturnsWhenAnotherClientSetsTheKeys) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  StoreClient waiter(client_of(server)), writer(client_of(server));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    writer.set("a", "1");
    writer.add("b", 1);
  });
  const auto start = Clock::now();
  waiter.wait({"a", "b"}, Seconds(5));
  t.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(waiter.get("b"), "1");
}

TEST(Store, WaitTimesOutNamingTheMissingKeys) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  StoreClient c(client_of(server));
  c.set("here", "1");
  const auto start = Clock::now();
  const std::string e = error_of([&] { c.wait({"here", "rank/1", "rank/3"}, Seconds(0.3)); });
  const auto took = Clock::now() - start;
  EXPECT_NE(e.find("timed out after 0.3 s waiting for rank/1, rank/3"), std::string::npos) << e;
  EXPECT_EQ(e.find("here,"), std::string::npos) << e;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_NE(error_of([&] { c.get("never", Seconds(0.1)); }).find("waiting for never"), std::string::npos);
  c.set("after", "ok");  // the connection is still good after a timed-out wait
  EXPECT_EQ(c.get("after"), "ok");
}

TEST(Store, WrongAndMissingTokensAreRefused) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts(Seconds(0.5)));
  const std::string wrong = error_of([&] { StoreClient c(client_of(server, "not-the-token")); });
  EXPECT_NE(wrong.find("authentication refused"), std::string::npos) << wrong;
  EXPECT_NE(error_of([&] { StoreClient c(client_of(server, "")); }).find("needs the token"), std::string::npos);
  RawConnection silent(server.port());  // never answers the challenge: dropped at the handshake timeout
  EXPECT_FALSE(silent.read_frame().empty());
  EXPECT_TRUE(silent.closed_within(std::chrono::milliseconds(3000)));
  EXPECT_GE(server.refused_connections(), 2u);
  StoreClient good(client_of(server));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

#ifdef TG_WITH_STORE
TEST(Store, BadFramesCloseOnlyTheirConnection) {
  StoreServer server(server_opts());
  StoreClient good(client_of(server));
  good.set("k", "v");
  {  // oversized, before the handshake
    RawConnection c(server.port());
    c.read_frame();
    c.send_bytes(store_wire::frame_header(store_wire::MAX_FRAME + 1));
    EXPECT_TRUE(c.closed_within(std::chrono::milliseconds(3000)));
  }
  {  // oversized, after the handshake
    auto c = authenticated_raw(server.port(), TOKEN);
    c->send_bytes(store_wire::frame_header(0x7fffffff));
    EXPECT_TRUE(c->closed_within(std::chrono::milliseconds(3000)));
  }
  {  // an unknown op
    auto c = authenticated_raw(server.port(), TOKEN);
    c->send_bytes(framed(std::string(1, char(99)) + "xyz"));
    EXPECT_TRUE(c->closed_within(std::chrono::milliseconds(3000)));
  }
  {  // a string longer than its frame
    auto c = authenticated_raw(server.port(), TOKEN);
    c->send_bytes(framed(store_wire::Writer().u8(uint8_t(store_wire::Op::Set)).u32(1000).take() + "short"));
    EXPECT_TRUE(c->closed_within(std::chrono::milliseconds(3000)));
  }
  {  // bytes left over after a valid GET
    auto c = authenticated_raw(server.port(), TOKEN);
    c->send_bytes(framed(store_wire::Writer().u8(uint8_t(store_wire::Op::Get)).str("run/k").take() + "!"));
    EXPECT_TRUE(c->closed_within(std::chrono::milliseconds(3000)));
  }
  {  // ADD on a value that is not a number
    auto c = authenticated_raw(server.port(), TOKEN);
    c->send_bytes(framed(store_wire::Writer().u8(uint8_t(store_wire::Op::Add)).str("run/k").i64(1).take()));
    EXPECT_TRUE(c->closed_within(std::chrono::milliseconds(3000)));
  }
  {  // well-formed requests by hand work, two sent before either reply is read too
    auto c = authenticated_raw(server.port(), TOKEN);
    const std::string get = framed(store_wire::Writer().u8(uint8_t(store_wire::Op::Get)).str("run/k").take());
    c->send_bytes(get + get);
    EXPECT_EQ(c->read_frame(), store_wire::Writer().u8(0).str("v").take());
    EXPECT_EQ(c->read_frame(), store_wire::Writer().u8(0).str("v").take());
  }
  EXPECT_EQ(server.refused_connections(), 6u);
  good.set("k2", "still");  // the other client kept working throughout
  EXPECT_EQ(good.get("k2"), "still");
  EXPECT_EQ(good.get("k"), "v");
}
#endif

TEST(Store, ListensOnlyOnTheConfiguredAddress) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  char want[32];
  std::snprintf(want, sizeof want, "0100007F:%04X", server.port());  // 127.0.0.1, little-endian hex
  std::ifstream tcp("/proc/net/tcp");
  std::string line, found;
  int listeners_on_port = 0;
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, ":%04X ", server.port());
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state != "0A" || (local + " ").find(port_hex) == std::string::npos) continue;  // 0A: LISTEN
    listeners_on_port++;
    found = local;
  }
  EXPECT_EQ(listeners_on_port, 1);
  EXPECT_EQ(found, want) << "the store listens on " << found << ", not on 127.0.0.1 alone";
}

TEST(Store, RefusesAnAddressItCannotBind) {
  SKIP_WITHOUT_STORE();
  StoreServerOptions o = server_opts();
  o.host = "not-an-address";
  EXPECT_NE(error_of([&] { StoreServer s(o); }).find("not an IP address"), std::string::npos);
  o.host = "127.0.0.1";
  o.token = "";
  EXPECT_NE(error_of([&] { StoreServer s(o); }).find("without a token"), std::string::npos);
}

TEST(Store, ClientRetriesConnectingUntilItsTimeout) {
  SKIP_WITHOUT_STORE();
  uint16_t port;
  { port = StoreServer(server_opts()).port(); }  // a port nobody listens on now
  StoreClientOptions o;
  o.port = port;
  o.token = TOKEN;
  o.connect_timeout = Seconds(0.6);
  const auto start = Clock::now();
  const std::string e = error_of([&] { StoreClient c(o); });
  EXPECT_NE(e.find("cannot connect within 0.6 s"), std::string::npos) << e;
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  // A server that comes up while the client retries is found.
  StoreServerOptions so = server_opts();
  so.port = port;
  std::unique_ptr<StoreServer> late;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    late = std::make_unique<StoreServer>(so);
  });
  o.connect_timeout = Seconds(5);
  {
    StoreClient c(o);
    c.set("k", "v");
  }
  t.join();
}

TEST(Store, TokenFileMustBeOwnerOnly) {
  SKIP_WITHOUT_STORE();
  const std::string path = (std::filesystem::temp_directory_path() / ("tg_token_" + std::to_string(getpid()))).string();
  {
    std::ofstream(path) << "  secret-token\n";
  }
  ::chmod(path.c_str(), 0644);
  const std::string e = error_of([&] { read_token_file(path); });
  EXPECT_NE(e.find("has mode 0644"), std::string::npos) << e;
  EXPECT_NE(e.find("chmod 600"), std::string::npos) << e;
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_token_file(path), "secret-token");
  std::filesystem::remove(path);
  EXPECT_NE(error_of([&] { read_token_file(path); }).find("does not exist"), std::string::npos);
  EXPECT_NE(random_token(), random_token());
  EXPECT_EQ(random_token().size(), 64u);
}

TEST(Store, ParsesEndpoints) {
  EXPECT_EQ(parse_endpoint("10.0.0.1:29500", "--rdzv"), std::make_pair(std::string("10.0.0.1"), uint16_t(29500)));
  EXPECT_NE(error_of([] { parse_endpoint("host", "--rdzv"); }).find("expected HOST:PORT"), std::string::npos);
  EXPECT_NE(error_of([] { parse_endpoint("host:99999", "--rdzv"); }).find("1 to 65535"), std::string::npos);
}

// NCCL's unique id without MPI: root's bytes reach every rank through the store, and a root that
// never publishes is named at the deadline.
TEST(Store, BootstrapBroadcastsThroughTheStore) {
  SKIP_WITHOUT_STORE();
  StoreServer server(server_opts());
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; r++)
    ranks.emplace_back([&, r] {
      auto boot = store_bootstrap(std::make_unique<StoreClient>(client_of(server)), r, 3, Seconds(5));
      for (int round = 0; round < 2; round++) {
        std::string id(128, char('0' + r));
        boot->broadcast(id.data(), id.size(), round);
        got[size_t(r)] += id.substr(0, 1);
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(got, std::vector<std::string>(3, "01"));
  auto lonely = store_bootstrap(std::make_unique<StoreClient>(client_of(server, TOKEN, "other")), 1, 2, Seconds(0.2));
  char id[16];
  const std::string e = error_of([&] { lonely->broadcast(id, sizeof id, 0); });
  EXPECT_NE(e.find("rank 0 never published its id"), std::string::npos) << e;
  EXPECT_NE(e.find("bootstrap/0"), std::string::npos) << e;
}

// A server that goes away while a client waits: the wait ends at once with an error, and the
// server's destruction with a wait parked in it neither hangs nor crashes.
TEST(Store, AWaitEndsWhenTheServerGoesAway) {
  SKIP_WITHOUT_STORE();
  auto server = std::make_unique<StoreServer>(server_opts());
  StoreClient c(client_of(*server));
  std::string e;
  const auto start = Clock::now();
  std::thread waiter([&] { e = error_of([&] { c.wait({"never"}, Seconds(10)); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.reset();
  waiter.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_NE(e.find("closed the connection"), std::string::npos) << e;
}
