// Rendering a LinearKernel as C-style source. Half types live in memory only: float16 as _Float16
// (or the device's half), bfloat16 as a 16-bit integer converted through the tg_bf16 helpers.
// Device specifics go through the hooks declared in render_c.h.
#include "tinygrad/codegen/render_c.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "tinygrad/codegen/linearize.h"
#include "tinygrad/codegen/vector_access.h"
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

std::string CStyleRenderer::max_expr(DType, const std::string& a, const std::string& b) const {
  return a + " > " + b + " ? " + a + " : " + b;
}

std::string CStyleRenderer::render(const LinearKernel& k) const {
  std::ostringstream os;
  os << prelude(k) << signature(k) << " {\n";
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
  std::unordered_map<std::string, std::string> mma_of;  // a WMMA's operands -> the product's name
  VectorPlan vectors = max_vector_bytes() > 0 ? plan_vector_accesses(k.uops, max_vector_bytes()) : VectorPlan{};
  auto vector_of = [&](const UOp* u) -> const VectorAccess* {
    auto it = vectors.member_of.find(u);
    return it == vectors.member_of.end() ? nullptr : &vectors.at.at(it->second);
  };
  for (size_t g = 0; g < k.group_reduces.size(); g++)
    os << "  " << local_array(k.group_reduces[g].acc->dtype, "tg_red" + std::to_string(g), group_slots(k.group_reduces[g].size)) << "\n";
  auto line = [&](const std::string& s) { os << std::string(2 * depth, ' ') << s << "\n"; };
  for (auto& u : k.uops) {
    std::string v = "v" + std::to_string(counter++);
    auto s = [&](size_t i) { return ref(u->src[i]); };
    std::string T = type_name(u->dtype);
    switch (u->op) {
      case Op::RANGE: {
        v = "ridx" + std::to_string(u->arg_int());
        if (split_first_loop() && &u == &k.uops.front() && !k.global_size.empty())  // [lo, min(hi, n))
          line("for (" + type_name(dtypes::index) + " " + v + " = lo; " + v + " < (hi < " + s(0) + " ? hi : " + s(0) +
               "); " + v + "++) {");
        else {
          if (u->src[0]->op == Op::CONST) {
            std::string pre = loop_prefix(static_cast<int64_t>(u->src[0]->const_value()));
            if (!pre.empty()) line(pre);
          }
          line("for (" + type_name(dtypes::index) + " " + v + " = 0; " + v + " < " + s(0) + "; " + v + "++) {");
        }
        depth++;
        break;
      }
      case Op::ENDRANGE:
        depth--;
        line("}");
        for (size_t g = 0; g < k.group_reduces.size(); g++) {
          auto& gr = k.group_reduces[g];
          if (gr.acc->src.size() > 1 && gr.acc->src[1] == u->src[0])
            os << group_combine(gr, name.at(gr.acc.get()), ref(gr.lid), static_cast<int>(g), std::string(2 * depth, ' '));
        }
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
        if (const VectorAccess* a = vector_of(u.get())) {  // Note [vector accesses]
          if (a->members.front() == u) {
            std::vector<std::string> names;
            for (size_t m = 0; m < a->members.size(); m++) names.push_back(name[a->members[m].get()] = v + "_" + std::to_string(m));
            for (auto& l : vector_load(u->src[0]->dtype, u->dtype, s(0), a->bytes, ref(a->members.front()->src[1]), names)) line(l);
          }
          v = name.at(u.get());
          break;
        }
        if (const int64_t* ahead = std::get_if<int64_t>(&u->arg); ahead && u->src.size() == 2)
          if (std::string pf = prefetch(s(0), s(1), *ahead); !pf.empty()) line(pf);
        std::string load = this->load(u->src[0]->dtype, s(0), s(1));
        if (u->src.size() > 2) load = "(" + s(2) + " ? " + load + " : (" + T + ")0)";
        line(T + " " + v + " = " + load + ";");
        break;
      }
      case Op::STORE: {
        if (const VectorAccess* a = vector_of(u.get())) {  // Note [vector accesses]
          if (a->members.back() == u) {
            std::vector<std::string> values;
            for (auto& m : a->members) values.push_back(ref(m->src[2]));
            line(vector_store(u->src[0]->dtype, s(0), a->bytes, ref(a->members.front()->src[1]), values));
          }
          break;
        }
        std::string st = is_accumulating_store(*u) ? accumulate(u->src[0]->dtype, s(0), s(1), s(2))
                                                   : store(u->src[0]->dtype, s(0), s(1), s(2));
        line(u->src.size() > 3 ? "if (" + s(3) + ") " + st : st);
        break;
      }
      case Op::CAST:
        line(T + " " + v + " = " + cast(u->dtype, u->src[0]->dtype, s(0)) + ";");
        break;
      case Op::BITCAST:
        line(bitcast(u->dtype, u->src[0]->dtype, s(0), v));
        break;
      case Op::SPECIAL:
        line(type_name(dtypes::index) + " " + v + " = " + special(u->arg_int()) + ";");
        break;
      case Op::WMMA: {  // the four results of one product are one instruction
        std::vector<std::string> operands;
        std::string key;
        for (auto& x : u->src) key += (operands.emplace_back(ref(x))) + ",";
        auto it = mma_of.find(key);
        if (it == mma_of.end()) {
          it = mma_of.emplace(key, "mma" + std::to_string(mma_of.size()) + "_").first;
          line(mma(it->second, operands));
        }
        v = it->second + std::to_string(u->arg_int());
        break;
      }
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
          case Op::MAX: e = max_expr(u->dtype, s(0), s(1)); break;
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

// Note [vector accesses] in codegen/vector_access.cpp: the wide access where the buffer's address
// is a multiple of its bytes, element by element where it is not (a view at another offset).
// The element-by-element path indexes every member from the first (Note [runs across arithmetic]).
std::vector<std::string> CStyleRenderer::vector_load(DType buffer, DType t, const std::string& buf, int64_t bytes,
                                                     const std::string& first, const std::vector<std::string>& names) const {
  std::string VT = vector_type(bytes);
  std::string decl = type_name(t);
  for (size_t m = 0; m < names.size(); m++) decl += (m ? ", " : " ") + names[m];
  std::string out = "if (" + aligned(buf, bytes) + ") { " + vector_union(buffer, VT, names.size()) + " u; u.w = *(const " + VT +
                    "*)(" + buf + " + " + first + ");";
  for (size_t m = 0; m < names.size(); m++) out += " " + names[m] + " = " + load(buffer, "u.e", std::to_string(m)) + ";";
  out += " } else {";
  for (size_t m = 0; m < names.size(); m++) out += " " + names[m] + " = " + load(buffer, buf, element(first, m)) + ";";
  return {decl + ";", out + " }"};
}

std::string CStyleRenderer::vector_store(DType buffer, const std::string& buf, int64_t bytes, const std::string& first,
                                         const std::vector<std::string>& values) const {
  std::string VT = vector_type(bytes);
  std::string out = "if (" + aligned(buf, bytes) + ") { " + vector_union(buffer, VT, values.size()) + " u;";
  for (size_t m = 0; m < values.size(); m++) out += " " + store(buffer, "u.e", std::to_string(m), values[m]);
  out += " *(" + VT + "*)(" + buf + " + " + first + ") = u.w; } else {";
  for (size_t m = 0; m < values.size(); m++) out += " " + store(buffer, buf, element(first, m), values[m]);
  return out + " }";
}

// Element m of a wide access whose first element is at index `first`.
std::string CStyleRenderer::element(const std::string& first, size_t m) {
  return m == 0 ? first : "(" + first + " + " + std::to_string(m) + ")";
}

// The vector and its elements as one union (reading the member not last written is defined in C
// and in CUDA C++), and whether a buffer's address is a multiple of `bytes`.
std::string CStyleRenderer::vector_union(DType buffer, const std::string& vector, size_t n) const {
  return "union { " + vector + " w; " + storage_type(buffer) + " e[" + std::to_string(n) + "]; }";
}
std::string CStyleRenderer::aligned(const std::string& buf, int64_t bytes) {
  return "(((unsigned long long)" + buf + ") & " + std::to_string(bytes - 1) + "ull) == 0";
}

std::string CStyleRenderer::cast(DType to, DType from, const std::string& x_in) const {
  std::string x = x_in;
  if (from == DType::BFloat16) x = "tg_bf16_to_f32(" + x + ")";
  if (to == DType::BFloat16) return "tg_f32_to_bf16((float)" + x + ")";
  if (to == DType::Bool) return "(" + x + " != 0)";
  return "(" + type_name(to) + ")" + x;
}

std::string CStyleRenderer::bitcast(DType to, DType from, const std::string& x, const std::string& v) const {
  // through a named copy: the source may be a literal, which has no address
  return type_name(to) + " " + v + "; { " + type_name(from) + " bits = " + x + "; __builtin_memcpy(&" + v +
         ", &bits, sizeof(" + v + ")); }";
}

std::string CStyleRenderer::load(DType, const std::string& buf, const std::string& idx) const {
  return buf + "[" + idx + "]";
}

std::string CStyleRenderer::store(DType, const std::string& buf, const std::string& idx, const std::string& val) const {
  return buf + "[" + idx + "] = " + val + ";";
}

std::string CStyleRenderer::prefetch(const std::string&, const std::string&, int64_t) const { return ""; }

std::string CStyleRenderer::accumulate(DType, const std::string& buf, const std::string& idx,
                                       const std::string& val) const {
  return buf + "[" + idx + "] += " + val + ";";
}

std::string CStyleRenderer::special(int64_t arg) const {
  TG_ASSERT(false, "this renderer has no thread indices (SPECIAL ", arg, ")");
}
std::string CStyleRenderer::barrier() const { TG_ASSERT(false, "this renderer has no barriers"); }
std::string CStyleRenderer::local_array(DType, const std::string& name, int64_t) const {
  TG_ASSERT(false, "this renderer has no local memory (", name, ")");
}

std::string CStyleRenderer::mma(const std::string& out, const std::vector<std::string>&) const {
  TG_ASSERT(false, "this renderer has no tensor-core products (", out, ")");
}

std::string c_binary(Op op, const std::string& a, const std::string& b) {
  switch (op) {
    case Op::ADD: return a + " + " + b;
    case Op::MUL: return a + " * " + b;
    case Op::MAX: return a + " > " + b + " ? " + a + " : " + b;
    default: TG_ASSERT(false, "c_binary: unsupported ", op_name(op));
  }
}

// Note [group combine]: every thread of the group has its partial in `acc`. Each writes it to
// local memory; after a barrier, a tree halves the active threads each round (the group size is
// a power of two), with a barrier between rounds; then every thread reads the result, so the
// code after the reduce sees the full value in `acc` whatever thread runs it.
std::string CStyleRenderer::half_as_float_literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(half_to_float(float_to_half(static_cast<float>(v)))));
  std::string t = buf;
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  return "(" + t + "f)";
}

