// The LLVM ORC JIT behind CPU kernels: parses the IR text from LLVMRenderer, runs the O3
// new-pass-manager pipeline for the host CPU (its name and features, so AVX2/AVX-512/FMA are used,
// restricted by CPU_ISA: Note [the host's description] in cpu_host.cpp), and JIT-links it with
// one LLJIT per compiler. The only file of tinygrad++ that includes LLVM headers; builds against
// LLVM 15 through 19.
#include "tinygrad/runtime/cpu_llvm.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <sstream>

#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Passes/OptimizationLevel.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/runtime/cpu.h"
#include "tinygrad/runtime/cpu_host.h"

namespace tg {
namespace {

namespace orc = llvm::orc;

std::string take_message(llvm::Error err) { return llvm::toString(std::move(err)); }

// The host target, detected once: CPU name and features as LLVM sees them.
struct HostTarget {
  orc::JITTargetMachineBuilder jtmb;
  std::string cpu;
  std::string features;
};

const HostTarget& host_target() {
  static std::once_flag once;
  static HostTarget* host = nullptr;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    auto jtmb = orc::JITTargetMachineBuilder::detectHost();  // sets host CPU name and features
    TG_CHECK(jtmb, "LLVM: cannot detect the host target: ", take_message(jtmb.takeError()));
#if LLVM_VERSION_MAJOR >= 18
    jtmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
#else
    jtmb->setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
#endif
    std::string cpu = jtmb->getCPU(), features = jtmb->getFeatures().getString();
    host = new HostTarget{std::move(*jtmb), std::move(cpu), std::move(features)};  // lives until exit
  });
  return *host;
}

// Note [no gathers]: where a kernel's loop reads or writes memory with a stride (the CNN's
// NHWC <-> NCHW copies, Note [transposing copies] in codegen/opt.cpp; an elementwise kernel that
// Note [intermediates written over a dying input] in engine/jit_in_place.cpp rewrote to work in
// place), LLVM's loop vectorizer may vectorize it with gathers and scatters, one cache line a
// lane, where it otherwise loads whole vectors and shuffles them in registers. Whether it does is
// the target's cost model: on the Intel Xeon it did not (the copy below ran at 1.7 ms there,
// Note [transposing copies]); for AMD's Zen 5 (znver5) it did, and there the CNN's
// [512, 24, 24, 32] -> [512, 32, 24, 24] copy took 7.2-7.6 ms against 2.6 ms without, its
// in-place ReLU of [512, 32, 24, 24] 7.2 ms against 1.5 ms, and the whole CNN training step 177
// ms against 147-148 (2-core AMD EPYC Zen 5, alternated `tg bench --reps=10 cnn_step`). So x86
// kernels are compiled with LLVM's prefer-no-gather and prefer-no-scatter, a hint its cost model
// keeps (from LLVM 18; older LLVMs, which may not know the features, go without).

// The host's features as CPU_ISA restricts them (and Note [no gathers]).
std::string isa_features() {
  std::string features = llvm_features_for(host_target().features, cpu_host());
#if LLVM_VERSION_MAJOR >= 18
  if (host_target().jtmb.getTargetTriple().isX86()) features += ",+prefer-no-gather,+prefer-no-scatter";
#endif
  return features;
}

std::unique_ptr<llvm::TargetMachine> host_target_machine() {
  orc::JITTargetMachineBuilder jtmb(host_target().jtmb);
  jtmb.setFeatures(isa_features());
  auto tm = jtmb.createTargetMachine();
  TG_CHECK(tm, "LLVM: cannot create the host target machine: ", take_message(tm.takeError()));
  return std::move(*tm);
}

void run_o3(llvm::Module& m, llvm::TargetMachine& tm) {
  // analysis managers in this order, so that they are destroyed in the right order
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = true;
  pto.SLPVectorization = true;
  llvm::PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(m, mam);
}

// Every function is compiled for the ISA of the host's description: its features (the JIT's own
// target machine has the native ones, so a restricted ISA must be named per function) and, on
// AVX-512, 512-bit vectors, which the register tiles are sized for (LLVM prefers 256 bits on
// Intel's server cores).
void set_isa_attributes(llvm::Module& m) {
  const CpuHost& host = cpu_host();
  const bool restricted = host.isa != host.native_isa;
  for (llvm::Function& f : m) {
    if (f.isDeclaration()) continue;
    if (restricted) {
      f.addFnAttr("target-cpu", host_target().cpu);
      f.addFnAttr("target-features", isa_features());
    }
    if (host.isa == "avx512") f.addFnAttr("prefer-vector-width", llvm_prefer_vector_width(host));
  }
}

// DEBUG=6: the machine code of an optimized module, as assembly (a clone is emitted, so the JIT
// still compiles the module itself).
void print_assembly(const std::string& name, const llvm::Module& m, llvm::TargetMachine& tm) {
  std::unique_ptr<llvm::Module> copy = llvm::CloneModule(m);
  llvm::SmallString<0> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
#if LLVM_VERSION_MAJOR >= 18
  const auto asm_file = llvm::CodeGenFileType::AssemblyFile;
#else
  const auto asm_file = llvm::CGFT_AssemblyFile;
#endif
  if (tm.addPassesToEmitFile(pm, os, nullptr, asm_file)) {
    std::fprintf(stderr, "; %s: this LLVM target cannot print assembly\n", name.c_str());
    return;
  }
  pm.run(*copy);
  std::fprintf(stderr, "; assembly of %s\n%s\n", name.c_str(), text.c_str());
}

