// `tg launch` (launch.h): the rendezvous of the nodes through the store, the worker processes
// (fork/exec, one process group each, output through pipes), the monitor loop that stops the
// group on the first failure or on a signal, and the restarts.
#include "launcher/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <climits>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "distributed/store.h"
#include "launcher/log.h"
#include "launcher/trainer.h"
#include "tinygrad/error.h"

extern char** environ;

namespace tg::launcher {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* LAUNCH_USAGE =
    "usage: tg launch --nproc-per-node N [--nnodes M --node-rank K --rdzv HOST:PORT] [--max-restarts R]\n"
    "                 [--run-id ID] [--grace-s S] [--rdzv-timeout-s S] -- CMD ARGS...\n";

namespace {

constexpr size_t LAST_LINES = 10;  // of a failed rank, in the report

// ---- arguments -------------------------------------------------------------------------------

int whole_number(const std::string& flag, const std::string& text, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TG_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && v >= lo && v <= hi,
           "tg launch: ", flag, " must be a whole number from ", lo, " to ", hi, ", got '", text, "'");
  return v;
}

double seconds_value(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  TG_CHECK(!text.empty() && *end == '\0' && v > 0 && v <= 86400, "tg launch: ", flag,
           " must be a number of seconds above 0, got '", text, "'");
  return v;
}

// ---- the environment of a worker -------------------------------------------------------------

struct Rendezvous {
  std::string host;  // MASTER_ADDR: the store's address ("" when the build has no store)
  uint16_t port = 0;
  std::string token;
  std::unique_ptr<dist::StoreServer> server;  // node 0
  std::unique_ptr<dist::StoreClient> client;  // every node of a multi-node job
};

// The variables every worker sees on top of the launcher's own environment.
std::vector<std::pair<std::string, std::string>> worker_variables(const LaunchOptions& o, const Rendezvous& rdzv,
                                                                  int local_rank, int attempt) {
  const std::string rank = std::to_string(o.node_rank * o.nproc_per_node + local_rank);
  const std::string world = std::to_string(o.nnodes * o.nproc_per_node);
  const std::string local = std::to_string(local_rank), local_world = std::to_string(o.nproc_per_node);
  std::vector<std::pair<std::string, std::string>> v = {
      {"TG_RANK", rank}, {"TG_WORLD_SIZE", world}, {"TG_LOCAL_RANK", local}, {"TG_LOCAL_WORLD_SIZE", local_world},
      {"TG_NODE_RANK", std::to_string(o.node_rank)}, {"TG_NNODES", std::to_string(o.nnodes)},
      {"RANK", rank}, {"WORLD_SIZE", world}, {"LOCAL_RANK", local}, {"LOCAL_WORLD_SIZE", local_world},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"TG_RESTART_COUNT", std::to_string(attempt)}, {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)}};
  if (!rdzv.host.empty()) {
    const std::string port = std::to_string(rdzv.port);
    v.insert(v.end(), {{"MASTER_ADDR", rdzv.host}, {"MASTER_PORT", port},
                       {"TG_RDZV_ENDPOINT", rdzv.host + ":" + port}, {"TG_RDZV_TOKEN", rdzv.token},
                       {"TG_RDZV_RUN_ID", o.run_id + "/attempt" + std::to_string(attempt)}});
  }
  return v;
}

std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = name == "TG_RDZV_TOKEN_FILE";  // the worker gets the token itself
    for (const auto& [k, _] : vars) replaced = replaced || k == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

// ---- signals ---------------------------------------------------------------------------------

// Note [signals of the launcher]: SIGINT and SIGTERM are written to a self-pipe that the monitor
// loop polls beside the workers' output, so the loop (not a handler) forwards them: the same
// signal to every worker's process group, then SIGKILL after the grace period. Each worker runs
// in a process group of its own (so that a Ctrl-C in the terminal reaches the launcher alone, and
// the launcher's kill(-pgid) reaches whatever the worker started, e.g. under `sh -c`), and asks
// the kernel for SIGKILL when the launcher dies (PR_SET_PDEATHSIG), so that even a launcher
// killed with -9 leaves no worker behind.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const unsigned char c = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

