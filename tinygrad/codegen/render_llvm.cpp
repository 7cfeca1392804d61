// LLVMRenderer: LinearKernel -> textual LLVM IR for the CPU. One pass over the uops in execution
// order: each listed uop becomes one SSA value %v<position> (temporaries are %t<k>), a RANGE
// becomes head/body/latch/exit blocks with a phi counter, a DEFINE_ACC an entry-block alloca that
// mem2reg promotes. runtime/cpu_llvm.cpp parses, optimizes and JIT-compiles the result.
#include "tinygrad/codegen/render_llvm.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tinygrad/codegen/cpu_dot.h"
#include "tinygrad/codegen/linearize.h"
#include "tinygrad/error.h"

namespace tg {
namespace {

// note "type mapping": registers hold bool as i1, bfloat16 as its raw i16 bits (LLVM 16 has no
// usable bfloat arithmetic on x86) and every other dtype as its LLVM type. Memory holds bool as
// i8. bfloat16 is only loaded, stored, selected and cast; any other op on it is computed in float
// and rounded back, exactly as a CAST would.
const char* reg_type(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::UInt8: return "i8";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16: return "half";
    case DType::BFloat16: return "i16";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "void";
}
const char* mem_type(DType t) { return t == DType::Bool ? "i8" : reg_type(t); }
std::string align_of(DType t) { return std::to_string(itemsize(t)); }
bool is_fp(DType t) { return t == DType::Float16 || t == DType::Float32 || t == DType::Float64; }
bool is_signed_int(DType t) { return is_int(t) && !is_unsigned(t); }
int reg_bits(DType t) { return t == DType::Bool ? 1 : static_cast<int>(itemsize(t) * 8); }
const char* fp_suffix(DType t) { return t == DType::Float16 ? "f16" : t == DType::Float32 ? "f32" : "f64"; }

std::string hex_double(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(std::bit_cast<uint64_t>(d)));
  return buf;
}

std::string literal_int(DType t, int64_t v);

// A float value as an LLVM literal of dtype t (floats in the exact hex forms LLVM requires).
std::string literal_float(DType t, double v) {
  char buf[32];
  switch (t) {
    case DType::Float64: return hex_double(v);
    case DType::Float32: return hex_double(static_cast<double>(static_cast<float>(v)));
    case DType::Float16:
      std::snprintf(buf, sizeof buf, "0xH%04X", static_cast<unsigned>(float_to_half(static_cast<float>(v))));
      return buf;
    case DType::BFloat16: return std::to_string(static_cast<int16_t>(float_to_bfloat(static_cast<float>(v))));
    case DType::Bool: return v != 0 ? "true" : "false";
    default:
      if (!std::isfinite(v)) return "0";
      return literal_int(t, static_cast<int64_t>(v));
  }
}

std::string literal_int(DType t, int64_t v) {
  switch (t) {
    case DType::Bool: return v != 0 ? "true" : "false";
    case DType::UInt8: return std::to_string(static_cast<int8_t>(static_cast<uint8_t>(v)));
    case DType::Int32: return std::to_string(static_cast<int32_t>(v));
    case DType::Int64: return std::to_string(v);
    default: return literal_float(t, static_cast<double>(v));
  }
}

std::string const_literal(const UOp& c) {
  if (auto* i = std::get_if<int64_t>(&c.arg)) return literal_int(c.dtype, *i);
  return literal_float(c.dtype, c.const_value());
}

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '.' || ch == '$' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

// note "float flags": float instructions carry `nsz contract` (signed zeros may be ignored, a
// multiply and add may fuse into an FMA), never nnan/ninf, so NaN and infinity keep their IEEE
// meaning (log2(0) = -inf, MAX with NaN). Without reassoc a float reduction keeps its sequential
// order and is not vectorized; element-wise loops vectorize anyway. LLVMRendererOptions::fast_math
// adds `reassoc arcp afn` for vectorized reductions.
class Writer {
 public:
  Writer(const LinearKernel& k, const LLVMRendererOptions& o) : k_(k), opt_(o) {
    fm_ = o.fast_math ? " reassoc nsz arcp contract afn" : " nsz contract";
  }
  std::string run();

