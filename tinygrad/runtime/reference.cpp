// The float64 reference interpreter (see reference.h and Note [reference semantics]). Every
// node becomes a dense RefArray, memoized per node; movement ops walk the output multi-index
// and map it back to the source, exactly as the definitions of the ops read.
#include "tinygrad/runtime/reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"

namespace tg {

namespace {

// ---- multi-index helpers ----

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] == 0 ? 0 : flat % shape[i];
    flat = shape[i] == 0 ? 0 : flat / shape[i];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); i++) flat = flat * shape[i] + idx[i];
  return flat;
}

// ---- scalar semantics ----

// A finite double to int64 the way C converts in range (toward zero); out of range and NaN
// have no C meaning, so they map to 0 rather than invoking undefined behaviour here.
int64_t to_i64(double v) {
  if (!std::isfinite(v)) return 0;
  double t = std::trunc(v);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return 0;
  return static_cast<int64_t>(t);
}

// A value as an element of dtype t holds it: integers wrap, floats round to their format.
double as_dtype(DType t, double v) {
  switch (t) {
    case DType::Bool: return v != 0 ? 1.0 : 0.0;
    case DType::UInt8: return static_cast<double>(static_cast<uint8_t>(static_cast<uint64_t>(to_i64(v)) & 0xffu));
    case DType::Int32: return static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(to_i64(v)))));
    case DType::Int64: return static_cast<double>(to_i64(v));
    case DType::Float16: return half_to_float(float_to_half(static_cast<float>(v)));
    case DType::BFloat16: return bfloat_to_float(float_to_bfloat(static_cast<float>(v)));
    case DType::Float32: return static_cast<double>(static_cast<float>(v));
    case DType::Float64: return v;
  }
  return v;
}

// Integer results wrap to their dtype; float results stay float64 (the reference's precision).
double wrap(DType t, double v) { return is_float(t) ? v : as_dtype(t, v); }

double unary(Op op, DType t, double x) {
  switch (op) {
    case Op::NEG: return t == DType::Bool ? (x != 0 ? 0.0 : 1.0) : wrap(t, -x);
    case Op::EXP2: return std::exp2(x);
    case Op::LOG2: return std::log2(x);
    case Op::SIN: return std::sin(x);
    case Op::SQRT: return std::sqrt(x);
    case Op::RECIP: return is_float(t) ? 1.0 / x : (x == 0 ? 0.0 : wrap(t, static_cast<double>(to_i64(1.0 / x))));
    case Op::TRUNC: return std::trunc(x);
    default: TG_ASSERT(false, "reference: not a unary op ", op_name(op));
  }
}

// t: the operands' dtype (comparisons return bool, but compute on t).
double binary(Op op, DType t, double a, double b) {
  bool integral = !is_float(t);
  switch (op) {
    case Op::ADD: return wrap(t, a + b);
    case Op::MUL: return wrap(t, a * b);
    case Op::IDIV:
      if (integral) {
        int64_t x = to_i64(a), y = to_i64(b);
        return y == 0 ? 0.0 : wrap(t, static_cast<double>(x / y));
      }
      return std::trunc(a / b);
    case Op::MOD:
      if (integral) {
        int64_t x = to_i64(a), y = to_i64(b);
        return y == 0 ? 0.0 : wrap(t, static_cast<double>(x % y));
      }
      return std::fmod(a, b);
    case Op::MAX: return a > b ? a : b;
    case Op::CMPLT: return a < b ? 1.0 : 0.0;
    case Op::CMPNE: return a != b ? 1.0 : 0.0;
    case Op::AND:
      if (t == DType::Bool) return (a != 0 && b != 0) ? 1.0 : 0.0;
      return wrap(t, static_cast<double>(to_i64(a) & to_i64(b)));
    case Op::OR:
      if (t == DType::Bool) return (a != 0 || b != 0) ? 1.0 : 0.0;
      return wrap(t, static_cast<double>(to_i64(a) | to_i64(b)));
    case Op::XOR:
      if (t == DType::Bool) return ((a != 0) != (b != 0)) ? 1.0 : 0.0;
      return wrap(t, static_cast<double>(to_i64(a) ^ to_i64(b)));
    case Op::SHL: return wrap(t, static_cast<double>(static_cast<int64_t>(static_cast<uint64_t>(to_i64(a)) << (to_i64(b) & 63))));
    case Op::SHR: return wrap(t, static_cast<double>(to_i64(a) >> (to_i64(b) & 63)));
    default: TG_ASSERT(false, "reference: not a binary op ", op_name(op));
  }
}

double bitcast_value(DType from, DType to, double v) {
  uint8_t bytes[8] = {};
  store_as(from, bytes, v);
  return load_as(to, bytes);
}

// ---- the interpreter ----

