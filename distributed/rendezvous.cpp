// The job's store from the environment and the store bootstrap (rendezvous.h).
#include "distributed/rendezvous.h"

#include <netdb.h>
#include <arpa/inet.h>

#include <cstdlib>
#include <cstring>

#include "tinygrad/error.h"

namespace tg::dist {

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

std::string resolve_ipv4(const std::string& host) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  TG_CHECK(rc == 0 && found, "rendezvous store: cannot resolve '", host, "' (", gai_strerror(rc), ")");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(found);
  return text;
}

namespace {

std::unique_ptr<StoreClient> slurm_store(Seconds timeout, int port_given) {
  const std::string nodes = env_or("SLURM_STEP_NODELIST", env_or("SLURM_JOB_NODELIST", ""));
  TG_CHECK(!nodes.empty(), "rendezvous store under srun: SLURM_JOB_NODELIST is not set");
  StoreClientOptions o;
  o.host = first_slurm_node(nodes);
  const std::string port =
      port_given > 0 ? std::to_string(port_given) : env_or("TG_RDZV_PORT", env_or("MASTER_PORT", "29500"));
  o.port = parse_endpoint(o.host + ":" + port, "TG_RDZV_PORT").second;
  o.token = store_token_from_env();
  o.prefix = "slurm-" + env_or("SLURM_JOB_ID", "0") + "." + env_or("SLURM_STEP_ID", "0");
  o.connect_timeout = o.timeout = timeout;
  if (env_rank() == 0) {
    static std::unique_ptr<StoreServer> served;  // for the life of the process
    StoreServerOptions so;
    so.host = resolve_ipv4(o.host);
    so.port = o.port;
    so.token = o.token;
    if (!served) served = std::make_unique<StoreServer>(so);
  }
  return std::make_unique<StoreClient>(o);
}

class StoreBootstrap : public Bootstrap {
 public:
  StoreBootstrap(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(void* bytes, size_t n, int root) override {
    const std::string key = "bootstrap/" + std::to_string(count_++);
    if (rank_ == root) {
      store_->set(key, std::string(static_cast<const char*>(bytes), n));
      return;
    }
    std::string value;
    try {
      value = store_->get(key, timeout_);
    } catch (const Error& e) {
      TG_FAIL("bootstrap: rank ", root, " never published its id (", e.what(), ")");
    }
    TG_CHECK(value.size() == n, "bootstrap: rank ", root, " published ", value.size(), " bytes, rank ", rank_,
             " expected ", n);
    std::memcpy(bytes, value.data(), n);
  }

 private:
  std::unique_ptr<StoreClient> store_;
  int rank_, size_;
  Seconds timeout_;
  uint64_t count_ = 0;
};

}  // namespace

std::unique_ptr<StoreClient> job_store(Seconds timeout, int slurm_port) {
  switch (detected_launcher()) {
    case Launcher::TgLaunch: {
      const std::string at = env_or("TG_RDZV_ENDPOINT", "");
      TG_CHECK(!at.empty(), "rendezvous store: tg launch gave no TG_RDZV_ENDPOINT (a build without the store?)");
      StoreClientOptions o;
      std::tie(o.host, o.port) = parse_endpoint(at, "TG_RDZV_ENDPOINT");
      o.token = store_token_from_env();
      o.prefix = env_or("TG_RDZV_RUN_ID", "tg");
      o.connect_timeout = o.timeout = timeout;
      return std::make_unique<StoreClient>(o);
    }
    case Launcher::Slurm: return slurm_store(timeout, slurm_port);
    default: TG_FAIL("rendezvous store: this process was not started by tg launch or srun");
  }
}

std::unique_ptr<Bootstrap> store_bootstrap(std::unique_ptr<StoreClient> store, int rank, int size, Seconds timeout) {
  return std::make_unique<StoreBootstrap>(std::move(store), rank, size, timeout);
}

std::string first_slurm_node(const std::string& list) {
  const size_t comma = list.find(','), bracket = list.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return list.substr(0, comma);
  const std::string prefix = list.substr(0, bracket);
  const size_t end = list.find_first_of("-,]", bracket + 1);
  TG_CHECK(end != std::string::npos, "Slurm node list '", list, "' has an unclosed '['");
  return prefix + list.substr(bracket + 1, end - bracket - 1);
}

}  // namespace tg::dist
