// Movement Tensor methods. All are views (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP and
// compositions of them); indexing by integer tensors compares against arange and reduces.
#include <algorithm>
#include <numeric>

#include "tinygrad/tensor_internal.h"

namespace tg {

Tensor Tensor::reshape(Shape s) const {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) {
      TG_CHECK(infer < 0, "reshape: only one dimension can be -1, got ", shape_str(s), " for ", describe());
      infer = static_cast<int64_t>(i);
    } else {
      TG_CHECK(s[i] >= 0, "reshape: invalid dimension ", s[i], " in ", shape_str(s), " for ", describe());
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TG_CHECK(known != 0 && numel() % known == 0, "reshape: cannot reshape ", describe(), " into ", shape_str(s));
    s[infer] = numel() / known;
  }
  TG_CHECK(tg::prod(s) == numel(), "reshape: cannot reshape ", describe(), " into ", shape_str(s), " (", numel(),
           " elements vs ", tg::prod(s), ")");
  return result(lazy::reshape(uop(), s), {this});
}

Tensor Tensor::permute(std::vector<int64_t> order) const {
  TG_CHECK(static_cast<int64_t>(order.size()) == ndim(), "permute: order ", shape_str(order), " has ", order.size(),
           " dims, tensor ", describe(), " has ", ndim());
  std::vector<bool> seen(order.size(), false);
  for (auto& o : order) {
    o = norm_axis("permute", *this, o);
    TG_CHECK(!seen[o], "permute: axis ", o, " repeats in ", shape_str(order), " for ", describe());
    seen[o] = true;
  }
  return result(lazy::permute(uop(), order), {this});
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  if (ndim() < 2 && (a == -2 || a == 0) && (b == -1)) return *this;
  std::vector<int64_t> order(ndim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[norm_axis("transpose", *this, a)], order[norm_axis("transpose", *this, b)]);
  return permute(order);
}

Tensor Tensor::expand(Shape s) const {
  TG_CHECK(static_cast<int64_t>(s.size()) >= ndim(), "expand: target ", shape_str(s), " has fewer dims than ", describe());
  Tensor x = *this;
  if (static_cast<int64_t>(s.size()) > ndim()) {
    Shape padded(s.size() - ndim(), 1);
    padded.insert(padded.end(), shape().begin(), shape().end());
    x = reshape(padded);
  }
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) s[i] = x.shape()[i];
    TG_CHECK(x.shape()[i] == s[i] || x.shape()[i] == 1, "expand: cannot expand ", describe(), " to ", shape_str(s));
  }
  return result(lazy::expand(x.uop(), s), {&x});
}

Tensor Tensor::broadcast_to(const Shape& s) const {
  if (s == shape()) return *this;
  return expand(s);
}

Tensor Tensor::pad(const std::vector<std::pair<int64_t, int64_t>>& pads_in, double value) const {
  TG_CHECK(static_cast<int64_t>(pads_in.size()) <= ndim(), "pad: ", pads_in.size(), " pads for ", describe());
  // pads name the first dims; negative pads crop
  lazy::Pads pads(ndim(), {0, 0}), crop;
  for (size_t i = 0; i < pads_in.size(); i++) pads[i] = pads_in[i];
  bool any_crop = false;
  for (int64_t i = 0; i < ndim(); i++) {
    int64_t b = std::max<int64_t>(0, -pads[i].first), e = shape()[i] - std::max<int64_t>(0, -pads[i].second);
    TG_CHECK(b <= e, "pad: negative pads remove more than dim ", i, " of ", describe(), " has");
    crop.push_back({b, e});
    any_crop |= pads[i].first < 0 || pads[i].second < 0;
    pads[i] = {std::max<int64_t>(0, pads[i].first), std::max<int64_t>(0, pads[i].second)};
  }
  Tensor x = any_crop ? shrink(crop) : *this;
  Tensor padded = result(lazy::pad(x.uop(), pads), {&x});
  if (value == 0) return padded;
  Tensor inside(lazy::pad(lazy::constant(1, DType::Bool, device(), x.shape()), pads));
  return inside.where(padded, padded.scalar_like(value).cast(dtype()));
}