class SignalForwarding {
 public:
  SignalForwarding() {
    TG_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "tg launch: pipe2 failed: ", strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &sa, &old_[sig == SIGINT ? 0 : 1]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old_pipe_);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_[0], nullptr);
    ::sigaction(SIGTERM, &old_[1], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  int fd() const { return g_signal_pipe[0]; }
  // The signal received since the last call (0: none).
  int received() {
    unsigned char c = 0;
    int sig = 0;
    while (::read(g_signal_pipe[0], &c, 1) == 1) sig = c;
    return sig;
  }

 private:
  struct sigaction old_[2], old_pipe_;
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string how_it_ended(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by " + signal_name(WTERMSIG(status)) + " (signal " + std::to_string(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

void say(const std::string& line) { log_note("tg launch: " + line); }

// ---- workers ---------------------------------------------------------------------------------

struct Stream {
  int fd = -1;
  int to = 1;  // the launcher's fd its lines go to
  std::string partial;
};

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
  std::deque<std::string> last;  // its last lines, stdout and stderr together

  void line(const Stream& s, const std::string& text) {
    write_all(s.to, "[rank " + std::to_string(rank) + "] " + text + "\n");
    last.push_back(text);
    if (last.size() > LAST_LINES) last.pop_front();
  }
  // Reads what the stream has; false at its end.
  bool pump(Stream& s) {
    char buf[4096];
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {
      if (!s.partial.empty()) line(s, s.partial);
      s.partial.clear();
      ::close(s.fd);
      s.fd = -1;
      return false;
    }
    s.partial.append(buf, size_t(n));
    for (size_t nl; (nl = s.partial.find('\n')) != std::string::npos; s.partial.erase(0, nl + 1))
      line(s, s.partial.substr(0, nl));
    return true;
  }
  void signal_group(int sig) const {
    if (pid > 0) ::kill(-pid, sig);
  }
};

std::string self_executable() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tg") : p.string();
}

// Starts one worker: its own process group, stdout and stderr into pipes, SIGKILL when the
// launcher dies (Note [signals of the launcher]).
void spawn(Worker& w, const std::vector<std::string>& command, const std::vector<std::string>& env) {
  int out[2], err[2];
  TG_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, "tg launch: pipe2 failed: ",
           strerror(errno));
  std::vector<std::string> args = command;
  if (args[0] == "tg") args[0] = self_executable();  // the same tg as the launcher's
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  TG_CHECK(pid >= 0, "tg launch: fork failed: ", strerror(errno));
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char* msg = "tg launch: cannot run the worker's command: ";
    [[maybe_unused]] ssize_t n = ::write(2, msg, strlen(msg));
    n = ::write(2, argv[0], strlen(argv[0]));
    n = ::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that signals sent right away reach the group
  ::close(out[1]);
  ::close(err[1]);
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  w.pid = pid;
  w.running = true;
  w.out = Stream{out[0], 1, ""};
  w.err = Stream{err[0], 2, ""};
}

// How one attempt of the group ended.
struct Outcome {
  enum Kind { Succeeded, WorkerFailed, PeerFailed, Interrupted } kind = Succeeded;
  int rank = -1;      // WorkerFailed: the first rank that failed
  int status = 0;     // its wait status
  int signal = 0;     // Interrupted: the signal the launcher got
  std::string peer;   // PeerFailed: what the other node reported
};

// Note [the monitor loop]: one poll over the signal pipe and every worker's stdout and stderr,
// woken at least every 100 ms to reap exited workers. The first worker that ends with a non-zero
// code or a signal starts the stop (as does a signal to the launcher, or another node's failure
// read from the store every 500 ms): the signal goes to every worker's process group, and after
// the grace period SIGKILL. Once every worker has ended, SIGKILL goes to their process groups
// once more (whatever they started and left behind), and their pipes are read to the end (for
// at most a second, should something have escaped its group still holding a pipe).
class Group {
 public:
  Group(const LaunchOptions& o, Rendezvous& rdzv, int attempt, SignalForwarding& signals)
      : o_(o), rdzv_(rdzv), attempt_(attempt), signals_(signals) {}

  Outcome run() {
    workers_.resize(size_t(o_.nproc_per_node));
    for (int l = 0; l < o_.nproc_per_node; l++) {
      Worker& w = workers_[size_t(l)];
      w.local_rank = l;
      w.rank = o_.node_rank * o_.nproc_per_node + l;
      spawn(w, o_.command, environment_with(worker_variables(o_, rdzv_, l, attempt_)));
    }
    monitor();
    return outcome_;
  }

