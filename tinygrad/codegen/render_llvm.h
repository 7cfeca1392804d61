// LLVM IR renderer for CPU kernels: turns a LinearKernel into textual LLVM IR (opaque pointers,
// accepted by LLVM 16 through 19) for `define void @<name>(ptr %bufs)`, where bufs[i] is the base
// address of parameter i. No LLVM headers here: runtime/cpu_llvm.cpp parses and compiles the text.
#pragma once
#include <string>

#include "tinygrad/codegen/renderer.h"

namespace tg {

struct LLVMRendererOptions {
  // Parameters are marked noalias (see note "noalias parameters" in render_llvm.cpp): the caller
  // must not pass one buffer for two parameters when either of them is written.
  bool noalias = true;
  // Adds reassoc, arcp and afn to the float flags, so float reductions vectorize; results then
  // differ from the sequential order in the last bits. Off by default.
  bool fast_math = false;
};

class LLVMRenderer : public Renderer {
 public:
  LLVMRenderer() = default;
  explicit LLVMRenderer(LLVMRendererOptions options) : options_(options) {}
  // Keeps global_size only for kernels worth splitting across threads (launch_size).
  std::string render(const LinearKernel& kernel) const override;
  const LLVMRendererOptions& options() const { return options_; }

 private:
  LLVMRendererOptions options_;
};

}  // namespace tg