Tensor Tensor::shrink(const std::vector<std::pair<int64_t, int64_t>>& bounds_in) const {
  TG_CHECK(static_cast<int64_t>(bounds_in.size()) <= ndim(), "shrink: ", bounds_in.size(), " bounds for ", describe());
  lazy::Pads b;
  for (int64_t i = 0; i < ndim(); i++) {
    auto r = i < static_cast<int64_t>(bounds_in.size()) ? bounds_in[i] : std::pair<int64_t, int64_t>{0, shape()[i]};
    TG_CHECK(0 <= r.first && r.first <= r.second && r.second <= shape()[i], "shrink: bounds [", r.first, ", ",
             r.second, ") are outside dim ", i, " of ", describe());
    b.push_back(r);
  }
  return result(lazy::shrink(uop(), b), {this});
}

Tensor Tensor::flip(std::vector<int64_t> axes) const {
  for (auto& a : axes) a = norm_axis("flip", *this, a);
  return result(lazy::flip(uop(), axes), {this});
}

Tensor Tensor::squeeze(std::optional<int64_t> axis) const {
  Shape s;
  if (!axis) {
    for (auto d : shape())
      if (d != 1) s.push_back(d);
  } else {
    if (ndim() == 0) return *this;
    int64_t a = norm_axis("squeeze", *this, *axis);
    if (shape()[a] != 1) return *this;
    s = shape();
    s.erase(s.begin() + a);
  }
  return reshape(s);
}

Tensor Tensor::unsqueeze(int64_t axis) const {
  int64_t a = norm_axis("unsqueeze", *this, axis, 1);
  Shape s = shape();
  s.insert(s.begin() + a, 1);
  return reshape(s);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (ndim() == 0) return reshape({1});
  int64_t a = norm_axis("flatten", *this, start), b = norm_axis("flatten", *this, end);
  TG_CHECK(a <= b, "flatten: start dim ", start, " is after end dim ", end, " for ", describe());
  Shape s(shape().begin(), shape().begin() + a);
  int64_t m = 1;
  for (int64_t i = a; i <= b; i++) m *= shape()[i];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + b + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::repeat(const std::vector<int64_t>& times) const {
  TG_CHECK(static_cast<int64_t>(times.size()) >= ndim(), "repeat: ", times.size(), " repeat counts for ", describe());
  Shape base(times.size() - ndim(), 1);
  base.insert(base.end(), shape().begin(), shape().end());
  Shape unsq, expd, fin;
  for (size_t i = 0; i < times.size(); i++) {
    TG_CHECK(times[i] >= 0, "repeat: negative count ", times[i]);
    unsq.push_back(1), unsq.push_back(base[i]);
    expd.push_back(times[i]), expd.push_back(base[i]);
    fin.push_back(times[i] * base[i]);
  }
  return reshape(unsq).expand(expd).reshape(fin);
}

Tensor Tensor::slice(const std::vector<Index>& idx) const {
  Tensor x = *this;
  Shape final_shape;
  int64_t dim = 0;
  size_t consumed = 0;
  for (auto& i : idx) consumed += i.kind != Index::Kind::NewAxis;
  TG_CHECK(static_cast<int64_t>(consumed) <= ndim(), "index: ", consumed, " indices for ", describe());
  lazy::Pads bounds;
  std::vector<int64_t> flips, steps;
  Shape keep;  // output shape after ints are dropped and new axes added
  for (auto& i : idx) {
    if (i.kind == Index::Kind::NewAxis) {
      keep.push_back(-2);
      continue;
    }
    int64_t n = shape()[dim];
    if (i.kind == Index::Kind::Int) {
      int64_t v = i.i < 0 ? i.i + n : i.i;
      TG_CHECK(v >= 0 && v < n, "index: index ", i.i, " is out of bounds for dim ", dim, " with size ", n, " (",
               describe(), ")");
      bounds.push_back({v, v + 1});
      steps.push_back(1);
    } else if (i.kind == Index::Kind::All) {
      bounds.push_back({0, n});
      steps.push_back(1);
      keep.push_back(dim);
    } else {
      int64_t st = i.s.step;
      TG_CHECK(st != 0, "index: slice step cannot be zero (dim ", dim, " of ", describe(), ")");
      auto clampi = [&](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v < 0 ? v + n : v)); };
      int64_t b, e;
      if (st > 0) {
        b = i.s.begin ? clampi(*i.s.begin, 0, n) : 0;
        e = i.s.end ? clampi(*i.s.end, 0, n) : n;
        e = std::max(b, e);
        bounds.push_back({b, e});
      } else {
        // negative step: take (end, begin] reversed
        b = i.s.begin ? clampi(*i.s.begin, -1, n - 1) : n - 1;
        e = i.s.end ? clampi(*i.s.end, -1, n - 1) : -1;
        if (i.s.end && *i.s.end < -n) e = -1;
        e = std::min(b, e);
        bounds.push_back({e + 1, b + 1});
        flips.push_back(dim);
      }
      steps.push_back(std::abs(st));
      keep.push_back(dim);
    }
    dim++;
  }
  for (; dim < ndim(); dim++) bounds.push_back({0, shape()[dim]}), steps.push_back(1), keep.push_back(dim);
  x = x.shrink(bounds).flip(flips);
  // strides: pad each strided dim to a multiple of its step, split, keep the first of each group
  bool strided = std::any_of(steps.begin(), steps.end(), [](int64_t s) { return s > 1; });
  if (strided) {
    std::vector<std::pair<int64_t, int64_t>> pads;
    Shape split;
    lazy::Pads take;
    for (int64_t d = 0; d < x.ndim(); d++) {
      int64_t n = x.shape()[d], st = steps[d], m = (n + st - 1) / st;
      pads.push_back({0, m * st - n});
      split.push_back(m), split.push_back(st);
      take.push_back({0, m}), take.push_back({0, 1});
    }
    Shape collapsed;
    x = x.pad(pads).reshape(split).shrink(take);
    for (int64_t d = 0; d < static_cast<int64_t>(steps.size()); d++) collapsed.push_back(x.shape()[2 * d]);
    x = x.reshape(collapsed);
  }
  for (auto k : keep) final_shape.push_back(k == -2 ? 1 : x.shape()[k]);
  return x.reshape(final_shape);
}

