// The store's entry points in a build without it (Boost.Asio or OpenSSL's libcrypto was not found
// at configure time): each says what to install.
#include "distributed/store.h"
#include "tinygrad/error.h"

namespace tg::dist {

namespace {
[[noreturn]] void missing() {
  TG_FAIL("rendezvous store: not built (Boost.Asio or OpenSSL was not found at configure time; install ",
          "libboost-dev and libssl-dev)");
}
}  // namespace

std::string store_token_from_env() { missing(); }
std::string read_token_file(const std::string&) { missing(); }
std::string random_token() { missing(); }
struct StoreServer::Impl {};
StoreServer::StoreServer(const StoreServerOptions&) { missing(); }
StoreServer::~StoreServer() = default;
uint16_t StoreServer::port() const { missing(); }
const std::string& StoreServer::host() const { missing(); }
uint64_t StoreServer::refused_connections() const { missing(); }
struct StoreClient::Impl {};
StoreClient::StoreClient(const StoreClientOptions&) { missing(); }
StoreClient::~StoreClient() = default;
void StoreClient::set(const std::string&, const std::string&) { missing(); }
std::string StoreClient::get(const std::string&, std::optional<Seconds>) { missing(); }
std::optional<std::string> StoreClient::try_get(const std::string&) { missing(); }
void StoreClient::wait(const std::vector<std::string>&, std::optional<Seconds>) { missing(); }
int64_t StoreClient::add(const std::string&, int64_t) { missing(); }
std::string StoreClient::compare_set(const std::string&, const std::string&, const std::string&) { missing(); }
bool StoreClient::remove(const std::string&) { missing(); }
bool built_with_store() { return false; }

}  // namespace tg::dist
