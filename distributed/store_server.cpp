// StoreServer (store.h): Boost.Asio on one thread. Each connection is a Session that reads a
// frame header, then its payload, answers, and reads the next; the first exchange is the
// handshake (Note [store authentication]). WAIT requests park in the server until their keys
// exist or their timer fires (Note [waits in the server]).
#include <utility>  // first: Boost 1.74's asio.hpp uses std::exchange without including it

#include <boost/asio.hpp>

#include <atomic>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <thread>

#include "distributed/store.h"
#include "distributed/store_protocol.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace wire = store_wire;

namespace {

// Note [waits in the server]: a WAIT whose keys are not all there is kept as a Waiter; every
// write (SET, ADD, CAS) checks the waiters, and each waiter's timer answers TIMEOUT with the keys
// still missing. The session reads no further request until the wait is answered, so a client
// has at most one request outstanding. Everything runs on the server's one thread: no locks.
struct Waiter;

struct State {
  std::string token;
  std::map<std::string, std::string> data;
  std::list<std::shared_ptr<Waiter>> waiters;
  std::atomic<uint64_t> refused{0};
  Seconds handshake_timeout{10.0};

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!data.count(k)) out.push_back(k);
    return out;
  }
  void wake_waiters();
};

struct Waiter {
  std::vector<std::string> keys;
  std::function<void(const std::vector<std::string>& missing)> answer;  // empty missing: all there
  std::unique_ptr<asio::steady_timer> timer;
  bool done = false;
};