// Gather, index_select and scatter_add are GATHER and SCATTER_ADD nodes (Note [gather and
// scatter-add] in lazy.cpp): O(N) in the elements they read or add, forward and backward.
Tensor Tensor::gather(int64_t axis, const Tensor& index) const {
  int64_t a = norm_axis("gather", *this, axis);
  TG_CHECK(!is_float(index.dtype()), "gather: index must be an integer tensor, got ", index.describe());
  TG_CHECK(index.ndim() == ndim(), "gather: index ", index.describe(), " must have as many dims as ", describe());
  check_same_device("gather", *this, index);
  lazy::Pads b;
  for (int64_t d = 0; d < ndim(); d++) {
    TG_CHECK(d == a || index.shape()[d] <= shape()[d], "gather: index ", index.describe(), " is larger than ",
             describe(), " in dim ", d);
    b.push_back({0, d == a ? shape()[d] : index.shape()[d]});
  }
  return result(lazy::gather(shrink(b).uop(), index.uop(), a), {this, &index});
}

Tensor Tensor::index_select(int64_t axis, const Tensor& index) const {
  int64_t a = norm_axis("index_select", *this, axis);
  TG_CHECK(!is_float(index.dtype()) && index.ndim() == 1, "index_select: index must be a 1-D integer tensor, got ",
           index.describe());
  check_same_device("index_select", *this, index);
  Shape at(static_cast<size_t>(ndim()), 1), out = shape();
  at[static_cast<size_t>(a)] = out[static_cast<size_t>(a)] = index.numel();
  return gather(a, index.reshape(at).expand(out));
}