  const Worker& worker_of_rank(int rank) const {
    return workers_[size_t(rank - o_.node_rank * o_.nproc_per_node)];
  }

 private:
  void monitor() {
    auto last_peer_check = Clock::now();
    std::optional<Clock::time_point> all_ended;
    for (;;) {
      pump_output(100);
      if (int sig = signals_.received()) {
        if (stopping_ && !killed_) stop_deadline_ = Clock::now();  // a second signal: SIGKILL now
        begin_stop(Outcome{Outcome::Interrupted, -1, 0, sig, ""}, sig);
      }
      reap();
      if (rdzv_.client && !stopping_ && Clock::now() - last_peer_check > std::chrono::milliseconds(500)) {
        last_peer_check = Clock::now();
        check_peers();
      }
      if (stopping_ && !killed_ && Clock::now() > stop_deadline_) {
        for (auto& w : workers_) w.signal_group(SIGKILL);
        killed_ = true;
      }
      if (any_running()) continue;
      if (!all_ended) {
        all_ended = Clock::now();
        for (auto& w : workers_) w.signal_group(SIGKILL);
      }
      if (!any_stream_open() || Clock::now() - *all_ended > std::chrono::seconds(1)) break;
    }
    for (auto& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) ::close(s->fd);
  }

  void pump_output(int timeout_ms) {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<std::pair<Worker*, Stream*>> owners{{nullptr, nullptr}};
    for (auto& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({&w, s});
        }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    for (size_t i = 1; i < fds.size(); i++)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) owners[i].first->pump(*owners[i].second);
  }

  void reap() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.running = false;
      w.status = status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping_) {
        say("rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ", pid " +
            std::to_string(w.pid) + ") " + how_it_ended(status) + "; stopping the other workers");
        report_to_peers(w);
        begin_stop(Outcome{Outcome::WorkerFailed, w.rank, status, 0, ""}, SIGTERM);
      }
    }
  }

  void begin_stop(const Outcome& why, int sig) {
    if (stopping_) return;
    stopping_ = true;
    outcome_ = why;
    stop_deadline_ = Clock::now() + std::chrono::milliseconds(int64_t(o_.grace_s * 1000));
    for (auto& w : workers_)
      if (w.running) w.signal_group(sig);
  }

  std::string failed_key() const { return "attempt" + std::to_string(attempt_) + "/failed"; }

  void report_to_peers(const Worker& w) {
    if (!rdzv_.client) return;
    try {
      rdzv_.client->compare_set(failed_key(), "", "rank " + std::to_string(w.rank) + " on node " +
                                                      std::to_string(o_.node_rank) + " " + how_it_ended(w.status));
    } catch (const std::exception& e) {
      say(std::string("cannot tell the other nodes: ") + e.what());
    }
  }

  void check_peers() {
    std::optional<std::string> failed;
    try {
      failed = rdzv_.client->try_get(failed_key());
    } catch (const std::exception& e) {
      failed = std::string("the rendezvous store is gone (") + e.what() + ")";
    }
    if (!failed) return;
    say("another node failed: " + *failed + "; stopping the workers of node " + std::to_string(o_.node_rank));
    begin_stop(Outcome{Outcome::PeerFailed, -1, 0, 0, *failed}, SIGTERM);
  }

  bool any_running() const {
    for (const auto& w : workers_)
      if (w.running) return true;
    return false;
  }
  bool any_stream_open() const {
    for (const auto& w : workers_)
      if (w.out.fd >= 0 || w.err.fd >= 0) return true;
    return false;
  }

  const LaunchOptions& o_;
  Rendezvous& rdzv_;
  int attempt_;
  SignalForwarding& signals_;
  std::vector<Worker> workers_;
  Outcome outcome_;
  bool stopping_ = false, killed_ = false;
  Clock::time_point stop_deadline_;
};

// ---- the store and the nodes' rendezvous ------------------------------------------------------