// Parses, verifies and optimizes one kernel module in ctx. Throws CompileError with the
// diagnostic and the IR.
std::unique_ptr<llvm::Module> build_module(const std::string& name, const std::string& source,
                                           const std::string& module_id, llvm::LLVMContext& ctx) {
  llvm::SMDiagnostic diag;
  std::unique_ptr<llvm::Module> m = llvm::parseIR(llvm::MemoryBufferRef(source, module_id), diag, ctx);
  if (!m) {
    std::string msg;
    llvm::raw_string_ostream os(msg);
    diag.print(module_id.c_str(), os, /*ShowColors=*/false);
    os.flush();
    throw CompileError(name, source, detail::cat("LLVM: cannot parse kernel ", name, ":\n", msg));
  }
  std::string verr;
  llvm::raw_string_ostream vos(verr);
  bool broken = llvm::verifyModule(*m, &vos);
  vos.flush();
  if (broken)
    throw CompileError(name, source, detail::cat("LLVM: kernel ", name, " does not verify:\n", verr));
  set_isa_attributes(*m);
  auto tm = host_target_machine();
  m->setTargetTriple(tm->getTargetTriple().str());
  m->setDataLayout(tm->createDataLayout());
  run_o3(*m, *tm);
  if (knobs::DEBUG >= 6) print_assembly(name, *m, *tm);
  return m;
}

// note "one JITDylib per kernel": every compiled module goes into a fresh JITDylib named
// "<kernel>#<n>", so two kernels may export the same symbol name without clashing (a BEAM search
// compiles many variants of one kernel name). Each JITDylib resolves libm/libgcc symbols (exp2f,
// sinf, __truncdfhf2, ...) from the process. When the last Program of a kernel dies its JITDylib is
// removed, which frees the code. Programs share ownership of the LLJIT, so they may outlive the
// compiler that made them (a Device destroys its compiler before its program cache).
// Materialization (instruction selection, linking) runs under the JIT's mutex; parsing and the
// O3 pipeline, the larger part of compile time, run in parallel.
struct JitState {
  std::mutex mu;
  std::unique_ptr<orc::LLJIT> jit;
  uint64_t modules = 0;

  orc::LLJIT& get() {  // call with mu held
    if (!jit) {
      auto built = orc::LLJITBuilder().setJITTargetMachineBuilder(host_target().jtmb).create();
      TG_CHECK(built, "LLVM: cannot create the ORC LLJIT: ", take_message(built.takeError()));
      jit = std::move(*built);
    }
    return *jit;
  }
};

class LLVMCompiler : public Compiler {
 public:
  std::string cache_key() const override {
    const HostTarget& h = host_target();
    char hash[24];
    std::snprintf(hash, sizeof hash, "%08zx", std::hash<std::string>()(isa_features()) & 0xffffffffu);
    return "llvm-" + llvm_version() + "-" + h.cpu + "-" + hash + " " + cpu_host().key();
  }

  std::unique_ptr<Program> compile(const std::string& name, const std::string& source) override {
    uint64_t n;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      n = state_->modules++;
    }
    const std::string module_id = name + "#" + std::to_string(n);
    auto ctx = std::make_unique<llvm::LLVMContext>();
    std::unique_ptr<llvm::Module> m = build_module(name, source, module_id, *ctx);

    std::lock_guard<std::mutex> lock(state_->mu);
    orc::LLJIT& jit = state_->get();
    m->setDataLayout(jit.getDataLayout());
    auto jd = jit.createJITDylib(module_id);
    TG_CHECK(jd, "LLVM: cannot create a JITDylib for ", name, ": ", take_message(jd.takeError()));
    auto gen = orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit.getDataLayout().getGlobalPrefix());
    TG_CHECK(gen, "LLVM: cannot search the process for symbols: ", take_message(gen.takeError()));
    jd->addGenerator(std::move(*gen));
    auto fail = [&](const char* what, llvm::Error err) {
      std::string msg = take_message(std::move(err));
      llvm::consumeError(jit.getExecutionSession().removeJITDylib(*jd));
      throw CompileError(name, source, detail::cat("LLVM: ", what, " kernel ", name, ": ", msg));
    };
    orc::ThreadSafeModule tsm(std::move(m), orc::ThreadSafeContext(std::move(ctx)));
    if (auto err = jit.addIRModule(*jd, std::move(tsm))) fail("cannot add", std::move(err));
    auto sym = jit.lookup(*jd, name);
    if (!sym) fail("cannot find the entry point of", sym.takeError());
    // the program keeps its JITDylib, and the JIT, alive; the last owner removes the dylib
    std::shared_ptr<void> keep(static_cast<void*>(&*jd), [state = state_](void* dylib) {
      std::lock_guard<std::mutex> lock(state->mu);
      llvm::consumeError(state->jit->getExecutionSession().removeJITDylib(*static_cast<orc::JITDylib*>(dylib)));
    });
    return std::make_unique<HostProgram>(sym->toPtr<HostProgram::Entry>(), std::move(keep));
  }

 private:
  std::shared_ptr<JitState> state_ = std::make_shared<JitState>();
};

}  // namespace

std::unique_ptr<Compiler> make_llvm_compiler() { return std::make_unique<LLVMCompiler>(); }

std::string llvm_optimized_ir(const std::string& source) {
  llvm::LLVMContext ctx;
  auto m = build_module("(optimized_ir)", source, "optimized_ir", ctx);
  std::string out;
  llvm::raw_string_ostream os(out);
  m->print(os, nullptr);
  os.flush();
  return out;
}

std::string llvm_version() { return LLVM_VERSION_STRING; }

}  // namespace tg
