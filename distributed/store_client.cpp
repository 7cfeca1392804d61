// StoreClient (store.h): one authenticated connection, blocking calls on Boost.Asio. Each call
// runs its asynchronous operations on a private io_context for at most the time it has left
// (Note [deadlines of the client]); connecting retries with backoff until connect_timeout.
#include <utility>  // first: Boost 1.74's asio.hpp uses std::exchange without including it

#include <boost/asio.hpp>

#include <algorithm>
#include <thread>

#include "distributed/store.h"
#include "distributed/store_protocol.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace wire = store_wire;
using Clock = std::chrono::steady_clock;

namespace {

// Note [deadlines of the client]: a blocking read on a socket has no deadline, and a server that
// stopped (SIGSTOP, a dead node) would hold a rank forever. So every exchange is an async_write
// and async_read run on the client's own io_context with run_for(time left); when they have not
// finished, the socket is closed and the call throws, naming the server and what it waited for.
// A WAIT is given to the server with its own timeout and read with a few seconds more, so that
// the server's answer (naming the missing keys) normally comes first.
constexpr Seconds REPLY_GRACE{5.0};

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

struct StoreClient::Impl {
  StoreClientOptions opt;
  asio::io_context io;
  tcp::socket socket{io};
  std::string endpoint;

  std::string key(const std::string& k) const { return opt.prefix.empty() ? k : opt.prefix + "/" + k; }
  std::string unprefixed(const std::string& k) const {
    return opt.prefix.empty() ? k : k.substr(std::min(k.size(), opt.prefix.size() + 1));
  }

  // Runs the io_context until `done` or the deadline; on the deadline closes the socket and throws.
  void run_until(const bool& done, Clock::time_point deadline, const std::string& what) {
    io.restart();
    while (!done && Clock::now() < deadline) io.run_one_for(deadline - Clock::now());
    if (done) return;
    boost::system::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();
    TG_FAIL("rendezvous store ", endpoint, ": no answer ", what, " in time (is the server alive?)");
  }

  void write_frame(const std::string& payload, Clock::time_point deadline, const std::string& what) {
    const std::string bytes = wire::frame_header(payload.size()) + payload;
    bool done = false;
    boost::system::error_code error;
    asio::async_write(socket, asio::buffer(bytes), [&](const boost::system::error_code& ec, size_t) {
      error = ec;
      done = true;
    });
    run_until(done, deadline, what);
    TG_CHECK(!error, "rendezvous store ", endpoint, ": the connection broke ", what, " (", error.message(), ")");
  }

  std::string read_frame(Clock::time_point deadline, const std::string& what) {
    unsigned char header[4];
    std::string payload;
    bool done = false;
    boost::system::error_code error;
    asio::async_read(socket, asio::buffer(header), [&](const boost::system::error_code& ec, size_t) {
      error = ec;
      done = true;
    });
    run_until(done, deadline, what);
    const uint32_t n = error ? 0 : wire::frame_length(header);
    if (!error) {
      TG_CHECK(n > 0 && n <= wire::MAX_FRAME, "rendezvous store ", endpoint, ": a reply of ", n, " bytes ", what);
      payload.resize(n);
      done = false;
      asio::async_read(socket, asio::buffer(payload), [&](const boost::system::error_code& ec, size_t) {
        error = ec;
        done = true;
      });
      run_until(done, deadline, what);
    }
    TG_CHECK(!error, "rendezvous store ", endpoint, ": the server closed the connection ", what, " (",
             error.message(), ")");
    return payload;
  }

  // One request and its reply, within `limit`.
  std::string call(const std::string& request, Seconds limit, const std::string& what) {
    TG_CHECK(request.size() <= wire::MAX_FRAME, "rendezvous store: a request of ", request.size(),
             " bytes is over the limit of ", wire::MAX_FRAME, " ", what);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
    write_frame(request, deadline, what);
    return read_frame(deadline, what);
  }

  bool try_connect(const tcp::resolver::results_type& at, Clock::time_point deadline) {
    bool done = false;
    boost::system::error_code error;
    asio::async_connect(socket, at, [&](const boost::system::error_code& ec, const tcp::endpoint&) {
      error = ec;
      done = true;
    });
    io.restart();
    while (!done && Clock::now() < deadline) io.run_one_for(deadline - Clock::now());
    if (!done) {
      boost::system::error_code ignored;
      socket.close(ignored);
      io.restart();
      io.run();
    }
    return done && !error;
  }

  // Connects, retrying with doubling pauses (50 ms up to 2 s) until connect_timeout.
  void connect() {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(opt.connect_timeout);
    auto pause = std::chrono::milliseconds(50);
    std::string last = "not tried";
    for (;;) {
      boost::system::error_code ec;
      tcp::resolver resolver(io);
      auto at = resolver.resolve(opt.host, std::to_string(opt.port), ec);
      if (!ec && try_connect(at, deadline)) return;
      last = ec ? ec.message() : "connection refused or timed out";
      TG_CHECK(Clock::now() + pause < deadline, "rendezvous store ", endpoint, ": cannot connect within ",
               opt.connect_timeout.count(), " s (", last, ")");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(2000));
    }
  }