 private:
  const LinearKernel& k_;
  LLVMRendererOptions opt_;
  std::string fm_;
  std::ostringstream allocas_, body_;
  std::unordered_map<const UOp*, std::string> val_;             // SSA value of each rendered uop
  std::unordered_map<const UOp*, std::string> acc_;             // alloca of each DEFINE_ACC
  std::unordered_map<const UOp*, std::string> vector_type_;     // the bf16 dot tiles' vector values
  std::vector<std::pair<const UOp*, std::string>> open_;        // open RANGEs, innermost last
  std::set<std::string> declares_;
  std::vector<bool> written_;
  std::string block_ = "entry";
  const UOp* cur_ = nullptr;  // the uop being rendered, for messages
  size_t pos_ = 0;
  int tmp_ = 0;

  template <class... A>
  void check(bool cond, const A&... msg) const {
    TG_CHECK(cond, "LLVM renderer: kernel ", k_.name, ", uop ", pos_, " ", cur_ ? cur_->str(1) : std::string(),
             ": ", msg...);
  }
  std::string tmp() { return "%t" + std::to_string(tmp_++); }
  void emit(const std::string& s) { body_ << "  " << s << "\n"; }
  std::string emit_tmp(const std::string& rhs) {
    std::string t = tmp();
    emit(t + " = " + rhs);
    return t;
  }
  void label(const std::string& l) {
    body_ << l << ":\n";
    block_ = l;
  }
  std::string operand(const UOpPtr& u);
  // The IR type of u's value: a vector for the parts of a bf16 dot tile, else reg_type.
  std::string type_of(const UOp& u) const {
    auto it = vector_type_.find(&u);
    return it == vector_type_.end() ? reg_type(u.dtype) : it->second;
  }
  std::string align_of_value(const UOp& u) const { return vector_type_.count(&u) ? "64" : align_of(u.dtype); }
  std::string global(const UOp& u) const;
  std::string operand_as(const UOpPtr& u, DType t) { return convert(operand(u), u->dtype, t); }
  std::string convert_rhs(const std::string& v, DType from, DType to);
  std::string convert(const std::string& v, DType from, DType to) {
    return from == to ? v : emit_tmp(convert_rhs(v, from, to));
  }
  std::string intrinsic(const char* name, DType t, int nargs);
  std::string alu_rhs(const UOp& u);
  std::string op_rhs(const UOp& u, DType t, const std::vector<std::string>& a);
  std::string div_rhs(const UOp& u, DType t, const std::vector<std::string>& a, const char* ins);
  void render(const UOpPtr& u, size_t n);
  void render_load(const UOp& u, const std::string& name);
  void render_store(const UOp& u, size_t n);
  void render_dot_part(const UOp& u, const std::string& name);
};

std::string Writer::operand(const UOpPtr& u) {
  if (u->op == Op::CONST) return const_literal(*u);
  if (u->op == Op::DEFINE_GLOBAL) return global(*u);
  if (auto it = acc_.find(u.get()); it != acc_.end())
    return emit_tmp("load " + type_of(*u) + ", ptr " + it->second + ", align " + align_of_value(*u));
  auto it = val_.find(u.get());
  check(it != val_.end(), "source ", u->str(1), " is used before it is defined (or is not listed)");
  return it->second;
}

// Parameter i is %b<i> everywhere (a DEFINE_GLOBAL need not be listed before its first use).
std::string Writer::global(const UOp& u) const {
  int64_t i = u.arg_int();
  check(i >= 0 && i < static_cast<int64_t>(k_.params.size()), "parameter ", i, " of ", k_.params.size());
  check(k_.params[i].dtype == u.dtype, "DEFINE_GLOBAL dtype ", dtype_name(u.dtype), " != params[", i, "].dtype ",
        dtype_name(k_.params[i].dtype));
  return "%b" + std::to_string(i);
}

std::string Writer::intrinsic(const char* name, DType t, int nargs) {
  std::string callee = std::string("@llvm.") + name + "." + fp_suffix(t);
  std::string args;
  for (int i = 0; i < nargs; i++) args += std::string(i ? ", " : "") + reg_type(t);
  declares_.insert("declare " + std::string(reg_type(t)) + " " + callee + "(" + args + ")");
  return callee;
}

// The right-hand side of an instruction converting v from one dtype to another (see the brief in
// note "type mapping"); intermediate steps are emitted as temporaries.
std::string Writer::convert_rhs(const std::string& v, DType from, DType to) {
  const std::string F = reg_type(from), T = reg_type(to);
  if (from == to) return "bitcast " + F + " " + v + " to " + T;
  if (from == DType::BFloat16) {
    std::string w = emit_tmp("zext i16 " + v + " to i32");
    std::string s = emit_tmp("shl i32 " + w + ", 16");
    std::string rhs = "bitcast i32 " + s + " to float";
    return to == DType::Float32 ? rhs : convert_rhs(emit_tmp(rhs), DType::Float32, to);
  }
  if (to == DType::BFloat16) {
    // round to nearest even on the float's bits; NaN keeps its top bits and stays quiet
    std::string x = convert(v, from, DType::Float32);
    std::string b = emit_tmp("bitcast float " + x + " to i32");
    std::string hi = emit_tmp("lshr i32 " + b + ", 16");
    std::string odd = emit_tmp("and i32 " + hi + ", 1");
    std::string r0 = emit_tmp("add i32 " + b + ", 32767");
    std::string r1 = emit_tmp("add i32 " + r0 + ", " + odd);
    std::string rounded = emit_tmp("lshr i32 " + r1 + ", 16");
    std::string nan = emit_tmp("fcmp uno float " + x + ", 0.0");
    std::string quiet = emit_tmp("or i32 " + hi + ", 64");
    std::string bits = emit_tmp("select i1 " + nan + ", i32 " + quiet + ", i32 " + rounded);
    return "trunc i32 " + bits + " to i16";
  }
  if (to == DType::Bool) {
    if (is_fp(from)) return "fcmp une " + F + " " + v + ", " + literal_float(from, 0);
    return "icmp ne " + F + " " + v + ", 0";
  }
  if (from == DType::Bool) return (is_fp(to) ? "uitofp i1 " : "zext i1 ") + v + " to " + T;
  if (is_fp(from) && is_fp(to))
    return (reg_bits(from) < reg_bits(to) ? "fpext " : "fptrunc ") + F + " " + v + " to " + T;
  if (is_fp(to)) return (is_unsigned(from) ? "uitofp " : "sitofp ") + F + " " + v + " to " + T;
  if (is_fp(from)) {
    // note: float -> uint8 goes through i32 so that values in [-2^31, 2^31) wrap like C/NumPy
    // on x86 instead of giving poison (fptoui of a negative value)
    if (to == DType::UInt8) return "trunc i32 " + emit_tmp("fptosi " + F + " " + v + " to i32") + " to i8";
    return "fptosi " + F + " " + v + " to " + T;
  }
  if (reg_bits(from) < reg_bits(to)) return (is_unsigned(from) ? "zext " : "sext ") + F + " " + v + " to " + T;
  if (reg_bits(from) > reg_bits(to)) return "trunc " + F + " " + v + " to " + T;
  return "bitcast " + F + " " + v + " to " + T;
}

std::string Writer::alu_rhs(const UOp& u) {
  const Op op = u.op;
  if (op == Op::CAST) return convert_rhs(operand(u.src[0]), u.src[0]->dtype, u.dtype);
  if (op == Op::BITCAST) {
    DType from = u.src[0]->dtype;
    check(from != DType::Bool && u.dtype != DType::Bool && itemsize(from) == itemsize(u.dtype),
          "BITCAST needs two non-bool dtypes of one size, got ", dtype_name(from), " -> ", dtype_name(u.dtype));
    return std::string("bitcast ") + reg_type(from) + " " + operand(u.src[0]) + " to " + reg_type(u.dtype);
  }
  if (op == Op::WHERE) {
    check(u.src.size() == 3, "WHERE needs 3 sources");
    std::string c = operand_as(u.src[0], DType::Bool);
    std::string a = operand_as(u.src[1], u.dtype), b = operand_as(u.src[2], u.dtype);
    const std::string T = reg_type(u.dtype);
    return "select i1 " + c + ", " + T + " " + a + ", " + T + " " + b;
  }
  const OpGroup g = op_group(op);
  const size_t nsrc = g == OpGroup::Unary ? 1 : 2;
  check(u.src.size() == nsrc, op_name(op), " needs ", nsrc, " sources");
  // the dtype the op computes in: comparisons in their operands' dtype, bfloat16 in float
  DType in = is_comparison(op) ? (nsrc == 2 ? promote(u.src[0]->dtype, u.src[1]->dtype) : u.src[0]->dtype) : u.dtype;
  DType t = in == DType::BFloat16 ? DType::Float32 : in;
  std::vector<std::string> a;
  for (auto& s : u.src) a.push_back(operand_as(s, t));
  std::string rhs = op_rhs(u, t, a);
  if (!is_comparison(op) && u.dtype == DType::BFloat16) return convert_rhs(emit_tmp(rhs), DType::Float32, u.dtype);
  return rhs;
}

// note "integer division by zero": x / 0 and x % 0 give 0 (as NumPy does) instead of trapping.
// Divisors that are nonzero constants, the usual index arithmetic, get no guard.
std::string Writer::div_rhs(const UOp& u, DType t, const std::vector<std::string>& a, const char* ins) {
  const std::string T = reg_type(t);
  const UOpPtr& d = u.src[1];
  if (d->op == Op::CONST && d->const_value() != 0) return std::string(ins) + " " + T + " " + a[0] + ", " + a[1];
  std::string zero = emit_tmp("icmp eq " + T + " " + a[1] + ", " + literal_int(t, 0));
  std::string safe = emit_tmp("select i1 " + zero + ", " + T + " " + literal_int(t, 1) + ", " + T + " " + a[1]);
  std::string q = emit_tmp(std::string(ins) + " " + T + " " + a[0] + ", " + safe);
  return "select i1 " + zero + ", " + T + " " + literal_int(t, 0) + ", " + T + " " + q;
}

std::string Writer::op_rhs(const UOp& u, DType t, const std::vector<std::string>& a) {
  const std::string T = reg_type(t);
  const bool f = is_fp(t), b = t == DType::Bool, s = is_signed_int(t);
  auto bin = [&](const std::string& ins) { return ins + " " + T + " " + a[0] + ", " + a[1]; };
  auto fbin = [&](const char* ins) { return bin(ins + fm_); };
  auto call = [&](const char* name) {
    std::string args;
    for (size_t i = 0; i < a.size(); i++) args += (i ? ", " : "") + T + " " + a[i];
    return "call" + fm_ + " " + T + " " + intrinsic(name, t, static_cast<int>(a.size())) + "(" + args + ")";
  };
  auto need_float = [&]() { check(f, op_name(u.op), " needs a float dtype, got ", dtype_name(t)); };
  auto need_int = [&]() { check(!f, op_name(u.op), " needs an integer or bool dtype, got ", dtype_name(t)); };
  switch (u.op) {
    case Op::NEG:
      if (f) return "fneg" + fm_ + " " + T + " " + a[0];
      if (b) return "xor i1 " + a[0] + ", true";
      return "sub " + T + " 0, " + a[0];
    case Op::EXP2: need_float(); return call("exp2");
    case Op::LOG2: need_float(); return call("log2");
    case Op::SIN: need_float(); return call("sin");
    case Op::SQRT: need_float(); return call("sqrt");
    case Op::RECIP: need_float(); return "fdiv" + fm_ + " " + T + " " + literal_float(t, 1.0) + ", " + a[0];
    case Op::TRUNC: return f ? call("trunc") : "bitcast " + T + " " + a[0] + " to " + T;
    case Op::ADD: return f ? fbin("fadd") : bin(b ? "or" : "add");
    case Op::MUL: return f ? fbin("fmul") : bin(b ? "and" : "mul");
    case Op::IDIV: need_int(); return div_rhs(u, t, a, s ? "sdiv" : "udiv");
    case Op::MOD: return f ? fbin("frem") : div_rhs(u, t, a, s ? "srem" : "urem");
    case Op::MAX: {
      if (f) return call("maxnum");
      if (b) return bin("or");
      std::string gt = emit_tmp(bin(s ? "icmp sgt" : "icmp ugt"));
      return "select i1 " + gt + ", " + T + " " + a[0] + ", " + T + " " + a[1];
    }
    case Op::CMPLT: return bin(f ? "fcmp olt" : s ? "icmp slt" : "icmp ult");
    case Op::CMPNE: return bin(f ? "fcmp une" : "icmp ne");
    case Op::AND: need_int(); return bin("and");
    case Op::OR: need_int(); return bin("or");
    case Op::XOR: need_int(); return bin("xor");
    case Op::SHL: need_int(); return bin("shl");
    case Op::SHR: need_int(); return bin(s ? "ashr" : "lshr");
    default: check(false, op_name(u.op), " is not an ALU op the LLVM renderer knows"); return {};
  }
}

void Writer::render_load(const UOp& u, const std::string& name) {
  check(u.src.size() == 2 || u.src.size() == 3, "LOAD needs (buffer, index[, gate])");
  const UOpPtr& buf = u.src[0];
  check(buf->op == Op::DEFINE_GLOBAL, "LOAD from ", op_name(buf->op), " (only DEFINE_GLOBAL is supported)");
  check(buf->dtype == u.dtype, "LOAD dtype ", dtype_name(u.dtype), " != buffer dtype ", dtype_name(buf->dtype));
  const DType t = u.dtype;
  const std::string MT = mem_type(t), T = reg_type(t);
  std::string ptr = operand(buf), idx = operand_as(u.src[1], DType::Int64), gate;
  if (u.src.size() == 3) {
    // note: a false gate loads element 0 instead, so no address outside the buffer is touched
    gate = operand_as(u.src[2], DType::Bool);
    idx = emit_tmp("select i1 " + gate + ", i64 " + idx + ", i64 0");
  }
  if (const int64_t* ahead = std::get_if<int64_t>(&u.arg); ahead && gate.empty()) {
    // Note [prefetched panels] in codegen/opt_block.cpp: no inbounds, the line may lie past the buffer
    std::string at = emit_tmp("add i64 " + idx + ", " + std::to_string(*ahead));
    std::string pf = emit_tmp("getelementptr " + MT + ", ptr " + ptr + ", i64 " + at);
    declares_.insert("declare void @llvm.prefetch.p0(ptr nocapture readonly, i32 immarg, i32 immarg, i32 immarg)");
    emit("call void @llvm.prefetch.p0(ptr " + pf + ", i32 0, i32 3, i32 1)");
  }
  std::string p = emit_tmp("getelementptr inbounds " + MT + ", ptr " + ptr + ", i64 " + idx);
  std::string load = "load " + MT + ", ptr " + p + ", align " + align_of(t);
  if (gate.empty() && t != DType::Bool) return emit(name + " = " + load);
  std::string x = emit_tmp(load);
  if (t == DType::Bool) {
    std::string rhs = "icmp ne i8 " + x + ", 0";
    if (gate.empty()) return emit(name + " = " + rhs);
    x = emit_tmp(rhs);
  }
  emit(name + " = select i1 " + gate + ", " + T + " " + x + ", " + T + " " + literal_int(t, 0));
}

void Writer::render_store(const UOp& u, size_t n) {
  check(u.src.size() == 3 || u.src.size() == 4, "STORE needs (buffer, index, value[, gate])");
  const UOpPtr& buf = u.src[0];
  check(buf->op == Op::DEFINE_GLOBAL, "STORE to ", op_name(buf->op), " (only DEFINE_GLOBAL is supported)");
  check(u.src[2]->dtype == buf->dtype, "STORE of ", dtype_name(u.src[2]->dtype), " into a ", dtype_name(buf->dtype),
        " buffer");
  const DType t = buf->dtype;
  std::string ptr = operand(buf), idx = operand_as(u.src[1], DType::Int64), v = operand(u.src[2]);
  std::string done;
  if (u.src.size() == 4) {
    std::string gate = operand_as(u.src[3], DType::Bool), base = "s" + std::to_string(n);
    done = base + ".done";
    emit("br i1 " + gate + ", label %" + base + ".do, label %" + done);
    label(base + ".do");
  }
  if (t == DType::Bool) v = emit_tmp("zext i1 " + v + " to i8");
  std::string p = emit_tmp(std::string("getelementptr inbounds ") + mem_type(t) + ", ptr " + ptr + ", i64 " + idx);
  if (is_accumulating_store(u)) {  // Note [accumulating stores] in schedule/lower.cpp: one thread, load-add-store
    check(t == DType::Float32 || t == DType::Float64 || t == DType::Int32 || t == DType::Int64,
          "accumulating STORE of ", dtype_name(t));
    std::string old = emit_tmp(std::string("load ") + mem_type(t) + ", ptr " + p + ", align " + align_of(t));
    v = emit_tmp(std::string(is_float(t) ? "fadd " : "add ") + mem_type(t) + " " + old + ", " + v);
  }
  emit(std::string("store ") + mem_type(t) + " " + v + ", ptr " + p + ", align " + align_of(t));
  if (!done.empty()) {
    emit("br label %" + done);
    label(done);
  }
}

// Note [bf16 dot parts in IR]: the WMMA uops of a bf16 dot tile (codegen/cpu_dot.h) are vector
// values: 32 bfloat16 as <32 x i16> (Rows, Interleave; Rows is one unaligned 64-byte load), 16
// float32 as <16 x float> (Zero, Dot, Columns, the accumulators that hold them). Pair is a scalar i32,
// broadcast where a Dot uses it. Dot calls llvm.x86.avx512bf16.dpbf16ps.512 in its LLVM 16 form
// (<16 x i32> operands), which LLVM 17 and later upgrade to their <32 x bfloat> form when they
// parse the text. Interleave's shuffle is vpunpcklwd / vpunpckhwd: within each 128-bit lane,
// words 0-3 (4-7) of the two rows alternate.
void Writer::render_dot_part(const UOp& u, const std::string& name) {
  check(std::holds_alternative<std::vector<int64_t>>(u.arg), "a tensor-core WMMA has no CPU form");
  static const std::string F16 = "<16 x float>", W32 = "<32 x i16>", I16 = "<16 x i32>";
  const auto& arg = u.arg_ints();
  switch (dot_part(arg)) {
    case DotPart::Zero:
      val_[&u] = "zeroinitializer";
      vector_type_[&u] = F16;
      return;
    case DotPart::Rows: {
      check(u.src.size() == 2 && u.src[0]->op == Op::DEFINE_GLOBAL && u.src[0]->dtype == DType::BFloat16,
            "Rows needs (bfloat16 buffer, index)");
      std::string p = emit_tmp("getelementptr inbounds i16, ptr " + operand(u.src[0]) + ", i64 " +
                               operand_as(u.src[1], DType::Int64));
      emit(name + " = load " + W32 + ", ptr " + p + ", align 2");
      vector_type_[&u] = W32;
      break;
    }
    case DotPart::Interleave: {
      std::string mask;
      for (int lane = 0; lane < 4; lane++)
        for (int j = 0; j < 4; j++) {
          int i = 8 * lane + 4 * static_cast<int>(arg.at(1)) + j;
          mask += (mask.empty() ? "" : ", ") + std::string("i32 ") + std::to_string(i) + ", i32 " + std::to_string(32 + i);
        }
      std::string second = u.src.size() > 1 ? operand(u.src[1]) : "zeroinitializer";
      emit(name + " = shufflevector " + W32 + " " + operand(u.src[0]) + ", " + W32 + " " + second + ", <32 x i32> <" +
           mask + ">");
      vector_type_[&u] = W32;
      break;
    }
    case DotPart::Pair: {
      std::string lo = emit_tmp("zext i16 " + operand(u.src[0]) + " to i32");
      std::string up = "0";  // an odd loop's last step: the second value is zero
      if (u.src.size() > 1) up = emit_tmp("shl i32 " + emit_tmp("zext i16 " + operand(u.src[1]) + " to i32") + ", 16");
      emit(name + " = or i32 " + lo + ", " + up);
      break;
    }
    case DotPart::Dot: {
      check(u.src.size() == 3, "Dot needs (accumulator, pair, interleaved rows)");
      std::string acc = operand(u.src[0]);
      std::string one = emit_tmp("insertelement " + I16 + " poison, i32 " + operand(u.src[1]) + ", i64 0");
      std::string a = emit_tmp("shufflevector " + I16 + " " + one + ", " + I16 + " poison, " + I16 + " zeroinitializer");
      std::string b = emit_tmp("bitcast " + W32 + " " + operand(u.src[2]) + " to " + I16);
      const std::string callee = "@llvm.x86.avx512bf16.dpbf16ps.512";
      declares_.insert("declare " + F16 + " " + callee + "(" + F16 + ", " + I16 + ", " + I16 + ")");
      emit(name + " = call " + F16 + " " + callee + "(" + F16 + " " + acc + ", " + I16 + " " + a + ", " + I16 + " " + b +
           ")");
      vector_type_[&u] = F16;
      break;
    }
    case DotPart::Columns: {
      // column c of the row is lane 4 (c / 8) + c % 4 of accumulator (c / 4) % 2
      std::string mask;
      for (int c = 16 * static_cast<int>(arg.at(1)); c < 16 * static_cast<int>(arg.at(1)) + 16; c++)
        mask += (mask.empty() ? "" : ", ") + std::string("i32 ") + std::to_string(16 * ((c / 4) % 2) + 4 * (c / 8) + c % 4);
      emit(name + " = shufflevector " + F16 + " " + operand(u.src[0]) + ", " + F16 + " " + operand(u.src[1]) +
           ", <16 x i32> <" + mask + ">");
      vector_type_[&u] = F16;
      break;
    }
    case DotPart::Lane:
      emit(name + " = extractelement " + F16 + " " + operand(u.src[0]) + ", i64 " + std::to_string(arg.at(1)));
      break;
    default:
      check(false, "unknown part ", arg.at(0), " of a bf16 dot tile");
  }
  val_[&u] = name;
}

void Writer::render(const UOpPtr& up, size_t n) {
  const UOp& u = *up;
  cur_ = &u;
  pos_ = n;
  const std::string name = "%v" + std::to_string(n);
  switch (u.op) {
    case Op::CONST: return;  // rendered inline where used
    case Op::DEFINE_GLOBAL: global(u); return;
    case Op::RANGE: {
      check(u.src.size() == 1, "RANGE needs its end as src[0]");
      const std::string T = reg_type(u.dtype), base = "r" + std::to_string(n);
      check(is_int(u.dtype), "RANGE of dtype ", dtype_name(u.dtype));
      std::string end = operand_as(u.src[0], u.dtype), start = "0";
      if (n == 0 && !k_.global_size.empty()) {  // the thread-split loop: [lo, min(hi, end))
        check(u.dtype == DType::Int64, "the thread-split loop must count in i64");
        std::string below = emit_tmp("icmp slt i64 %hi, " + end);
        end = emit_tmp("select i1 " + below + ", i64 %hi, i64 " + end);
        start = "%lo";
      }
      std::string pred = block_;
      emit("br label %" + base + ".head");
      label(base + ".head");
      emit(name + " = phi " + T + " [ " + start + ", %" + pred + " ], [ " + name + ".next, %" + base + ".latch ]");
      std::string c = emit_tmp("icmp slt " + T + " " + name + ", " + end);
      emit("br i1 " + c + ", label %" + base + ".body, label %" + base + ".exit");
      label(base + ".body");
      open_.push_back({&u, base});
      val_[&u] = name;
      return;
    }
    case Op::ENDRANGE: {
      check(u.src.size() == 1 && !open_.empty() && open_.back().first == u.src[0].get(),
            "ENDRANGE does not close the innermost open RANGE");
      const std::string base = open_.back().second, v = val_[u.src[0].get()], T = reg_type(u.src[0]->dtype);
      open_.pop_back();
      emit("br label %" + base + ".latch");
      label(base + ".latch");
      emit(v + ".next = add nuw nsw " + T + " " + v + ", 1");  // v < end <= max, so no wrap
      emit("br label %" + base + ".head");
      label(base + ".exit");
      return;
    }
    case Op::DEFINE_ACC: {
      check(!u.src.empty(), "DEFINE_ACC needs its initial value as src[0]");
      if (vector_type_.count(u.src[0].get())) vector_type_[&u] = vector_type_[u.src[0].get()];
      const std::string T = type_of(u), A = align_of_value(u);
      std::string init = vector_type_.count(&u) ? operand(u.src[0]) : operand_as(u.src[0], u.dtype);
      allocas_ << "  " << name << " = alloca " << T << ", align " << A << "\n";
      emit("store " + T + " " + init + ", ptr " + name + ", align " + A);
      acc_[&u] = name;
      return;
    }
    case Op::ASSIGN: {
      check(u.src.size() == 2 && acc_.count(u.src[0].get()), "ASSIGN needs (DEFINE_ACC, value)");
      const UOp& acc = *u.src[0];
      std::string v = vector_type_.count(&acc) ? operand(u.src[1]) : operand_as(u.src[1], acc.dtype);
      emit("store " + type_of(acc) + " " + v + ", ptr " + acc_[&acc] + ", align " + align_of_value(acc));
      val_[&u] = v;
      return;
    }
    case Op::LOAD: render_load(u, name); val_[&u] = name; return;
    case Op::STORE: render_store(u, n); return;
    case Op::WMMA: render_dot_part(u, name); return;
    default: break;
  }
  check(is_alu(u.op), op_name(u.op), " cannot be rendered by the LLVM renderer (CPU kernels have no ",
        u.op == Op::SPECIAL ? "thread indices)" : "such op)");
  std::string rhs = alu_rhs(u);
  emit(name + " = " + rhs);
  val_[&u] = name;
}

// note "noalias parameters": the kernel body is an internal function `@"<name>.impl"` that takes
// the buffers as separate parameters marked noalias (and readonly where the kernel never stores to
// them) and the thread's [lo, hi) of the first loop; the exported `@"<name>"(ptr %bufs, i64 %lo,
// i64 %hi)` loads the buffers from the array and calls it. The impl is
// alwaysinline, and the inliner turns noalias into scoped alias metadata, so the vectorizer needs no
// runtime overlap checks. This is only valid while no buffer is passed for two parameters of which
// one is written (tinygrad's rule too); LLVMRendererOptions::noalias = false drops the promise.
std::string Writer::run() {
  TG_CHECK(valid_name(k_.name), "LLVM renderer: kernel name '", k_.name, "' must be non-empty [A-Za-z0-9_.$-]");
  written_.assign(k_.params.size(), false);
  for (auto& u : k_.uops)
    if (u->op == Op::STORE && !u->src.empty() && u->src[0]->op == Op::DEFINE_GLOBAL) {
      int64_t i = u->src[0]->arg_int();
      if (i >= 0 && i < static_cast<int64_t>(written_.size())) written_[i] = true;
    }
  for (size_t n = 0; n < k_.uops.size(); n++) render(k_.uops[n], n);
  cur_ = nullptr;
  pos_ = k_.uops.size();
  check(open_.empty(), open_.size(), " RANGE(s) are never closed by ENDRANGE");

  std::ostringstream out;
  const std::string impl = "@\"" + k_.name + ".impl\"";
  out << "; kernel " << k_.name << " (tinygrad++ LLVMRenderer)\n";
  out << "define internal void " << impl << "(";
  for (size_t i = 0; i < k_.params.size(); i++) {
    out << (i ? ", " : "") << "ptr ";
    if (opt_.noalias) out << "noalias ";
    if (!written_[i]) out << "readonly ";
    out << "%b" << i;
  }
  out << (k_.params.empty() ? "" : ", ") << "i64 %lo, i64 %hi";
  out << ") #0 {\nentry:\n" << allocas_.str() << body_.str() << "  ret void\n}\n\n";
  out << "define void @\"" << k_.name << "\"(ptr %bufs, i64 %lo, i64 %hi) #1 {\nentry:\n";
  for (size_t i = 0; i < k_.params.size(); i++) {
    out << "  %p" << i << " = getelementptr inbounds ptr, ptr %bufs, i64 " << i << "\n";
    out << "  %b" << i << " = load ptr, ptr %p" << i << ", align 8\n";
  }
  out << "  call void " << impl << "(";
  for (size_t i = 0; i < k_.params.size(); i++) out << (i ? ", " : "") << "ptr %b" << i;
  out << (k_.params.empty() ? "" : ", ") << "i64 %lo, i64 %hi)\n  ret void\n}\n\n";
  for (auto& d : declares_) out << d << "\n";
  out << "\nattributes #0 = { alwaysinline nounwind \"no-trapping-math\"=\"true\" }\n";
  out << "attributes #1 = { nounwind \"no-trapping-math\"=\"true\" }\n";
  return out.str();
}

}  // namespace


std::string LLVMRenderer::render(const LinearKernel& kernel) const { return Writer(kernel, options_).run(); }

}  // namespace tg