Tensor Tensor::scatter_add(int64_t axis, const Tensor& index, const Tensor& src) const {
  int64_t a = norm_axis("scatter_add", *this, axis);
  TG_CHECK(!is_float(index.dtype()), "scatter_add: index must be an integer tensor, got ", index.describe());
  TG_CHECK(index.shape() == src.shape(), "scatter_add: index ", index.describe(), " and src ", src.describe(),
           " must have the same shape");
  TG_CHECK(src.ndim() == ndim(), "scatter_add: src ", src.describe(), " must have as many dims as ", describe());
  check_same_device("scatter_add", *this, index);
  check_same_device("scatter_add", *this, src);
  lazy::Pads grow;
  for (int64_t d = 0; d < ndim(); d++) {
    TG_CHECK(d == a || src.shape()[d] <= shape()[d], "scatter_add: src ", src.describe(), " is larger than ",
             describe(), " in dim ", d);
    grow.push_back({0, d == a ? 0 : shape()[d] - src.shape()[d]});
  }
  Tensor added = result(lazy::scatter_add(src.cast(dtype()).uop(), index.uop(), a, shape()[a]), {&src, &index});
  return *this + added.pad(grow);
}

Tensor Tensor::cat(const Tensors& ts, int64_t axis) {
  TG_CHECK(!ts.empty(), "cat: needs at least one tensor");
  int64_t a = norm_axis("cat", ts[0], axis);
  int64_t total = 0;
  DType dt = ts[0].dtype();
  for (auto& t : ts) {
    TG_CHECK(t.ndim() == ts[0].ndim(), "cat: ", t.describe(), " and ", ts[0].describe(), " differ in rank");
    check_same_device("cat", ts[0], t);
    for (int64_t d = 0; d < t.ndim(); d++)
      TG_CHECK(d == a || t.shape()[d] == ts[0].shape()[d], "cat: ", t.describe(), " and ", ts[0].describe(),
               " differ in dim ", d);
    total += t.shape()[a];
    dt = promote(dt, t.dtype());
  }
  std::optional<Tensor> out;
  int64_t offset = 0;
  for (auto& t : ts) {
    std::vector<std::pair<int64_t, int64_t>> p(t.ndim(), {0, 0});
    p[a] = {offset, total - offset - t.shape()[a]};
    offset += t.shape()[a];
    Tensor padded = t.cast(dt).pad(p);
    out = out ? *out + padded : padded;
  }
  return *out;
}

Tensor Tensor::stack(const Tensors& ts, int64_t axis) {
  TG_CHECK(!ts.empty(), "stack: needs at least one tensor");
  int64_t a = norm_axis("stack", ts[0], axis, 1);
  Tensors u;
  for (auto& t : ts) {
    TG_CHECK(t.shape() == ts[0].shape(), "stack: ", t.describe(), " and ", ts[0].describe(), " differ in shape");
    u.push_back(t.unsqueeze(a));
  }
  return cat(u, a);
}

Tensors Tensor::split(const std::vector<int64_t>& sizes, int64_t axis) const {
  int64_t a = norm_axis("split", *this, axis);
  int64_t total = 0;
  for (auto s : sizes) total += s;
  TG_CHECK(total == shape()[a], "split: sizes ", shape_str(sizes), " do not add up to dim ", a, " of ", describe());
  Tensors out;
  int64_t offset = 0;
  for (auto s : sizes) {
    std::vector<std::pair<int64_t, int64_t>> b;
    for (int64_t d = 0; d < ndim(); d++) b.push_back(d == a ? std::pair{offset, offset + s} : std::pair{int64_t{0}, shape()[d]});
    out.push_back(shrink(b));
    offset += s;
  }
  return out;
}

Tensors Tensor::split(int64_t size, int64_t axis) const {
  TG_CHECK(size > 0, "split: size must be positive, got ", size);
  int64_t n = shape(axis);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < n; i += size) sizes.push_back(std::min(size, n - i));
  return split(sizes, axis);
}

Tensors Tensor::chunk(int64_t n, int64_t axis) const {
  TG_CHECK(n > 0, "chunk: number of chunks must be positive, got ", n);
  int64_t d = shape(axis);
  return split(std::max<int64_t>(1, (d + n - 1) / n), axis);
}

}  // namespace tg
