// Shared helpers of the process-group backends: dtype checks and host reductions.
#include "distributed/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tinygrad/error.h"
#ifdef TG_WITH_MPI
#include "distributed/mpi_backend.h"
#endif
#include "distributed/bootstrap.h"
#ifdef TG_WITH_GLOO
#include "distributed/gloo_backend.h"
#endif
#include "distributed/rendezvous.h"
#include "distributed/store.h"
#ifdef TG_WITH_NCCL
#include "distributed/nccl_backend.h"
#endif
#include "tinygrad/device.h"

namespace tg::dist {

namespace {

class FinishedWork : public Work {
 public:
  bool test() override { return true; }
  void wait(std::optional<Seconds>) override {}
};

template <class T>
void reduce_typed(T* d, const T* s, size_t n, ReduceOp op) {
  if (op == ReduceOp::Max)
    for (size_t i = 0; i < n; i++) d[i] = std::max(d[i], s[i]);
  else
    for (size_t i = 0; i < n; i++) d[i] += s[i];
}

template <class T>
void scale_typed(T* d, size_t n, int k) {
  for (size_t i = 0; i < n; i++) d[i] = static_cast<T>(d[i] / static_cast<T>(k));
}

// Half types (float16, bfloat16) as 16-bit words: each value is widened to float32, combined,
// and rounded back, as NCCL does.
template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void reduce_half(uint16_t* d, const uint16_t* s, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; i++) {
    float a = widen(d[i]), b = widen(s[i]);
    d[i] = narrow(op == ReduceOp::Max ? std::max(a, b) : a + b);
  }
}

template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void scale_half(uint16_t* d, size_t n, int k) {
  for (size_t i = 0; i < n; i++) d[i] = narrow(widen(d[i]) / static_cast<float>(k));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The first number of a Slurm tasks-per-node list ("2(x3),1" -> 2).
int first_count(const char* list) { return list && *list ? std::atoi(list) : 1; }

}  // namespace

Launcher detected_launcher() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return Launcher::Mpirun;
  if (std::getenv("TG_WORLD_SIZE")) return Launcher::TgLaunch;
  if (std::getenv("SLURM_PROCID") && (std::getenv("SLURM_STEP_NUM_TASKS") || std::getenv("SLURM_NTASKS")))
    return Launcher::Slurm;
  return Launcher::None;
}

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::Mpirun: return "mpirun";
    case Launcher::TgLaunch: return "tg launch";
    case Launcher::Slurm: return "srun";
    case Launcher::None: break;
  }
  return "no launcher";
}

bool launched_by_mpirun() { return detected_launcher() == Launcher::Mpirun; }

int env_rank() {
  switch (detected_launcher()) {
    case Launcher::Mpirun: return env_int("OMPI_COMM_WORLD_RANK", 0);
    case Launcher::TgLaunch: return env_int("TG_RANK", 0);
    case Launcher::Slurm: return env_int("SLURM_PROCID", 0);
    case Launcher::None: break;
  }
  return 0;
}

int env_world_size() {
  switch (detected_launcher()) {
    case Launcher::Mpirun: return env_int("OMPI_COMM_WORLD_SIZE", 1);
    case Launcher::TgLaunch: return env_int("TG_WORLD_SIZE", 1);
    case Launcher::Slurm: return env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 1));
    case Launcher::None: break;
  }
  return 1;
}

std::unique_ptr<ProcessGroup> world_group() {
#ifdef TG_WITH_MPI
  return mpi_world_group();
#else
  throw Error("distributed: this build has no mpi backend (MPI was not found at configure time; install libopenmpi-dev)");
#endif
}

std::vector<std::string> built_backends() {
  std::vector<std::string> b{"local"};
  if (built_with_mpi()) b.push_back("mpi");
#ifdef TG_WITH_NCCL
  b.push_back("nccl");
#endif
#ifdef TG_WITH_GLOO
  b.push_back("gloo");
#endif
  return b;
}

