// cuBLASLt loaded with dlopen, and matrix products as Programs on a device's stream.
//
// Note [row-major products in a column-major library]: cuBLASLt's matrices are column-major.
// Our out[i, j] (row-major: stride_col 1, stride_row the leading dimension) is, read
// column-major, out^T with n rows and m columns, and out^T = b^T a^T. So cuBLASLt's A is our b
// (element (j, p)) and its B is our a (element (p, i)). Each is passed as stored: column-major
// with no transpose when its row stride is 1, else transposed when its column stride is 1.
//
// Note [choosing a library algorithm]: cuBLASLt's heuristic ranks its algorithms for a product's
// shapes, types and alignments without running any, and its first choice can be several times
// slower than its fifth (on an H100 the weight gradient of GPT-2's 768 x 768 projection, K =
// 16384, took 0.58 ms with the first). So `init` keeps the heuristic's MATMUL_TUNE best
// candidates, and the product's first launch outside a graph capture times each on the real
// operands (one warm-up, then three runs) and keeps the fastest, as cuBLAS's own autotuning and
// PyTorch's max-autotune do. Running a product again is harmless: beta is 0, so the output is
// written, never accumulated, unless it overlaps an operand, and then the heuristic's first stays.
// A launch inside a capture cannot time anything and records the current choice; the replays of
// a jitted step come after eager runs that chose. Products under a GFLOP keep the heuristic's
// first: they gain microseconds, and their timings are mostly noise. A candidate replaces the
// first only when at least 5% faster. Which algorithm wins can differ between two processes, and
// with it the rounding of the sums; MATMUL_TUNE=1 keeps runs bitwise reproducible.
#include "tinygrad/runtime/cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cuda_api.h"
#include "tinygrad/runtime/cuda_context.h"

