// The LLVM ORC JIT compiler for CPU kernels: textual LLVM IR (from LLVMRenderer) in, a callable
// tg::Program out. Only cpu_llvm.cpp includes LLVM headers; this header is free of them.
#pragma once
#include <memory>
#include <string>

#include "tinygrad/device.h"

namespace tg {

// One LLJIT per compiler, created on first compile; compile() may be called from several threads.
// A Program runs `void name(void** bufs)` and keeps the JIT alive, so it may outlive the compiler.
std::unique_ptr<Compiler> make_llvm_compiler();

// The module after the same O3 pipeline and host target that compile() uses (for DEBUG output
// and tests: e.g. to see whether a loop was vectorized). Throws tg::Error on bad IR.
std::string llvm_optimized_ir(const std::string& source);

// "19.1.7" etc.: the LLVM this was built against.
std::string llvm_version();

}  // namespace tg