Rendezvous open_rendezvous(const LaunchOptions& o) {
  Rendezvous r;
  if (o.nnodes == 1 && !dist::built_with_store()) return r;  // workers then get no store variables
  if (o.nnodes == 1) {
    // One node: the store on the loopback address, with a token no other user can know.
    r.token = dist::random_token();
    dist::StoreServerOptions so;
    so.host = "127.0.0.1";
    if (!o.rdzv.empty()) so.port = dist::parse_endpoint(o.rdzv, "--rdzv").second;
    so.token = r.token;
    r.server = std::make_unique<dist::StoreServer>(so);
    r.host = so.host;
    r.port = r.server->port();
    return r;
  }
  std::tie(r.host, r.port) = dist::parse_endpoint(o.rdzv, "--rdzv");
  r.token = dist::store_token_from_env();  // every node holds the same one
  if (o.node_rank == 0) {
    dist::StoreServerOptions so;
    so.host = dist::resolve_ipv4(r.host);  // the one address node 0 listens on
    so.port = r.port;
    so.token = r.token;
    r.server = std::make_unique<dist::StoreServer>(so);
  }
  dist::StoreClientOptions co;
  co.host = r.host;
  co.port = r.port;
  co.token = r.token;
  co.prefix = o.run_id;
  co.connect_timeout = dist::Seconds(o.rdzv_timeout_s);
  co.timeout = dist::Seconds(o.rdzv_timeout_s);
  r.client = std::make_unique<dist::StoreClient>(co);
  return r;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::vector<std::string> node_keys(const std::string& what, int attempt, int nnodes) {
  std::vector<std::string> keys;
  for (int k = 0; k < nnodes; k++) keys.push_back("attempt" + std::to_string(attempt) + "/" + what + "/" + std::to_string(k));
  return keys;
}

// Every node's launcher registers for this attempt and waits for the others (a multi-node job).
void join_nodes(const LaunchOptions& o, Rendezvous& r, int attempt) {
  if (!r.client) return;
  const std::string mine = "attempt" + std::to_string(attempt) + "/node/" + std::to_string(o.node_rank);
  TG_CHECK(r.client->compare_set(mine, "", hostname()) == hostname(), "tg launch: node rank ", o.node_rank,
           " has already joined run '", o.run_id, "' (two nodes with one --node-rank?)");
  r.client->set("attempt" + std::to_string(attempt) + "/nproc/" + std::to_string(o.node_rank),
                std::to_string(o.nproc_per_node));
  try {
    r.client->wait(node_keys("node", attempt, o.nnodes));
  } catch (const Error& e) {
    TG_FAIL("tg launch: the nodes did not all join (", e.what(), ")");
  }
  for (int k = 0; k < o.nnodes; k++) {
    const std::string theirs = r.client->get("attempt" + std::to_string(attempt) + "/nproc/" + std::to_string(k));
    TG_CHECK(theirs == std::to_string(o.nproc_per_node), "tg launch: node ", k, " runs --nproc-per-node ", theirs,
             " but node ", o.node_rank, " runs ", o.nproc_per_node, "; every node must run the same number");
  }
}

// Node 0 serves the store until every node has finished the attempt.
void leave_nodes(const LaunchOptions& o, Rendezvous& r, int attempt) {
  if (!r.client) return;
  try {
    r.client->set("attempt" + std::to_string(attempt) + "/done/" + std::to_string(o.node_rank), "1");
    if (o.node_rank == 0) r.client->wait(node_keys("done", attempt, o.nnodes));
  } catch (const std::exception& e) {
    say(std::string("the nodes did not all finish together: ") + e.what());
  }
}

void report_failure(const Group& g, const Outcome& out) {
  const Worker& w = g.worker_of_rank(out.rank);
  if (w.last.empty()) {
    say("rank " + std::to_string(out.rank) + " printed nothing");
    return;
  }
  std::string text = "the last lines of rank " + std::to_string(out.rank) + ":";
  for (const auto& l : w.last) text += "\n  " + l;
  say(text);
}

}  // namespace