  void authenticate() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    const std::string greeting = read_frame(deadline, "during the handshake");
    TG_CHECK(greeting.size() == 7 + wire::NONCE_BYTES && greeting.compare(0, 7, wire::GREETING) == 0,
             "rendezvous store ", endpoint, ": the server is not a tinygrad++ store (unexpected greeting)");
    const std::string server_nonce = greeting.substr(7), client_nonce = wire::random_bytes(wire::NONCE_BYTES);
    write_frame(client_nonce + wire::hmac_sha256(opt.token, "client" + server_nonce + client_nonce), deadline,
                "during the handshake");
    std::string answer;
    try {
      answer = read_frame(deadline, "during the handshake");
    } catch (const Error&) {
      TG_FAIL("rendezvous store ", endpoint, ": authentication refused (the token differs from the server's; ",
              "check TG_RDZV_TOKEN or TG_RDZV_TOKEN_FILE)");
    }
    const std::string proof = wire::hmac_sha256(opt.token, "server" + server_nonce + client_nonce);
    TG_CHECK(answer.size() == 2 + wire::MAC_BYTES && answer.compare(0, 2, wire::ACCEPTED) == 0 &&
                 wire::same_bytes(answer.substr(2), proof),
             "rendezvous store ", endpoint, ": the server could not prove that it holds the token");
  }
};

StoreClient::StoreClient(const StoreClientOptions& opt) : impl_(std::make_unique<Impl>()) {
  TG_CHECK(!opt.token.empty(), "rendezvous store: a client needs the token (TG_RDZV_TOKEN or TG_RDZV_TOKEN_FILE)");
  impl_->opt = opt;
  endpoint_ = impl_->endpoint = opt.host + ":" + std::to_string(opt.port);
  impl_->connect();
  impl_->authenticate();
}

StoreClient::~StoreClient() = default;

void StoreClient::set(const std::string& key, const std::string& value) {
  wire::Reader r(impl_->call(wire::Writer().u8(uint8_t(wire::Op::Set)).str(impl_->key(key)).str(value).take(),
                             impl_->opt.timeout, "to set '" + key + "'"));
  TG_CHECK(static_cast<wire::Status>(r.u8()) == wire::Status::Ok && r.done(), "rendezvous store ", endpoint_,
           ": a malformed reply to set '", key, "'");
}

std::optional<std::string> StoreClient::try_get(const std::string& key) {
  const std::string reply = impl_->call(wire::Writer().u8(uint8_t(wire::Op::Get)).str(impl_->key(key)).take(),
                                        impl_->opt.timeout, "to get '" + key + "'");
  wire::Reader r(reply);
  const auto status = static_cast<wire::Status>(r.u8());
  if (status == wire::Status::NotFound && r.done()) return std::nullopt;
  std::string value = r.str();
  TG_CHECK(status == wire::Status::Ok && r.done(), "rendezvous store ", endpoint_, ": a malformed reply to get '",
           key, "'");
  return value;
}

std::string StoreClient::get(const std::string& key, std::optional<Seconds> timeout) {
  wait({key}, timeout);
  auto value = try_get(key);
  TG_CHECK(value.has_value(), "rendezvous store ", endpoint_, ": key '", key, "' was deleted while being read");
  return *value;
}

void StoreClient::wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) {
  const Seconds limit = timeout.value_or(impl_->opt.timeout);
  wire::Writer w;
  w.u8(uint8_t(wire::Op::Wait)).i64(static_cast<int64_t>(limit.count() * 1000)).u32(uint32_t(keys.size()));
  for (const auto& k : keys) w.str(impl_->key(k));
  wire::Reader r(impl_->call(w.take(), limit + REPLY_GRACE, "while waiting for " + joined(keys)));
  const auto status = static_cast<wire::Status>(r.u8());
  std::vector<std::string> missing(r.u32());
  for (auto& k : missing) k = impl_->unprefixed(r.str());
  TG_CHECK(r.done() && (status == wire::Status::Ok || status == wire::Status::Timeout), "rendezvous store ",
           endpoint_, ": a malformed reply to a wait");
  TG_CHECK(status == wire::Status::Ok, "rendezvous store ", endpoint_, ": timed out after ", limit.count(),
           " s waiting for ", joined(missing), impl_->opt.prefix.empty() ? "" : " (run '" + impl_->opt.prefix + "')");
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  wire::Reader r(impl_->call(wire::Writer().u8(uint8_t(wire::Op::Add)).str(impl_->key(key)).i64(delta).take(),
                             impl_->opt.timeout, "to add to '" + key + "'"));
  const auto status = static_cast<wire::Status>(r.u8());
  const int64_t sum = r.i64();
  TG_CHECK(status == wire::Status::Ok && r.done(), "rendezvous store ", endpoint_, ": a malformed reply to add '",
           key, "'");
  return sum;
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  wire::Reader r(impl_->call(
      wire::Writer().u8(uint8_t(wire::Op::Cas)).str(impl_->key(key)).str(expected).str(desired).take(),
      impl_->opt.timeout, "to compare-and-set '" + key + "'"));
  const auto status = static_cast<wire::Status>(r.u8());
  std::string value = r.str();
  TG_CHECK(status == wire::Status::Ok && r.done(), "rendezvous store ", endpoint_,
           ": a malformed reply to compare-and-set '", key, "'");
  return value;
}

bool StoreClient::remove(const std::string& key) {
  wire::Reader r(impl_->call(wire::Writer().u8(uint8_t(wire::Op::Delete)).str(impl_->key(key)).take(),
                             impl_->opt.timeout, "to delete '" + key + "'"));
  const auto status = static_cast<wire::Status>(r.u8());
  const bool existed = r.u8() != 0;
  TG_CHECK(status == wire::Status::Ok && r.done(), "rendezvous store ", endpoint_, ": a malformed reply to delete '",
           key, "'");
  return existed;
}

}  // namespace tg::dist