namespace tg {

namespace {

#define TG_LT_FUNCS(X)                                                                                     \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtGetVersion)                       \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                 \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)           \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                                       \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)           \
  X(cublasLtMatmulAlgoCapGetAttribute)

#define TG_LT_MEMBER(fn) decltype(&::fn) fn = nullptr;
struct LtApi {
  TG_LT_FUNCS(TG_LT_MEMBER)
  std::string reason;  // why it is unavailable, "" when loaded
};
#undef TG_LT_MEMBER

LtApi load_lt() {
  LtApi api;
  std::vector<std::string> names = {"libcublasLt.so." + std::to_string(CUDA_VERSION / 1000), "libcublasLt.so"};
  if (const char* p = std::getenv("CUDA_PATH"); p && *p) names.push_back(std::string(p) + "/lib64/" + names[0]);
  names.push_back("/usr/local/cuda/lib64/" + names[0]);
  void* lib = nullptr;
  std::string tried;
  for (auto& n : names) {
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    tried += (tried.empty() ? "" : ", ") + n;
  }
  if (!lib) {
    api.reason = "libcublasLt not found (tried " + tried + ")";
    return api;
  }
#define TG_LT_RESOLVE(fn)                                                              \
  if (api.reason.empty()) {                                                            \
    api.fn = reinterpret_cast<decltype(api.fn)>(dlsym(lib, #fn));                      \
    if (!api.fn) api.reason = "libcublasLt lacks " #fn;                               \
  }
  TG_LT_FUNCS(TG_LT_RESOLVE)
#undef TG_LT_RESOLVE
  return api;
}

const LtApi& lt() {
  static LtApi* api = new LtApi(load_lt());  // leaked: used until exit
  return *api;
}

void check_lt(cublasStatus_t r, const char* call, const std::string& where) {
  if (r == CUBLAS_STATUS_SUCCESS) return;
  TG_FAIL(call, " failed: ", lt().cublasLtGetStatusName(r), " [", where, "]", process_rank_label());
}
#define TG_LT(where, fn, ...) check_lt(lt().fn(__VA_ARGS__), #fn, where)

constexpr size_t WORKSPACE_BYTES = size_t{32} << 20;
constexpr double MIN_TUNED_FLOPS = 1e9;  // Note [choosing a library algorithm]

std::optional<cudaDataType_t> lt_type(DType t) {
  switch (t) {
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    case DType::Float32: return CUDA_R_32F;
    default: return std::nullopt;
  }
}

// A rows x cols matrix with element strides, as cuBLASLt takes it (Note [row-major products in a
// column-major library]); size-1 dims take any stride.
struct Stored {
  bool ok = false, transposed = false;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};
Stored stored(int64_t rows, int64_t cols, int64_t stride_r, int64_t stride_c) {
  Stored s;
  if ((stride_r == 1 || rows == 1) && (cols == 1 || stride_c >= rows)) {
    s = {true, false, uint64_t(rows), uint64_t(cols), cols == 1 ? rows : stride_c};
  } else if ((stride_c == 1 || cols == 1) && (rows == 1 || stride_r >= cols)) {
    s = {true, true, uint64_t(cols), uint64_t(rows), rows == 1 ? cols : stride_r};
  }
  return s;
}

// The largest power of two up to 256 (cuMemAlloc's alignment) that divides `bytes`.
uint32_t alignment_of(uint64_t bytes) {
  uint32_t a = 256;
  while (a > 1 && bytes % a) a /= 2;
  return a;
}
// An operand's alignment as a plan assumes it: its offset into a buffer that starts where
// cuMemAlloc puts buffers.
uint32_t alignment(int64_t offset, DType t) { return alignment_of(static_cast<uint64_t>(offset) * itemsize(t)); }
uint32_t pointer_alignment(const void* p) { return alignment_of(reinterpret_cast<uintptr_t>(p)); }

// The byte alignments of cuBLASLt's A (our b), B (our a) and C = D (our out).
struct Alignments {
  uint32_t a = 256, b = 256, out = 256;
  bool operator==(const Alignments&) const = default;
  bool at_least(const Alignments& o) const { return a >= o.a && b >= o.b && out >= o.out; }
};

}  // namespace

bool cublaslt_available() { return lt().reason.empty(); }

std::string cublaslt_description() {
  if (!lt().reason.empty()) return "no cuBLASLt: " + lt().reason;
  size_t v = lt().cublasLtGetVersion();
  return detail::cat("cuBLASLt ", v / 10000, ".", v / 100 % 100, ".", v % 100);
}

struct CublasLt::State {
  std::string device;
  CUstream stream = nullptr;
  MemoryPool& pool;
  std::function<void()> make_current;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

CublasLt::CublasLt(std::string device, CUstream_st* stream, MemoryPool& pool, std::function<void()> make_current)
    : s_(new State{std::move(device), stream, pool, std::move(make_current)}) {}

CublasLt::~CublasLt() {
  if (s_->workspace) s_->pool.free(s_->workspace, WORKSPACE_BYTES);
  if (s_->handle) lt().cublasLtDestroy(s_->handle);
}

namespace {

class LtMatmul : public Program {
 public:
  LtMatmul(const MatmulSpec& spec, cublasLtHandle_t handle, void* workspace, CUstream stream,
           std::function<void()> make_current, std::string where)
      : spec_(spec), handle_(handle), workspace_(workspace), stream_(stream),
        make_current_(std::move(make_current)), where_(std::move(where)) {}
  ~LtMatmul() override {
    for (auto* l : layouts_) lt().cublasLtMatrixLayoutDestroy(l);
    if (desc_) lt().cublasLtMatmulDescDestroy(desc_);
  }

  // Builds the descriptors and asks the heuristic for an algorithm; false when there is none.
  bool init() {
    const MatmulSpec& s = spec_;
    auto ta = lt_type(s.a.dtype), tout = lt_type(s.out.dtype);
    if (!ta || !tout || s.a.dtype != s.b.dtype) return false;
    if (s.a.dtype == DType::Float32 && s.out.dtype != DType::Float32) return false;
    if (s.inputs_bf16 && s.a.dtype != DType::Float32) return false;
    if (s.out.stride_col != 1 && s.n != 1) return false;
    Stored first = stored(s.n, s.k, s.b.stride_col, s.b.stride_row);    // cuBLASLt's A: b^T, (j, p)
    Stored second = stored(s.k, s.m, s.a.stride_col, s.a.stride_row);   // cuBLASLt's B: a^T, (p, i)
    Stored out = stored(s.n, s.m, s.out.stride_col, s.out.stride_row);  // out^T, (j, i)
    if (!first.ok || !second.ok || !out.ok || out.transposed) return false;
    // float32 operands: exact, rounded to tf32 (TF32=1), or to bfloat16 (cast in the kernel)
    cublasComputeType_t compute = s.inputs_bf16                                ? CUBLAS_COMPUTE_32F_FAST_16BF
                                  : s.a.dtype == DType::Float32 && s.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
    TG_LT(where_, cublasLtMatmulDescCreate, &desc_, compute, CUDA_R_32F);
    cublasOperation_t op_a = first.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = second.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    TG_LT(where_, cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
    TG_LT(where_, cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
    if (!set_epilogue()) return false;
    auto layout = [&](const Stored& st, cudaDataType_t t, int64_t batch_stride) {
      cublasLtMatrixLayout_t l = nullptr;
      TG_LT(where_, cublasLtMatrixLayoutCreate, &l, t, st.rows, st.cols, st.ld);
      layouts_.push_back(l);
      if (s.batch > 1) {
        int32_t count = static_cast<int32_t>(s.batch);
        TG_LT(where_, cublasLtMatrixLayoutSetAttribute, l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
        TG_LT(where_, cublasLtMatrixLayoutSetAttribute, l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
              sizeof(batch_stride));
      }
      return l;
    };
    la_ = layout(first, *ta, s.b.stride_batch);
    lb_ = layout(second, *ta, s.a.stride_batch);
    lout_ = layout(out, *tout, s.out.stride_batch);
    assumed_ = {alignment(s.b.offset, s.b.dtype), alignment(s.a.offset, s.a.dtype), alignment(s.out.offset, s.out.dtype)};
    std::vector<cublasLtMatmulAlgo_t> found = heuristic(assumed_, static_cast<int>(std::max<int64_t>(1, knobs::MATMUL_TUNE)));
    if (found.empty()) return false;  // NOT_SUPPORTED: the generated kernel runs
    const double flops = 2.0 * static_cast<double>(s.batch * s.m) * static_cast<double>(s.n * s.k);
    if (flops < MIN_TUNED_FLOPS) found.erase(found.begin() + 1, found.end());
    candidates_ = found;
    algo_ = candidates_[0];
    return true;
  }

  // The heuristic's best algorithms (up to `wanted`) for operands of these alignments, or none.
  std::vector<cublasLtMatmulAlgo_t> heuristic(const Alignments& al, int wanted) const {
    cublasLtMatmulPreference_t pref = nullptr;
    TG_LT(where_, cublasLtMatmulPreferenceCreate, &pref);
    size_t ws = WORKSPACE_BYTES;
    cublasStatus_t r = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                                 sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> minimums[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.out},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.out}};
    for (const auto& [attr, bytes] : minimums)
      if (r == CUBLAS_STATUS_SUCCESS) r = lt().cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes));
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(wanted));
    int found = 0;
    if (r == CUBLAS_STATUS_SUCCESS)
      r = lt().cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, lout_, lout_, pref, wanted, results.data(), &found);
    lt().cublasLtMatmulPreferenceDestroy(pref);
    std::vector<cublasLtMatmulAlgo_t> out;
    if (r == CUBLAS_STATUS_SUCCESS)
      for (int i = 0; i < found; i++) out.push_back(results[static_cast<size_t>(i)].algo);
    return out;
  }

  // Note [operands at any alignment]: a plan's algorithms assume its operands' alignment from
  // their offsets, with every buffer starting where cuMemAlloc puts them (256 bytes). A buffer
  // can also be a view inside another (Note [concatenations stored in place]: a gradient stored
  // into its bucket at a 16-byte offset), so a launch reads its operands' real alignment. Where
  // one is below the plan's, the plan's algorithm still runs when its own minimums (its
  // capabilities) allow the real alignments, so a gradient computed into its bucket rounds as it
  // would in a buffer of its own; otherwise the heuristic's first algorithm for the real
  // alignments runs. Either is decided once per set of alignments and kept.
  const cublasLtMatmulAlgo_t& algorithm_for(const Alignments& real) {
    for (const auto& [al, algo] : by_alignment_)
      if (al == real) return algo;
    if (accepts(algo_, real)) {
      by_alignment_.emplace_back(real, algo_);
    } else {
      std::vector<cublasLtMatmulAlgo_t> found = heuristic(real, 1);
      TG_CHECK(!found.empty(), where_, ": cuBLASLt has no algorithm for operands aligned to ", real.b, ", ", real.a,
               " and ", real.out, " bytes (a, b, out)");
      by_alignment_.emplace_back(real, found[0]);
    }
    return by_alignment_.back().second;
  }

  // Whether `algo` takes operands of these alignments (the minimums among its capabilities).
  static bool accepts(const cublasLtMatmulAlgo_t& algo, const Alignments& al) {
    const std::pair<cublasLtMatmulAlgoCapAttributes_t, uint32_t> have[] = {
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, al.a},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES, al.b},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, al.out},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES, al.out}};
    for (const auto& [attr, bytes] : have) {
      uint32_t needed = 0;
      size_t written = 0;
      if (lt().cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &needed, sizeof(needed), &written) != CUBLAS_STATUS_SUCCESS ||
          bytes < needed)
        return false;
    }
    return true;
  }

  // The fused bias and relu (Note [library matmuls] in device.h); the bias pointer is set per launch.
  bool set_epilogue() {
    const MatmulSpec& s = spec_;
    cublasLtEpilogue_t epi = s.bias ? (s.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                    : (s.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    if (epi == CUBLASLT_EPILOGUE_DEFAULT) return true;
    if (s.bias && (s.bias->stride_batch != 0 || s.bias->stride_row != 0)) return false;
    TG_LT(where_, cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    if (s.bias) {
      cudaDataType_t t = *lt_type(s.bias->dtype);
      TG_LT(where_, cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t));
    }
    return true;
  }

  std::optional<double> launch(const std::vector<void*>& buffers, const std::vector<int64_t>&,
                               const std::vector<int64_t>&, bool wait) override {
    make_current_();
    auto ptr = [&](const MatmulOperand& o) {
      return static_cast<char*>(buffers.at(static_cast<size_t>(o.param))) + o.offset * static_cast<int64_t>(itemsize(o.dtype));
    };
    const float one = 1.0f, zero = 0.0f;
    void* out = ptr(spec_.out);
    if (spec_.bias) {
      void* bias = ptr(*spec_.bias);
      TG_LT(where_, cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
    auto run_with = [&](const cublasLtMatmulAlgo_t& algo) {
      TG_LT(where_, cublasLtMatmul, handle_, desc_, &one, ptr(spec_.b), la_, ptr(spec_.a), lb_, &zero, out, lout_, out,
            lout_, &algo, workspace_, WORKSPACE_BYTES, stream_);
    };
    const Alignments real{pointer_alignment(ptr(spec_.b)), pointer_alignment(ptr(spec_.a)), pointer_alignment(out)};
    const bool as_planned = real.at_least(assumed_);
    auto run = [&] { run_with(as_planned ? algo_ : algorithm_for(real)); };
    if (as_planned && candidates_.size() > 1 && !capturing()) choose_algorithm(run_with, buffers);
    if (!wait) {
      run();
      return std::nullopt;
    }
    return cuda::timed_on_stream(stream_, where_, run);
  }

 private:
  MatmulSpec spec_;
  cublasLtHandle_t handle_;
  void* workspace_;
  CUstream stream_;
  std::function<void()> make_current_;
  std::string where_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lout_ = nullptr;
  std::vector<cublasLtMatrixLayout_t> layouts_;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulAlgo_t> candidates_;  // the heuristic's, best first; emptied once chosen
  Alignments assumed_;                            // the operands' alignment that algo_ was chosen for
  std::vector<std::pair<Alignments, cublasLtMatmulAlgo_t>> by_alignment_;  // Note [operands at any alignment]

  bool capturing() const {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    TG_CU(where_, cuStreamIsCapturing, stream_, &status);
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  // The bytes an operand spans from its buffer's start, [first, last).
  std::pair<const char*, const char*> span(const MatmulOperand& o, int64_t rows, int64_t cols,
                                           const std::vector<void*>& buffers) const {
    const char* base = static_cast<const char*>(buffers.at(static_cast<size_t>(o.param)));
    int64_t last = o.offset + (spec_.batch - 1) * o.stride_batch + (rows - 1) * o.stride_row + (cols - 1) * o.stride_col;
    int64_t size = static_cast<int64_t>(itemsize(o.dtype));
    return {base + o.offset * size, base + (last + 1) * size};
  }
  bool output_overlaps_an_operand(const std::vector<void*>& buffers) const {
    auto out = span(spec_.out, spec_.m, spec_.n, buffers);
    std::vector<std::pair<const char*, const char*>> ins{span(spec_.a, spec_.m, spec_.k, buffers),
                                                          span(spec_.b, spec_.k, spec_.n, buffers)};
    if (spec_.bias) ins.push_back(span(*spec_.bias, 1, spec_.n, buffers));
    for (auto in : ins)
      if (in.first < out.second && out.first < in.second) return true;
    return false;
  }

  // Note [choosing a library algorithm]: times every candidate on these operands, keeps the fastest.
  template <class RunWith>
  void choose_algorithm(const RunWith& run_with, const std::vector<void*>& buffers) {
    std::vector<cublasLtMatmulAlgo_t> candidates;
    candidates.swap(candidates_);
    if (output_overlaps_an_operand(buffers)) return;
    constexpr int RUNS = 3;
    std::vector<double> seconds;
    for (const auto& algo : candidates) {
      run_with(algo);  // warm-up
      seconds.push_back(cuda::timed_on_stream(stream_, where_, [&] {
        for (int i = 0; i < RUNS; i++) run_with(algo);
      }) / RUNS);
    }
    size_t best = static_cast<size_t>(std::min_element(seconds.begin(), seconds.end()) - seconds.begin());
    if (seconds[best] > 0.95 * seconds[0]) best = 0;
    algo_ = candidates[best];
    if (knobs::DEBUG >= 3)
      std::fprintf(stderr, "%s: candidate %zu of %zu, %.3f ms (the heuristic's first: %.3f ms)\n", where_.c_str(),
                   best + 1, candidates.size(), seconds[best] * 1e3, seconds[0] * 1e3);
  }
};

}  // namespace

std::unique_ptr<Program> CublasLt::matmul(const MatmulSpec& spec) {
  if (!lt().reason.empty()) return nullptr;
  s_->make_current();
  std::string where = "cuBLASLt " + spec.name() + " on " + s_->device;
  if (!s_->handle) TG_LT(where, cublasLtCreate, &s_->handle);
  if (!s_->workspace) s_->workspace = s_->pool.alloc(WORKSPACE_BYTES);
  auto p = std::make_unique<LtMatmul>(spec, s_->handle, s_->workspace, s_->stream, s_->make_current, where);
  if (!p->init()) return nullptr;
  return p;
}

}  // namespace tg
