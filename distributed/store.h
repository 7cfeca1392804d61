// The rendezvous store: a small TCP key-value store that the ranks of a job (and the launchers of
// its nodes) meet through before any collective exists. `tg launch` serves it (StoreServer, on
// Boost.Asio, one thread); ranks and launchers talk to it through StoreClient. Every connection
// proves that it knows the job's shared token (Note [store authentication] in
// store_protocol.h) and every wait has a deadline whose error names the keys that never came.
// Built when Boost (Asio) and OpenSSL (libcrypto) are found (TG_WITH_STORE).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace tg::dist {

// The shared token: TG_RDZV_TOKEN, else the contents of the file TG_RDZV_TOKEN_FILE names (which
// must be readable by its owner alone: mode 0600 or 0400). An error names what is missing.
std::string store_token_from_env();
// The token of a file (mode checked as above, surrounding whitespace removed).
std::string read_token_file(const std::string& path);
// A fresh random token (32 random bytes as hex), for a launch whose workers all inherit it.
std::string random_token();

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // the one address it binds (never every address unless asked)
  uint16_t port = 0;               // 0: an ephemeral port (read it back with port())
  std::string token;               // must not be empty
  Seconds handshake_timeout{10.0};  // a client that does not authenticate within it is dropped
};

// Serves the store on its own thread from construction until destruction.
class StoreServer {
 public:
  explicit StoreServer(const StoreServerOptions& opt);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  uint16_t port() const;
  const std::string& host() const;
  // Connections dropped so far for a failed handshake or a bad frame (for tests and logs).
  uint64_t refused_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;
  std::string prefix;               // every key is prefix + "/" + key (the run id); "" for none
  Seconds connect_timeout{60.0};    // retry connecting (with backoff) until then
  Seconds timeout{300.0};           // default deadline of wait and get
};

// One authenticated connection. Calls are blocking and not thread-safe (one caller at a time).
class StoreClient {
 public:
  explicit StoreClient(const StoreClientOptions& opt);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // The value, once the key exists (waits up to timeout, default the client's).
  std::string get(const std::string& key, std::optional<Seconds> timeout = std::nullopt);
  // The value now, or nothing.
  std::optional<std::string> try_get(const std::string& key);
  // Returns once every key exists; after the timeout an error names the keys still missing.
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt);
  // Adds delta to the key's integer value (a missing key counts as 0) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // Sets the key to `desired` when its value is `expected` (or when it is missing and `expected`
  // is ""); returns the value after the call either way.
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  // Removes the key; true when it existed.
  bool remove(const std::string& key);

  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

// "HOST:PORT" split (PORT 1-65535), or an error naming `what` and the text.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& text, const std::string& what);

// True when this build has the store (Boost.Asio and OpenSSL were found at configure time).
bool built_with_store();

}  // namespace tg::dist