std::string CStyleRenderer::group_combine(const GroupReduce& g, const std::string& acc, const std::string& lid, int id,
                                          const std::string& in) const {
  TG_ASSERT(g.per_block == 1, "C renderer: groups packed into a work-group need a warp combine");
  std::string m = "tg_red" + std::to_string(id);
  std::string r = m + "[" + lid + "]";
  std::ostringstream os;
  os << in << r << " = " << acc << ";\n" << in << barrier() << "\n";
  os << in << "for (int s = " << g.size / 2 << "; s > 0; s >>= 1) {\n";
  os << in << "  if (" << lid << " < s) " << r << " = " << c_binary(g.op, r, m + "[" + lid + " + s]") << ";\n";
  os << in << "  " << barrier() << "\n" << in << "}\n";
  os << in << acc << " = " << m << "[0];\n";
  return os.str();
}

std::string CRenderer::prelude(const LinearKernel&) const {
  return "static inline float tg_bf16_to_f32(unsigned short b) { unsigned int x = (unsigned int)b << 16; float f; "
         "__builtin_memcpy(&f, &x, 4); return f; }\n"
         "static inline unsigned short tg_f32_to_bf16(float f) { unsigned int x; __builtin_memcpy(&x, &f, 4); "
         "if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u); "
         "x += 0x7fffu + ((x >> 16) & 1u); return (unsigned short)(x >> 16); }\n";
}


std::string CRenderer::signature(const LinearKernel& k) const {
  return "void " + k.name + "(void** bufs, long long lo, long long hi)";
}

// the address is formed as an integer, so one past the buffer is not pointer arithmetic out of bounds
std::string CRenderer::prefetch(const std::string& buf, const std::string& idx, int64_t distance) const {
  return "__builtin_prefetch((const void*)((unsigned long long)" + buf + " + sizeof(*" + buf + ") * (unsigned long long)(" +
         idx + " + " + std::to_string(distance) + ")), 0, 3);";
}

std::string CRenderer::param_decl(const LinearKernel& k, size_t i) const {
  std::string T = type_name(k.params[i].dtype);
  std::string c = k.params[i].written ? "" : "const ";
  return "  " + c + T + "* restrict data" + std::to_string(i) + " = (" + c + T + "*)bufs[" + std::to_string(i) + "];\n";
}

}  // namespace tg
