// Matrix products among scheduled kernels (schedule/match_matmul.h).
//
// Note [matching a matmul kernel]: `a.matmul(b)` lowers to
//   STORE(out, idx, [CAST] [MAX(_, 0)] [CAST] [ADD(_, LOAD bias)] [CAST] REDUCE(ADD, x * y, ranges))
// where x and y are LOADs (or float32 LOADs cast to bfloat16), half ones widened to float32, every index a linear form in the kernel's
// RANGEs (Note [linear forms] in rewrite.cpp). Each range is classified by where its stride is nonzero: a
// reduce range read by both loads is k; an output range read by x only is m, by y only is n, by both is the
// batch. Ranges of one class that are laid out as one dim in every access (outer stride = inner size * inner
// stride, as after a reshape of [B, T, K] to [B*T, K]) merge; what remains must be at most one range per
// class (a second m or n range becomes the batch when there is none, broadcast in the other operand), and not
// m = n = 1 (dot products are left to the generated reduce). Anything else (gated or computed loads, a reduce
// other than a sum, a broadcast output, negative strides) is not a product a library runs, and stays a
// generated kernel.
#include "tinygrad/schedule/match_matmul.h"

#include <algorithm>
#include <array>

#include "tinygrad/rewrite.h"

namespace tg {

namespace {

enum View { OUT, A, B, BIAS, VIEWS };
enum Class { M, N, BATCH, K, CLASSES };

struct Dim {
  int64_t size = 1;
  std::array<int64_t, VIEWS> stride{};
};

struct Access {
  int param = 0;
  DType dtype = DType::Float32;
  LinearForm index;
};

bool library_float(DType t) { return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32; }

std::optional<Access> access_of(const UOpPtr& load_or_store) {
  const auto& s = load_or_store->src;
  if (s.size() != (load_or_store->op == Op::STORE ? 3u : 2u) || s[0]->op != Op::DEFINE_GLOBAL)
    return std::nullopt;
  Access acc{static_cast<int>(s[0]->arg_int()), s[0]->dtype, linear_form(s[1])};
  for (auto& [term, coef] : acc.index.terms)
    if (term->op != Op::RANGE || coef < 0) return std::nullopt;
  if (acc.index.constant < 0) return std::nullopt;
  return acc;
}

int64_t stride_of(const Access& acc, const UOp* range) {
  for (auto& [term, coef] : acc.index.terms)
    if (term.get() == range) return coef;
  return 0;
}

UOpPtr skip_float_casts(UOpPtr x) {
  while (library_float_cast(*x)) x = x->src[0];
  return x;
}

// The source of binary op x that satisfies `is` and the other one, or two nullptrs.
template <class Pred>
std::pair<UOpPtr, UOpPtr> split(const UOpPtr& x, Pred is) {
  if (is(x->src[1])) return {x->src[1], x->src[0]};
  if (is(x->src[0])) return {x->src[0], x->src[1]};
  return {nullptr, nullptr};
}

// Merges dims of one class that are one dim in every view (Note [matching a matmul kernel]).
std::vector<Dim> merge(std::vector<Dim> dims) {
  std::sort(dims.begin(), dims.end(), [](const Dim& x, const Dim& y) {
    for (int v = 0; v < VIEWS; v++)
      if (x.stride[v] != y.stride[v]) return x.stride[v] > y.stride[v];
    return false;
  });
  std::vector<Dim> out;
  for (auto& d : dims) {
    bool joins = !out.empty();
    for (int v = 0; v < VIEWS && joins; v++) joins = out.back().stride[v] == d.size * d.stride[v];
    if (joins) {
      out.back().size *= d.size;
      out.back().stride = d.stride;
    } else {
      out.push_back(d);
    }
  }
  return out;
}

MatmulOperand operand(const Access& acc, const Dim& batch, const Dim& row, const Dim& col, View v) {
  return MatmulOperand{acc.param,       acc.dtype,     acc.index.constant,
                       batch.stride[v], row.stride[v], col.stride[v]};
}

}  // namespace

bool library_float_cast(const UOp& u) {
  return u.op == Op::CAST && library_float(u.dtype) && library_float(u.src[0]->dtype);
}

std::optional<MatmulSpec> match_matmul(const UOpPtr& ast, const std::vector<DType>& param_dtypes) {
  if (ast->op != Op::STORE) return std::nullopt;
  auto out = access_of(ast);
  if (!out || !library_float(out->dtype)) return std::nullopt;
  MatmulSpec spec;
  std::optional<Access> bias;
  UOpPtr v = skip_float_casts(ast->src[2]);
  if (v->op == Op::MAX) {
    auto [zero, rest] = split(v, [](const UOpPtr& s) { return is_const(s, 0.0); });
    if (!zero) return std::nullopt;
    spec.relu = true;
    v = skip_float_casts(rest);
  }
  if (v->op == Op::ADD) {
    auto [load, rest] = split(v, [](const UOpPtr& s) { return s->op == Op::LOAD; });
    if (!load || !(bias = access_of(load)) || bias->dtype != out->dtype) return std::nullopt;
    v = skip_float_casts(rest);
  }
  if (v->op != Op::REDUCE || std::get<Op>(v->arg) != Op::ADD || v->src.size() < 2) return std::nullopt;
  const UOpPtr& product = v->src[0];
  if (product->op != Op::MUL) return std::nullopt;
  // float32 operands cast to bfloat16 in the kernel (mixed precision): the library rounds them
  auto rounded = [](const UOpPtr& x) {
    return x->op == Op::CAST && x->dtype == DType::BFloat16 && x->src[0]->dtype == DType::Float32;
  };
  // half operands widened to float32 for the product (Note [half products in float32], tensor_nn.cpp):
  // the library multiplies and accumulates half inputs in float32 itself
  auto unwiden = [](const UOpPtr& x) {
    bool widened = x->op == Op::CAST && x->dtype == DType::Float32 &&
                   (x->src[0]->dtype == DType::Float16 || x->src[0]->dtype == DType::BFloat16);
    return widened ? x->src[0] : x;
  };
  UOpPtr x = unwiden(product->src[0]), y = unwiden(product->src[1]);
  spec.inputs_bf16 = rounded(x) && rounded(y);
  if (spec.inputs_bf16) x = x->src[0], y = y->src[0];
  if (x->op != Op::LOAD || y->op != Op::LOAD) return std::nullopt;
  auto a = access_of(x), b = access_of(y);
  if (!a || !b || a->dtype != b->dtype || !library_float(a->dtype)) return std::nullopt;
  const std::array<const Access*, VIEWS> views{&*out, &*a, &*b, bias ? &*bias : nullptr};
  for (const Access* acc : views)
    if (acc &&
        (static_cast<size_t>(acc->param) >= param_dtypes.size() || param_dtypes[acc->param] != acc->dtype))
      return std::nullopt;

  // every range once: the reduce's, then the output's (each output range must be read)
  std::vector<const UOp*> reduce_ranges, ranges;
  for (size_t i = 1; i < v->src.size(); i++) reduce_ranges.push_back(v->src[i].get());
  ranges = reduce_ranges;
  for (auto& [term, coef] : out->index.terms) ranges.push_back(term.get());
  for (const Access* acc : views)
    for (auto& [term, coef] : acc ? acc->index.terms : std::vector<std::pair<UOpPtr, int64_t>>{})
      if (std::find(ranges.begin(), ranges.end(), term.get()) == ranges.end()) return std::nullopt;
  std::array<std::vector<Dim>, CLASSES> dims;
  for (const UOp* r : ranges) {
    Dim d;
    d.size = static_cast<int64_t>(r->src[0]->const_value());
    for (int w = 0; w < VIEWS; w++) d.stride[w] = views[w] ? stride_of(*views[w], r) : 0;
    bool in_a = d.stride[A] != 0, in_b = d.stride[B] != 0;
    bool reduced = std::find(reduce_ranges.begin(), reduce_ranges.end(), r) != reduce_ranges.end();
    Class c;
    if (reduced) {
      if (!in_a || !in_b || d.stride[OUT] != 0 || d.stride[BIAS] != 0) return std::nullopt;
      c = K;
    } else {
      if (!in_a && !in_b) return std::nullopt;  // a broadcast output
      c = in_a && in_b ? BATCH : in_a ? M : N;
      if (d.stride[BIAS] != 0 && c != N) return std::nullopt;
    }
    dims[c].push_back(d);
  }
  for (auto& cls : dims) cls = merge(cls);
  for (Class c : {M, N})
    if (dims[c].size() == 2 && dims[BATCH].empty()) {
      dims[BATCH].push_back(dims[c][0]);
      dims[c].erase(dims[c].begin());
    }
  for (auto& cls : dims)
    if (cls.size() > 1) return std::nullopt;
  if (dims[K].empty() || (dims[M].empty() && dims[N].empty())) return std::nullopt;  // dot products: a reduce
  auto dim = [&](Class c) { return dims[c].empty() ? Dim{} : dims[c][0]; };
  Dim batch = dim(BATCH), m = dim(M), n = dim(N), k = dim(K);
  spec.batch = batch.size;
  spec.m = m.size;
  spec.n = n.size;
  spec.k = k.size;
  spec.a = operand(*a, batch, m, k, A);
  spec.b = operand(*b, batch, k, n, B);
  spec.out = operand(*out, batch, m, n, OUT);
  if (bias) {
    if (spec.n > 1 && n.stride[BIAS] != 1) return std::nullopt;
    spec.bias = operand(*bias, batch, m, n, BIAS);
    spec.bias->stride_col = 1;
  }
  return spec;
}

}  // namespace tg
