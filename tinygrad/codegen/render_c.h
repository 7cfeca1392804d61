// C-style source renderers. CRenderer writes C99 for CPU kernels compiled by the system compiler;
// the CUDA and OpenCL renderers reuse its expression printing.
#pragma once
#include <string>
#include <unordered_map>

#include "tinygrad/codegen/renderer.h"

namespace tg {

class CStyleRenderer : public Renderer {
 public:
  std::string render(const LinearKernel& k) const override;

 protected:
  virtual std::string type_name(DType t) const;
  virtual std::string prelude() const = 0;
  virtual std::string signature(const LinearKernel& k) const = 0;
  // Declares parameter i: a line in the body, or "" when the signature names it.
  virtual std::string param_decl(const LinearKernel& k, size_t i) const = 0;
  virtual std::string math(Op op, DType t, const std::string& x) const;
  std::string literal(const UOp& c) const;
};

class CRenderer : public CStyleRenderer {
 protected:
  std::string prelude() const override;
  std::string signature(const LinearKernel& k) const override;
  std::string param_decl(const LinearKernel& k, size_t i) const override;
};

}  // namespace tg
