// The CUDA C++ renderer: CStyleRenderer with CUDA's types, `extern "C" __global__` kernels,
// thread indices (blockIdx, blockDim, threadIdx), __syncthreads and __shared__ memory. Kernels
// need no headers (Note [cuda half types]), so NVRTC compiles them without the toolkit's
// include directory.
#pragma once
#include <algorithm>

#include "tinygrad/codegen/render_c.h"

namespace tg {

class CUDARenderer : public CStyleRenderer {
 public:
  std::string loop_prefix(int64_t trips) const override;
  static constexpr int64_t WARP = 32;
  static constexpr int64_t VECTOR_BYTES = 16;  // uint4: Note [vector accesses] in codegen/vector_access.cpp

 protected:
  std::string type_name(DType t) const override;
  std::string prelude(const LinearKernel& k) const override;
  std::string signature(const LinearKernel& k) const override;
  std::string param_decl(const LinearKernel&, size_t) const override { return ""; }
  std::string math(Op op, DType t, const std::string& x) const override;
  std::string max_expr(DType t, const std::string& a, const std::string& b) const override;
  std::string literal(const UOp& c) const override;
  std::string cast(DType to, DType from, const std::string& x) const override;
  std::string bitcast(DType to, DType from, const std::string& x, const std::string& v) const override;
  std::string load(DType t, const std::string& buf, const std::string& idx) const override;
  std::string store(DType t, const std::string& buf, const std::string& idx, const std::string& val) const override;
  std::string accumulate(DType t, const std::string& buf, const std::string& idx, const std::string& val) const override;
  std::string special(int64_t arg) const override;
  std::string barrier() const override { return "__syncthreads();"; }
  std::string local_array(DType t, const std::string& name, int64_t size) const override;
  // one slot per warp (Note [warp combine])
  int64_t group_slots(int64_t threads) const override { return std::max<int64_t>(1, threads / WARP); }
  std::string group_combine(const GroupReduce& g, const std::string& acc, const std::string& lid, int id,
                            const std::string& indent) const override;
  std::string mma(const std::string& out, const std::vector<std::string>& operands) const override;
  int64_t max_vector_bytes() const override { return VECTOR_BYTES; }
  std::string vector_type(int64_t bytes) const override;
  std::string storage_type(DType t) const override;
};

}  // namespace tg
