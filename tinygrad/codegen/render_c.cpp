// Rendering a LinearKernel as C. Half types live in memory only: float16 as _Float16 (or the
// device's half), bfloat16 as a 16-bit integer converted through the tg_bf16 helpers.
#include "tinygrad/codegen/render_c.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "tinygrad/error.h"

namespace tg {

std::string CStyleRenderer::type_name(DType t) const {
  switch (t) {
    case DType::Bool: return "_Bool";
    case DType::UInt8: return "unsigned char";
    case DType::Int32: return "int";
    case DType::Int64: return "long long";
    case DType::Float16: return "_Float16";
    case DType::BFloat16: return "unsigned short";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "?";
}

std::string CStyleRenderer::literal(const UOp& c) const {
  double v = c.const_value();
  if (c.dtype == DType::BFloat16) return "((unsigned short)" + std::to_string(float_to_bfloat(static_cast<float>(v))) + ")";
  if (is_float(c.dtype)) {
    bool f32 = c.dtype != DType::Float64;
    if (std::isnan(v)) return f32 ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
    if (std::isinf(v)) return std::string(v < 0 ? "-" : "") + (f32 ? "__builtin_inff()" : "__builtin_inf()");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    std::string s = buf;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return f32 ? "(" + s + "f)" : "(" + s + ")";
  }
  if (c.dtype == DType::Bool) return v != 0 ? "1" : "0";
  auto i = static_cast<int64_t>(v);
  if (c.dtype == DType::Int64) return "(" + std::to_string(i) + "ll)";
  return "(" + std::to_string(i) + ")";
}

std::string CStyleRenderer::math(Op op, DType t, const std::string& x) const {
  const char* suffix = t == DType::Float64 ? "" : "f";
  const char* fn = op == Op::EXP2 ? "exp2" : op == Op::LOG2 ? "log2" : op == Op::SIN ? "sin" : op == Op::SQRT ? "sqrt" : "trunc";
  return std::string("__builtin_") + fn + suffix + "(" + x + ")";
}

std::string CStyleRenderer::render(const LinearKernel& k) const {
  std::ostringstream os;
  os << prelude() << signature(k) << " {\n";
  for (size_t i = 0; i < k.params.size(); i++) os << param_decl(k, i);
  std::unordered_map<const UOp*, std::string> name;
  auto ref = [&](const UOpPtr& u) -> std::string {
    if (u->op == Op::CONST) return literal(*u);
    auto it = name.find(u.get());
    TG_ASSERT(it != name.end(), "C renderer: use before definition of ", u->str(0));
    return it->second;
  };
  int depth = 1;
  int counter = 0;
  auto line = [&](const std::string& s) { os << std::string(2 * depth, ' ') << s << "\n"; };
  for (auto& u : k.uops) {
    std::string v = "v" + std::to_string(counter++);
    auto s = [&](size_t i) { return ref(u->src[i]); };
    std::string T = type_name(u->dtype);
    switch (u->op) {
      case Op::RANGE: {
        v = "ridx" + std::to_string(u->arg_int());
        if (&u == &k.uops.front() && !k.global_size.empty())  // the thread-split loop: [lo, min(hi, n))
          line("for (long long " + v + " = lo; " + v + " < (hi < " + s(0) + " ? hi : " + s(0) + "); " + v + "++) {");
        else
          line("for (long long " + v + " = 0; " + v + " < " + s(0) + "; " + v + "++) {");
        depth++;
        break;
      }
      case Op::ENDRANGE:
        depth--;
        line("}");
        break;
      case Op::DEFINE_GLOBAL:
        v = "data" + std::to_string(u->arg_int());
        break;
      case Op::DEFINE_ACC:
        v = "acc" + std::to_string(u->arg_int());
        line(T + " " + v + " = " + s(0) + ";");
        break;
      case Op::ASSIGN:
        line(s(0) + " = " + s(1) + ";");
        break;
      case Op::LOAD: {
        std::string load = s(0) + "[" + s(1) + "]";
        if (u->src.size() > 2) load = "(" + s(2) + " ? " + load + " : (" + T + ")0)";
        line(T + " " + v + " = " + load + ";");
        break;
      }
      case Op::STORE:
        line(s(0) + "[" + s(1) + "] = " + s(2) + ";");
        break;
      case Op::CAST: {
        DType from = u->src[0]->dtype;
        std::string x = s(0);
        if (from == DType::BFloat16) x = "tg_bf16_to_f32(" + x + ")", from = DType::Float32;
        if (u->dtype == DType::BFloat16)
          line(T + " " + v + " = tg_f32_to_bf16((float)" + x + ");");
        else if (u->dtype == DType::Bool)
          line(T + " " + v + " = (" + x + " != 0);");
        else
          line(T + " " + v + " = (" + T + ")" + x + ";");
        break;
      }
      case Op::BITCAST:
        // through a named copy: the source may be a literal, which has no address
        line(T + " " + v + "; { " + type_name(u->src[0]->dtype) + " bits = " + s(0) + "; __builtin_memcpy(&" + v +
             ", &bits, sizeof(" + v + ")); }");
        break;
      default: {
        std::string e;
        switch (u->op) {
          case Op::NEG: e = u->dtype == DType::Bool ? "!" + s(0) : "-" + s(0); break;
          case Op::RECIP: e = "1/" + s(0); break;
          case Op::EXP2: case Op::LOG2: case Op::SIN: case Op::SQRT: case Op::TRUNC: e = math(u->op, u->dtype, s(0)); break;
          case Op::ADD: e = s(0) + " + " + s(1); break;
          case Op::MUL: e = s(0) + " * " + s(1); break;
          case Op::IDIV: e = s(0) + " / " + s(1); break;
          case Op::MOD: e = s(0) + " % " + s(1); break;
          case Op::MAX: e = s(0) + " > " + s(1) + " ? " + s(0) + " : " + s(1); break;
          case Op::CMPLT: e = s(0) + " < " + s(1); break;
          case Op::CMPNE: e = s(0) + " != " + s(1); break;
          case Op::AND: e = s(0) + " & " + s(1); break;
          case Op::OR: e = s(0) + " | " + s(1); break;
          case Op::XOR: e = s(0) + " ^ " + s(1); break;
          case Op::SHL: e = s(0) + " << " + s(1); break;
          case Op::SHR: e = s(0) + " >> " + s(1); break;
          case Op::WHERE: e = s(0) + " ? " + s(1) + " : " + s(2); break;
          default: TG_ASSERT(false, "C renderer: unsupported ", op_name(u->op));
        }
        line(T + " " + v + " = " + e + ";");
      }
    }
    name[u.get()] = v;
  }
  os << "}\n";
  return os.str();
}

std::string CRenderer::prelude() const {
  return "static inline float tg_bf16_to_f32(unsigned short b) { unsigned int x = (unsigned int)b << 16; float f; "
         "__builtin_memcpy(&f, &x, 4); return f; }\n"
         "static inline unsigned short tg_f32_to_bf16(float f) { unsigned int x; __builtin_memcpy(&x, &f, 4); "
         "if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u); "
         "x += 0x7fffu + ((x >> 16) & 1u); return (unsigned short)(x >> 16); }\n";
}

std::string CRenderer::signature(const LinearKernel& k) const {
  return "void " + k.name + "(void** bufs, long long lo, long long hi)";
}

std::string CRenderer::param_decl(const LinearKernel& k, size_t i) const {
  std::string T = type_name(k.params[i].dtype);
  std::string c = k.params[i].written ? "" : "const ";
  return "  " + c + T + "* restrict data" + std::to_string(i) + " = (" + c + T + "*)bufs[" + std::to_string(i) + "];\n";
}

}  // namespace tg