class Interpreter {
 public:
  explicit Interpreter(const RefOptions& opt) : opt_(opt) {}

  RefArray run(const UOpPtr& root) {
    auto stop = [&](const UOp& u) { return !reads_buffer(u); };
    for (auto& n : toposort({root}, stop)) memo_[n.get()] = eval(*n);
    return memo_.at(root.get());
  }

 private:
  const RefOptions& opt_;
  std::unordered_map<const UOp*, RefArray> memo_;

  bool reads_buffer(const UOp& u) const {
    return u.op == Op::BUFFER || (opt_.use_realized && u.realized);
  }

  const RefArray& in(const UOp& u, size_t i) const { return memo_.at(u.src[i].get()); }

  static RefArray blank(const UOp& u) {
    RefArray r;
    r.shape = u.shape;
    r.dtype = u.dtype;
    r.data.assign(static_cast<size_t>(prod(u.shape)), 0.0);
    return r;
  }

  RefArray read_buffer(const UOp& u) const {
    const std::shared_ptr<Buffer>& buf = u.op == Op::BUFFER ? u.arg_buffer() : u.realized;
    TG_CHECK(buf, "reference: ", u.str(0), " has no buffer");
    RefArray r = blank(u);
    TG_CHECK(buf->numel() == prod(u.shape), "reference: buffer of ", buf->numel(), " elements for shape ",
             shape_str(u.shape));
    std::vector<uint8_t> bytes(buf->nbytes());
    if (!bytes.empty()) buf->copy_out(bytes.data(), bytes.size());
    size_t isz = itemsize(buf->dtype());
    for (size_t i = 0; i < r.data.size(); i++) r.data[i] = as_dtype(u.dtype, load_as(buf->dtype(), bytes.data() + i * isz));
    return r;
  }