void State::wake_waiters() {
  for (auto it = waiters.begin(); it != waiters.end();) {
    auto w = *it;
    if (missing(w->keys).empty()) {
      it = waiters.erase(it);
      w->done = true;
      w->timer->cancel();
      w->answer({});
    } else {
      ++it;
    }
  }
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, State& state) : socket_(std::move(socket)), state_(state), timer_(socket_.get_executor()) {}

  void start() {
    nonce_ = wire::random_bytes(wire::NONCE_BYTES);
    timer_.expires_after(std::chrono::duration_cast<std::chrono::milliseconds>(state_.handshake_timeout));
    auto self = shared_from_this();
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec && !self->authenticated_) self->refuse();
    });
    send(std::string(wire::GREETING, 7) + nonce_);
    read_frame();
  }

 private:
  // Queues a frame; one async_write at a time, so that frames never interleave (a client that
  // sends its next request before reading a long reply).
  void send(std::string payload) {
    outbox_.push_back(wire::frame_header(payload.size()) + payload);
    if (outbox_.size() == 1) write_next();
  }

  void write_next() {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(outbox_.front()), [self](const boost::system::error_code& ec, size_t) {
      if (ec) return self->close();
      self->outbox_.pop_front();
      if (!self->outbox_.empty()) self->write_next();
    });
  }

  void read_frame() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_), [self](const boost::system::error_code& ec, size_t) {
      if (ec) return self->close();
      const uint32_t n = wire::frame_length(self->header_);
      if (n == 0 || n > wire::MAX_FRAME) return self->refuse();
      self->payload_.resize(n);
      asio::async_read(self->socket_, asio::buffer(self->payload_),
                       [self](const boost::system::error_code& ec2, size_t) {
                         if (ec2) return self->close();
                         self->authenticated_ ? self->handle_request() : self->handle_handshake();
                       });
    });
  }

  void handle_handshake() {
    if (payload_.size() != wire::NONCE_BYTES + wire::MAC_BYTES) return refuse();
    const std::string client_nonce = payload_.substr(0, wire::NONCE_BYTES);
    const std::string proof = payload_.substr(wire::NONCE_BYTES);
    if (!wire::same_bytes(proof, wire::hmac_sha256(state_.token, "client" + nonce_ + client_nonce))) return refuse();
    authenticated_ = true;
    timer_.cancel();
    send(std::string(wire::ACCEPTED, 2) + wire::hmac_sha256(state_.token, "server" + nonce_ + client_nonce));
    read_frame();
  }

  void handle_request() {
    wire::Reader r(payload_);
    const auto op = static_cast<wire::Op>(r.u8());
    switch (op) {
      case wire::Op::Set: {
        std::string key = r.str(), value = r.str();
        if (!r.done()) return refuse();
        state_.data[key] = value;
        reply(wire::Writer().u8(uint8_t(wire::Status::Ok)).take());
        return state_.wake_waiters();
      }
      case wire::Op::Get: {
        std::string key = r.str();
        if (!r.done()) return refuse();
        auto it = state_.data.find(key);
        return reply(it == state_.data.end() ? wire::Writer().u8(uint8_t(wire::Status::NotFound)).take()
                                             : wire::Writer().u8(uint8_t(wire::Status::Ok)).str(it->second).take());
      }
      case wire::Op::Wait: return handle_wait(r);
      case wire::Op::Add: {
        std::string key = r.str();
        const int64_t delta = r.i64();
        if (!r.done()) return refuse();
        int64_t sum = delta;
        if (auto it = state_.data.find(key); it != state_.data.end()) {
          size_t used = 0;
          try {
            sum += std::stoll(it->second, &used);
          } catch (const std::exception&) {
            return refuse();
          }
          if (used != it->second.size()) return refuse();
        }
        state_.data[key] = std::to_string(sum);
        reply(wire::Writer().u8(uint8_t(wire::Status::Ok)).i64(sum).take());
        return state_.wake_waiters();
      }
      case wire::Op::Cas: {
        std::string key = r.str(), expected = r.str(), desired = r.str();
        if (!r.done()) return refuse();
        auto it = state_.data.find(key);
        const bool matches = it == state_.data.end() ? expected.empty() : it->second == expected;
        if (matches) state_.data[key] = desired;
        reply(wire::Writer().u8(uint8_t(wire::Status::Ok)).str(state_.data.count(key) ? state_.data[key] : "").take());
        if (matches) state_.wake_waiters();
        return;
      }
      case wire::Op::Delete: {
        std::string key = r.str();
        if (!r.done()) return refuse();
        const bool existed = state_.data.erase(key) > 0;
        return reply(wire::Writer().u8(uint8_t(wire::Status::Ok)).u8(existed ? 1 : 0).take());
      }
    }
    refuse();  // an unknown op
  }

  void handle_wait(wire::Reader& r) {
    const int64_t timeout_ms = r.i64();
    const uint32_t n = r.u32();
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < n && !r.failed(); i++) keys.push_back(r.str());
    if (!r.done() || timeout_ms < 0) return refuse();
    auto waiter = std::make_shared<Waiter>();
    waiter->keys = std::move(keys);
    auto self = shared_from_this();
    waiter->answer = [self](const std::vector<std::string>& missing) {
      self->waiting_.reset();  // the caller holds the waiter until this returns
      wire::Writer w;
      w.u8(uint8_t(missing.empty() ? wire::Status::Ok : wire::Status::Timeout)).u32(uint32_t(missing.size()));
      for (const auto& k : missing) w.str(k);
      self->reply(w.take());
    };
    if (state_.missing(waiter->keys).empty()) return waiter->answer({});
    waiter->timer = std::make_unique<asio::steady_timer>(socket_.get_executor());
    waiter->timer->expires_after(std::chrono::milliseconds(timeout_ms));
    std::weak_ptr<Waiter> weak = waiter;
    State* state = &state_;
    waiter->timer->async_wait([weak, state](const boost::system::error_code& ec) {
      auto w = weak.lock();
      if (ec || !w || w->done) return;
      w->done = true;
      state->waiters.remove(w);
      w->answer(state->missing(w->keys));
    });
    waiting_ = waiter;
    state_.waiters.push_back(std::move(waiter));
  }

  // Sends the reply and reads the next request.
  void reply(std::string payload) {
    send(std::move(payload));
    read_frame();
  }

  // Drops a connection that broke the protocol or failed the handshake.
  void refuse() {
    if (closed_) return;
    state_.refused++;
    close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    // A wait of this session would answer into a closed socket: drop it.
    if (auto w = std::move(waiting_)) {
      w->done = true;
      w->timer->cancel();
      state_.waiters.remove(w);
    }
  }

  tcp::socket socket_;
  State& state_;
  asio::steady_timer timer_;
  unsigned char header_[4] = {};
  std::string payload_, nonce_;
  std::deque<std::string> outbox_;  // frames waiting to be written, the front one being written
  std::shared_ptr<Waiter> waiting_;  // the parked WAIT of this session (it holds the session)
  bool authenticated_ = false, closed_ = false;
};

}  // namespace

struct StoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  State state;
  std::string host;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Session>(std::move(socket), state)->start();
      accept();
    });
  }
};

StoreServer::StoreServer(const StoreServerOptions& opt) : impl_(std::make_unique<Impl>()) {
  TG_CHECK(!opt.token.empty(), "rendezvous store: refusing to serve without a token");
  impl_->state.token = opt.token;
  impl_->state.handshake_timeout = opt.handshake_timeout;
  impl_->host = opt.host;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(opt.host, ec);
  TG_CHECK(!ec, "rendezvous store: '", opt.host, "' is not an IP address to listen on (", ec.message(), ")");
  const tcp::endpoint at(address, opt.port);
  auto& acc = impl_->acceptor;
  acc.open(at.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(at, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  TG_CHECK(!ec, "rendezvous store: cannot listen on ", opt.host, ":", opt.port, " (", ec.message(), ")");
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

StoreServer::~StoreServer() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
  });
  impl_->thread.join();
  // A parked wait and its session hold each other: break that, so both go with the io_context.
  for (auto& w : impl_->state.waiters) w->answer = nullptr;
  impl_->state.waiters.clear();
}

uint16_t StoreServer::port() const { return impl_->acceptor.local_endpoint().port(); }
const std::string& StoreServer::host() const { return impl_->host; }
uint64_t StoreServer::refused_connections() const { return impl_->state.refused.load(); }

}  // namespace tg::dist