#ifndef TG_WITH_NCCL
std::string nccl_status() { return "not built (nccl.h was not found at configure time)"; }
#endif

std::unique_ptr<ProcessGroup> world_group_for(const std::string& backend, const std::string& device, Seconds timeout,
                                              int store_port) {
  const bool gpu = canonical_device(device).rfind("CUDA", 0) == 0;
  const Launcher launcher = detected_launcher();
  const bool under_mpirun = launcher == Launcher::Mpirun;
  const std::string chosen = backend == "auto" ? (gpu ? "nccl" : under_mpirun ? "mpi" : "gloo") : backend;
  TG_CHECK(chosen == "mpi" || chosen == "nccl" || chosen == "gloo", "distributed.backend: '", backend,
           "' is not one of auto, mpi, nccl, gloo");
  const std::string how =
      backend == "auto" ? std::string(" (auto, for device ") + device + " under " + launcher_name(launcher) + ")" : "";
  if (chosen == "nccl") {
    TG_CHECK(gpu, "distributed.backend=nccl: nccl runs collectives on CUDA devices, not on ", device,
             "; use distributed.backend=mpi (under mpirun) or gloo");
#ifdef TG_WITH_NCCL
    std::string why = nccl_status();
    TG_CHECK(why.rfind("unavailable: ", 0) != 0, "distributed.backend=nccl", how, ": NCCL is ", why);
    try {
      get_device(device);
    } catch (const Error& e) {
      throw Error("distributed.backend=nccl" + how + ": " + e.what());
    }
    if (!under_mpirun) {  // the unique id through the rendezvous store (tg launch, srun)
      auto boot = store_bootstrap(job_store(timeout, store_port), env_rank(), env_world_size(), timeout);
      std::unique_ptr<ProcessGroup> watch;  // arrival notices through a gloo group, where built
#ifdef TG_WITH_GLOO
      auto store = job_store(timeout, store_port);
      const auto [host, port] = parse_endpoint(store->endpoint(), "the rendezvous store");
      watch = gloo_group(std::move(store), env_rank(), env_world_size(), timeout, address_towards(host, port));
#endif
      return nccl_group(*boot, device, timeout, std::move(watch));
    }
    auto host = world_group();  // carries the unique id, then the arrival notices
    host->set_timeout(timeout);
    auto boot = group_bootstrap(*host);
    return nccl_group(*boot, device, timeout, std::move(host));
#else
    TG_FAIL("distributed.backend=nccl", how, ": ", nccl_status());
#endif
  }
  TG_CHECK(!gpu, "distributed.backend=", chosen, ": the ", chosen, " backend runs collectives on host memory, not on ",
           device, "; use train.device=CPU or distributed.backend=nccl");
  if (chosen == "gloo") {
#ifdef TG_WITH_GLOO
    auto store = job_store(timeout, store_port);
    const auto [host, port] = parse_endpoint(store->endpoint(), "the rendezvous store");
    return gloo_group(std::move(store), env_rank(), env_world_size(), timeout, address_towards(host, port));
#else
    TG_FAIL("distributed.backend=gloo", how, ": the gloo backend (CPU collectives without MPI) is not built (Gloo ",
            "was not found at configure time: install libgloo-dev); run CPU data parallelism under mpirun -np N ",
            "(distributed.backend=mpi), or on CUDA devices (nccl)");
#endif
  }
  TG_CHECK(under_mpirun || launcher == Launcher::None, "distributed.backend=mpi: this process was started by ",
           launcher_name(launcher), ", not by mpirun; the mpi backend needs mpirun -np N tg train ...");
  auto g = world_group();
  g->set_timeout(timeout);
  return g;
}