  // out[i] = src[map(out multi-index)] for a movement op; map returns -1 for "zero" (PAD).
  template <class F>
  RefArray move(const UOp& u, F map) const {
    const RefArray& s = in(u, 0);
    RefArray r = blank(u);
    for (size_t i = 0; i < r.data.size(); i++) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(i), u.shape);
      bool valid = map(idx);
      r.data[i] = valid ? s.data[static_cast<size_t>(ravel(idx, s.shape))] : 0.0;
    }
    return r;
  }

  RefArray eval(const UOp& u) const {
    if (reads_buffer(u)) return read_buffer(u);
    const Shape* src_shape = u.src.empty() ? nullptr : &u.src[0]->shape;
    switch (u.op) {
      case Op::CONST: {
        RefArray r = blank(u);
        for (auto& v : r.data) v = as_dtype(u.dtype, u.const_value());
        return r;
      }
      case Op::DETACH:
      case Op::CONTIGUOUS:
      case Op::CUSTOM_GRAD:
      case Op::COPY: {
        RefArray r = in(u, 0);
        r.shape = u.shape;
        return r;
      }
      case Op::CAST: {
        RefArray r = in(u, 0);
        for (auto& v : r.data) v = as_dtype(u.dtype, v);
        r.dtype = u.dtype;
        return r;
      }
      case Op::BITCAST: {
        RefArray r = in(u, 0);
        for (auto& v : r.data) v = bitcast_value(u.src[0]->dtype, u.dtype, v);
        r.dtype = u.dtype;
        return r;
      }
      case Op::RESHAPE: {
        RefArray r = in(u, 0);
        TG_ASSERT(prod(r.shape) == prod(u.shape), "reference: reshape size");
        r.shape = u.shape;
        return r;
      }
      case Op::PERMUTE: {
        auto& order = u.arg_ints();
        return move(u, [&](std::vector<int64_t>& idx) {
          std::vector<int64_t> s(idx.size());
          for (size_t i = 0; i < order.size(); i++) s[order[i]] = idx[i];
          idx = s;
          return true;
        });
      }
      case Op::EXPAND:
        return move(u, [&](std::vector<int64_t>& idx) {
          for (size_t i = 0; i < idx.size(); i++)
            if ((*src_shape)[i] == 1) idx[i] = 0;
          return true;
        });
      case Op::SHRINK: {
        auto& b = u.arg_ints();  // begin, end per dim
        return move(u, [&](std::vector<int64_t>& idx) {
          for (size_t i = 0; i < idx.size(); i++) idx[i] += b[2 * i];
          return true;
        });
      }
      case Op::PAD: {
        auto& p = u.arg_ints();  // before, after per dim
        return move(u, [&](std::vector<int64_t>& idx) {
          for (size_t i = 0; i < idx.size(); i++) {
            idx[i] -= p[2 * i];
            if (idx[i] < 0 || idx[i] >= (*src_shape)[i]) return false;
          }
          return true;
        });
      }
      case Op::FLIP: {
        auto& axes = u.arg_ints();
        return move(u, [&](std::vector<int64_t>& idx) {
          for (auto a : axes) idx[a] = (*src_shape)[a] - 1 - idx[a];
          return true;
        });
      }
      case Op::REDUCE_AXIS: return reduce(u);
      case Op::GATHER: return gather(u);
      case Op::TEMPLATE_KERNEL: return template_kernel(u);
      case Op::SCATTER_ADD: return scatter_add(u);
      case Op::WHERE: {
        const RefArray &c = in(u, 0), &a = in(u, 1), &b = in(u, 2);
        RefArray r = blank(u);
        for (size_t i = 0; i < r.data.size(); i++) r.data[i] = c.data[i] != 0 ? a.data[i] : b.data[i];
        return r;
      }
      default: break;
    }
    if (op_group(u.op) == OpGroup::Unary) {
      RefArray r = in(u, 0);
      for (auto& v : r.data) v = unary(u.op, u.dtype, v);
      r.dtype = u.dtype;
      return r;
    }
    if (op_group(u.op) == OpGroup::Binary) {
      const RefArray &a = in(u, 0), &b = in(u, 1);
      TG_ASSERT(a.shape == b.shape, "reference: binary operands differ in shape");
      RefArray r = blank(u);
      DType t = u.src[0]->dtype;
      for (size_t i = 0; i < r.data.size(); i++) r.data[i] = binary(u.op, t, a.data[i], b.data[i]);
      return r;
    }
    TG_FAIL("reference: cannot evaluate ", op_name(u.op), " (", u.str(0), ")");
  }

  // Note [template kernels] in codegen/attention_kernel.cpp: the template's definition
  RefArray template_kernel(const UOp& u) const {
    std::vector<const std::vector<double>*> inputs;
    for (size_t i = 0; i < u.src.size(); i++) inputs.push_back(&in(u, i).data);
    RefArray r = blank(u);
    r.data = template_kernel_reference(u.arg_ints(), inputs);
    // rounded where the kernel writes a half type (attention's backward results: AttentionSpec::output_dtype)
    for (auto& v : r.data) v = as_dtype(u.dtype, v);
    return r;
  }

  // out[i] = x[i with i[axis] = index[i]], 0 where the index is outside x
  RefArray gather(const UOp& u) const {
    const RefArray &x = in(u, 0), &index = in(u, 1);
    auto axis = static_cast<size_t>(u.arg_ints()[0]);
    RefArray r = blank(u);
    for (size_t i = 0; i < r.data.size(); i++) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(i), u.shape);
      auto at = static_cast<int64_t>(index.data[i]);
      if (at < 0 || at >= x.shape[axis]) continue;
      idx[axis] = at;
      r.data[i] = x.data[static_cast<size_t>(ravel(idx, x.shape))];
    }
    return r;
  }

  // values[i] added at i with i[axis] = index[i], skipped where the index is outside the output
  RefArray scatter_add(const UOp& u) const {
    const RefArray &v = in(u, 0), &index = in(u, 1);
    auto axis = static_cast<size_t>(u.arg_ints()[0]);
    RefArray r = blank(u);
    for (size_t i = 0; i < v.data.size(); i++) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(i), v.shape);
      auto at = static_cast<int64_t>(index.data[i]);
      if (at < 0 || at >= u.shape[axis]) continue;
      idx[axis] = at;
      double& acc = r.data[static_cast<size_t>(ravel(idx, u.shape))];
      acc = wrap(u.dtype, acc + v.data[i]);
    }
    return r;
  }

  RefArray reduce(const UOp& u) const {
    const ReduceArg& ra = u.arg_reduce();
    const RefArray& s = in(u, 0);
    double init = ra.op == Op::ADD ? 0.0 : ra.op == Op::MUL ? 1.0 : -std::numeric_limits<double>::infinity();
    if (ra.op == Op::MAX && !is_float(u.dtype)) init = dtype_min(u.dtype);
    RefArray r = blank(u);
    for (auto& v : r.data) v = init;
    for (size_t i = 0; i < s.data.size(); i++) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(i), s.shape);
      for (auto a : ra.axes) idx[a] = 0;
      double& acc = r.data[static_cast<size_t>(ravel(idx, u.shape))];
      double x = s.data[i];
      if (ra.op == Op::ADD) acc = wrap(u.dtype, acc + x);
      else if (ra.op == Op::MUL) acc = wrap(u.dtype, acc * x);
      else if (ra.op == Op::MAX) acc = acc > x ? acc : x;
      else TG_ASSERT(false, "reference: reduce op ", op_name(ra.op));
    }
    return r;
  }
};

}  // namespace

RefArray reference_eval(const UOpPtr& root, const RefOptions& opt) { return Interpreter(opt).run(root); }

}  // namespace tg
