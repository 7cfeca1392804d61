// The OpenCL C renderer: CStyleRenderer with OpenCL's types, kernel signature (__global
// buffers), thread indices (get_global_id, get_group_id, get_local_id), barriers and __local
// memory.
#pragma once
#include "tinygrad/codegen/render_c.h"

namespace tg {

class OpenCLRenderer : public CStyleRenderer {
 public:
  // half_storage: float16 buffers through vload_half/vstore_half (no cl_khr_fp16 needed);
  // with native_half, float16 values are `half` (cl_khr_fp16).
  explicit OpenCLRenderer(bool native_half) : native_half_(native_half) {}

 protected:
  std::string type_name(DType t) const override;
  std::string prelude(const LinearKernel& k) const override;
  std::string signature(const LinearKernel& k) const override;
  std::string param_decl(const LinearKernel&, size_t) const override { return ""; }
  std::string math(Op op, DType t, const std::string& x) const override;
  std::string literal(const UOp& c) const override;
  std::string cast(DType to, DType from, const std::string& x) const override;
  std::string bitcast(DType to, DType from, const std::string& x, const std::string& v) const override;
  std::string load(DType t, const std::string& buf, const std::string& idx) const override;
  std::string store(DType t, const std::string& buf, const std::string& idx, const std::string& val) const override;
  std::string accumulate(DType t, const std::string& buf, const std::string& idx, const std::string& val) const override;
  std::string special(int64_t arg) const override;
  std::string barrier() const override { return "barrier(CLK_LOCAL_MEM_FENCE);"; }
  std::string local_array(DType t, const std::string& name, int64_t size) const override;

 private:
  std::string buffer_type(DType t) const;
  bool native_half_;
};

}  // namespace tg
