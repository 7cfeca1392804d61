// Shared helpers of the process-group backends: dtype checks and host reductions.
#include "distributed/process_group.h"

#include <algorithm>
#include <cstdlib>

#include "tinygrad/error.h"
#ifdef TG_WITH_MPI
#include "distributed/mpi_backend.h"
#endif

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

}  // namespace

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }
int env_rank() { return env_int("OMPI_COMM_WORLD_RANK", 0); }
int env_world_size() { return env_int("OMPI_COMM_WORLD_SIZE", 1); }

std::unique_ptr<ProcessGroup> world_group() {
#ifdef TG_WITH_MPI
  return mpi_world_group();
#else
  throw Error("distributed: this build has no mpi backend (MPI was not found at configure time; install libopenmpi-dev)");
#endif
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

void check_collective_dtype(const char* what, DType dtype) {
  TG_CHECK(dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Int32 || dtype == DType::Int64 ||
               dtype == DType::Float16 || dtype == DType::BFloat16,
           what, ": dtype ", dtype_name(dtype), " is not supported (float32, float64, int32, int64, float16, bfloat16)");
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