LocalRanks env_local_ranks() {
  switch (detected_launcher()) {
    case Launcher::Mpirun:
      return LocalRanks{env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0), env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)};
    case Launcher::TgLaunch: return LocalRanks{env_int("TG_LOCAL_RANK", 0), env_int("TG_LOCAL_WORLD_SIZE", 1)};
    case Launcher::Slurm: {
      const char* per_node = std::getenv("SLURM_NTASKS_PER_NODE");
      if (!per_node || !*per_node) per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE");
      if (!per_node || !*per_node) per_node = std::getenv("SLURM_TASKS_PER_NODE");
      return LocalRanks{env_int("SLURM_LOCALID", 0), first_count(per_node)};
    }
    case Launcher::None: break;
  }
  return LocalRanks{};
}

std::string rank_device(const std::string& device, LocalRanks local, int gpus_on_node) {
  std::string d = canonical_device(device);
  if (d != "CUDA" || device.find(':') != std::string::npos) return d;  // the CPU, or an index the user gave
  TG_CHECK(local.size <= gpus_on_node, "train.device=", device, ": ", local.size, " ranks on this node but ",
           gpus_on_node, " CUDA device(s); start at most one rank per GPU");
  return local.rank == 0 ? d : d + ":" + std::to_string(local.rank);
}

std::pair<std::string, uint16_t> parse_endpoint(const std::string& text, const std::string& what) {
  const size_t colon = text.rfind(':');
  TG_CHECK(colon != std::string::npos && colon > 0, what, ": expected HOST:PORT, got '", text, "'");
  const std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  TG_CHECK(!port_text.empty() && *end == '\0' && port >= 1 && port <= 65535, what, ": the port of '", text,
           "' is not a number from 1 to 65535");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(port)};
}

bool built_with_mpi() {
#ifdef TG_WITH_MPI
  return true;
#else
  return false;
#endif
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::shared_ptr<Work> finished_work() { return std::make_shared<FinishedWork>(); }

std::shared_ptr<Work> ProcessGroup::all_reduce_into(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  TG_ASSERT(memory_device().empty(), backend(), " must implement all_reduce_into for device memory");
  if (in != out) std::memcpy(out, in, count * itemsize(dtype));
  return all_reduce(out, count, dtype, op);
}

void check_collective_dtype(const char* what, DType dtype) {
  TG_CHECK(dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Int32 || dtype == DType::Int64 ||
               dtype == DType::Float16 || dtype == DType::BFloat16,
           what, ": dtype ", dtype_name(dtype), " is not supported (float32, float64, int32, int64, float16, bfloat16)");
}

void check_peer(const char* what, int peer, int rank, int size) {
  TG_CHECK(peer >= 0 && peer < size && peer != rank, what, ": peer ", peer, " is not another rank of a group of ", size,
           " (this is rank ", rank, ")");
}

void reduce_into(void* dst, const void* src, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: reduce_typed(static_cast<float*>(dst), static_cast<const float*>(src), n, op); break;
    case DType::Float64: reduce_typed(static_cast<double*>(dst), static_cast<const double*>(src), n, op); break;
    case DType::Int32: reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op); break;
    case DType::Int64: reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op); break;
    case DType::Float16:
      reduce_half<half_to_float, float_to_half>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, op);
      break;
    case DType::BFloat16:
      reduce_half<bfloat_to_float, float_to_bfloat>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                                                    op);
      break;
    default: check_collective_dtype("reduce", dtype);
  }
}

void scale_down(void* data, size_t n, DType dtype, int k) {
  switch (dtype) {
    case DType::Float32: scale_typed(static_cast<float*>(data), n, k); break;
    case DType::Float64: scale_typed(static_cast<double*>(data), n, k); break;
    case DType::Int32: scale_typed(static_cast<int32_t*>(data), n, k); break;
    case DType::Int64: scale_typed(static_cast<int64_t*>(data), n, k); break;
    case DType::Float16: scale_half<half_to_float, float_to_half>(static_cast<uint16_t*>(data), n, k); break;
    case DType::BFloat16: scale_half<bfloat_to_float, float_to_bfloat>(static_cast<uint16_t*>(data), n, k); break;
    default: check_collective_dtype("avg", dtype);
  }
}

}  // namespace tg::dist