LaunchOptions parse_launch_args(int argc, char** argv, int first) {
  LaunchOptions o;
  int i = first;
  auto value = [&](const std::string& arg, const std::string& flag, std::string& out) {
    if (arg == flag) {
      TG_CHECK(i + 1 < argc, "tg launch: ", flag, " needs a value\n", LAUNCH_USAGE);
      out = argv[++i];
      return true;
    }
    if (arg.rfind(flag + "=", 0) == 0) {
      out = arg.substr(flag.size() + 1);
      return true;
    }
    return false;
  };
  for (; i < argc; i++) {
    const std::string a = argv[i];
    std::string v;
    if (a == "--") {
      i++;
      break;
    }
    if (a.rfind("-", 0) != 0) break;  // the command starts
    if (value(a, "--nproc-per-node", v)) o.nproc_per_node = whole_number("--nproc-per-node", v, 1, 1024);
    else if (value(a, "--nnodes", v)) o.nnodes = whole_number("--nnodes", v, 1, 65536);
    else if (value(a, "--node-rank", v)) o.node_rank = whole_number("--node-rank", v, 0, 65535);
    else if (value(a, "--rdzv", v)) o.rdzv = v;
    else if (value(a, "--run-id", v)) o.run_id = v;
    else if (value(a, "--max-restarts", v)) o.max_restarts = whole_number("--max-restarts", v, 0, 1000);
    else if (value(a, "--grace-s", v)) o.grace_s = seconds_value("--grace-s", v);
    else if (value(a, "--rdzv-timeout-s", v)) o.rdzv_timeout_s = seconds_value("--rdzv-timeout-s", v);
    else TG_FAIL("tg launch: unknown option '", a, "'\n", LAUNCH_USAGE);
  }
  for (; i < argc; i++) o.command.push_back(argv[i]);
  TG_CHECK(!o.command.empty(), "tg launch: no command to run (put it after --)\n", LAUNCH_USAGE);
  TG_CHECK(o.node_rank < o.nnodes, "tg launch: --node-rank ", o.node_rank, " is not below --nnodes ", o.nnodes);
  TG_CHECK(o.nnodes == 1 || !o.rdzv.empty(), "tg launch: --nnodes ", o.nnodes,
           " needs --rdzv HOST:PORT (node 0's address, where it serves the rendezvous store)");
  TG_CHECK(!o.run_id.empty() && o.run_id.find('/') == std::string::npos, "tg launch: --run-id must be a non-empty ",
           "name without '/', got '", o.run_id, "'");
  return o;
}

int run_launch(const LaunchOptions& o) {
  SignalForwarding signals;
  Rendezvous rdzv = open_rendezvous(o);
  for (int attempt = 0;; attempt++) {
    join_nodes(o, rdzv, attempt);
    Group group(o, rdzv, attempt, signals);
    const Outcome out = group.run();
    if (out.kind == Outcome::WorkerFailed) report_failure(group, out);
    leave_nodes(o, rdzv, attempt);
    switch (out.kind) {
      case Outcome::Succeeded: return 0;
      case Outcome::Interrupted:
        say("stopped every worker after " + signal_name(out.signal));
        return 128 + out.signal;
      case Outcome::WorkerFailed:
      case Outcome::PeerFailed: break;
    }
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0) say("no restarts left (--max-restarts " + std::to_string(o.max_restarts) + ")");
      return out.kind == Outcome::WorkerFailed ? exit_code_of(out.status) : 1;
    }
    say("restarting the group (restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.max_restarts) +
        ")");
  }
}

int launch_main(int argc, char** argv, int first) {
  if (argc > first && (std::string(argv[first]) == "--help" || std::string(argv[first]) == "-h")) {
    std::cout << LAUNCH_USAGE;
    return 0;
  }
  return run_launch(parse_launch_args(argc, argv, first));
}

void check_strategy_fits_launch(const Config& cfg) {
  const std::string strategy = cfg.get_string("distributed.strategy");
  const dist::Launcher launcher = dist::detected_launcher();
  const int world = dist::env_world_size();
  TG_CHECK(strategy != "none" || world == 1, "distributed.strategy=none, but this process is rank ", dist::env_rank(),
           " of ", world, " started by ", dist::launcher_name(launcher), ": each would train the whole model alone ",
           "and they would race for one run directory; set distributed.strategy=ddp (or zero1) to train together, ",
           "or start a single process");
  TG_CHECK(strategy == "none" || launcher != dist::Launcher::None, "distributed.strategy=", strategy,
           " in a single process that no launcher started: start the ranks with `tg launch --nproc-per-node N -- ",
           "tg train ...` (or mpirun -np N, or srun), or set distributed.strategy=none");
}

Config restarted_config(const Config& cfg) {
  const char* restart = std::getenv("TG_RESTART_COUNT");
  const std::string dir = cfg.get_string("train.run_dir");
  if (!restart || std::atoi(restart) <= 0 || dir.empty() || cfg.get_bool("train.resume")) return cfg;
  Config out = cfg;
  const bool resumable = fs::is_directory(dir) && !latest_checkpoint(dir).empty();
  out.set("train.resume", resumable);
  out.set("train.overwrite", !resumable);
  return out;
}

}  // namespace tg::launcher
