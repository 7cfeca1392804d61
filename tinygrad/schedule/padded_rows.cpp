// Padded B rows: a layout the scheduler chooses for matrix products on devices whose policy says
// pad_aliasing_rows (the CPU), by rewriting the lazy graph before it finds kernel boundaries. The
// same rewrite copies transposed B (copy_transposed_b), rounds bfloat16 operands into buffers
// (CpuLimits::bf16_dot) and copies the operands a matmul library cannot read (Note [library
// operands] in library_operands.cpp).
//
// Note [padded B rows]: the register tile of a matmul reads a K-block x 16 panel of B, one cache
// line from each of its rows. When a row of B is a multiple of 1 KB (256, 512, 1024 ... float32
// columns), those lines fall into at most 4 of the L1 cache's 64 sets, which hold 32 lines, so
// the panel never stays in L1 and every tile reads it again from L2. On devices whose policy says
// pad_aliasing_rows (the CPU) a large B (at least 512 KB, Note [cache blocking] in
// codegen/opt_block.cpp) whose rows are contiguous is copied into rows padded by one cache line
// first (a CONTIGUOUS of a PAD: a kernel of its own) and read through a SHRINK of that copy:
// consecutive rows then start in consecutive sets. On the 2-core EPYC a 1024 matmul went from 93
// to 152-160 GFLOP/s, a 2048 one from 79-85 to 135-142, copy included. A float32 B is copied
// into panels instead where the tile's width divides its columns (Note [B panels]).
//
// Note [the matmul form]: the products padded are those `Tensor::matmul` builds, found in the
// graph by their form: a sum over the last axis of a MUL of two operands [..., n, m, k], B the
// one that moves along m (the output's innermost axis) and k and is broadcast over n. Below the
// MUL, through casts, the EXPAND and views that reorder dims or add and drop unit dims, B is the
// first node whose shape is [k, m] with its dims in that order (a matmul's own argument, below
// its casts: the copy is made in the operand's type). A batched B ([batch..., k, m], each batch
// dim one of the product's) gets a transposed copy (Note [transposed B]) but never padded rows.
// The products autograd builds sum over another axis (Note [gradient products]).
//
// Note [gradient products]: autograd's input gradient of a matmul (dA = dY @ B^T) is built from
// the forward product's MUL summed over its m axis, not its last: the output's columns are then
// the last axis, and its "B" is the forward B read along m and k. A 2-D matmul's weight gradient
// (dB = A^T @ dY) sums the MUL [n, k, m] over its first axis, the rows of A: its columns are the
// last axis too, and its "B" is the forward pass's A (or dY), read along the rows and the
// columns. Both get B's layout as a forward product does: a transposed copy where B has strided
// columns (attention's dP = dO @ V^T reads V^T, whose T is strided by the head size), panels
// or padded rows where its rows alias (a Linear's input gradient reads W [out, in]; a weight
// gradient reads the layer's input [batch, in]). Where B's dims are k and m with unit dims
// between that no view below removes (an image batch [n, 1, 28, 28] flattened to [n, 1, 784]),
// B is its [k, m] view. Before this the MLP's weight gradients ran at less than half the rate of
// its forward products (784-512 layer: 7.1 against 3.2 ms, the same FLOPs). Batched weight
// gradients (a 3-D matmul's, summed over two axes) are left alone.
//
// Note [transposed B]: a Linear computes x @ W^T with W stored [out, in], so its product's B is
// read with strided columns: the register tile's contiguous loop (the output column) then moves B
// by a whole row, no tile fits, and the kernel falls back to partial sums along k: on the 2-core
// EPYC x [4096, 128] @ W^T [128, 512] ran at about 30 GFLOP/s against 55-78 with W^T contiguous.
// On devices whose policy says copy_transposed_b (the CPU) such a B is copied into contiguous
// rows first (padded as above where its rows alias), when the product has at least
// MIN_ROWS_FOR_COPY rows of A to amortize the copy (a k x m copy against n k x m products; a
// decoding step's one row keeps the strided read). Attention's scores q @ k^T are such a product
// with a batched B ([batch, heads, head_dim, T]): its copy costs one pass over k.
#include "tinygrad/schedule/padded_rows.h"

#include <algorithm>
#include <unordered_set>

#include "tinygrad/codegen/opt.h"
#include "tinygrad/device.h"
#include "tinygrad/lazy.h"
#include "tinygrad/schedule/library_operands.h"

namespace tg {

namespace {

// Whether a [batch..., k, m] B has contiguous rows: its columns' dim, followed down the views, is
// the innermost dim of the node they view (a transposed B has strided columns).
bool contiguous_rows(const UOp& b) {
  int64_t dim = static_cast<int64_t>(b.shape.size()) - 1;
  const UOp* u = &b;
  for (; !u->realized && op_group(u->op) == OpGroup::Movement; u = u->src[0].get()) {
    if (u->op == Op::PERMUTE) dim = u->arg_ints()[dim];
    if (u->op == Op::RESHAPE && (dim != static_cast<int64_t>(u->shape.size()) - 1 ||
                                 u->src[0]->shape.empty() || u->src[0]->shape.back() != u->shape.back()))
      return false;
    if (u->op == Op::RESHAPE) dim = static_cast<int64_t>(u->src[0]->shape.size()) - 1;
  }
  return dim == static_cast<int64_t>(u->shape.size()) - 1;
}

// Note [padded B rows]: the smallest B worth a copy in another layout.
constexpr int64_t MIN_B_BYTES = 512 * 1024;

bool large_b(const UOp& b) { return prod(b.shape) * static_cast<int64_t>(itemsize(b.dtype)) >= MIN_B_BYTES; }

// Note [padded B rows]: a 2-D [k, m] B of at least MIN_B_BYTES whose rows are a multiple of
// ROW_PERIOD bytes apart (once contiguous).
bool rows_alias(const UOp& b) {
  constexpr int64_t ROW_PERIOD = 1024;
  int64_t item = static_cast<int64_t>(itemsize(b.dtype)), m = b.shape[1];
  return (m * item) % ROW_PERIOD == 0 && large_b(b);
}

// Note [transposed B]
constexpr int64_t MIN_ROWS_FOR_COPY = 32;
// Note [B panels]: the rows of A that amortize copying a B whose rows do not alias into panels
constexpr int64_t MIN_ROWS_FOR_PANELS = 256;

UOpPtr padded_rows(const UOpPtr& b) {
  constexpr int64_t CACHE_LINE = 64;
  int64_t pad = CACHE_LINE / static_cast<int64_t>(itemsize(b->dtype));
  UOpPtr copy = lazy::contiguous(lazy::pad(b, {{0, 0}, {0, pad}}));
  return lazy::shrink(copy, {{0, b->shape[0]}, {0, b->shape[1]}});
}

// Note [B panels]: where a float32 B's rows would be padded (Note [padded B rows]) and the
// register tile's width (CpuTiles::wide_lanes: 32 columns on AVX-512, 16 on AVX2) divides its
// columns, it is copied as m / width panels of k x width instead, each contiguous (the layout
// BLAS libraries pack B into), and read through a view of the copy that is [k, m] again: its
// index (c / width) * k * width + r * width + c % width, which the tile's lanes simplify to a
// panel's offset plus the lane. A tile then reads one contiguous run of B (128 bytes a step on
// AVX-512) instead of one line from each of k rows 8 KB apart: no cache-set aliasing, no padding,
// one page for 32 steps, a stream the hardware prefetchers follow, so its cache blocks can be
// sized from the L2 (Note [blocks of B panels] in codegen/opt_block.cpp). The copy's innermost
// loop is contiguous on both sides (the padded copy's gated loads became gathers). On the 2-core
// Intel Xeon (loaded by other builds), a 2048 matmul's CPU time per product went from about 205
// ms with padded rows to 173 ms with panels, and to 130 ms with the panels' blocks. bfloat16 B
// keeps padded rows: its dot tiles read pairs of rows (Note [bf16 dot tiles] in codegen/cpu_dot.cpp).
// A B whose rows do not alias is copied into panels too when it is large (MIN_B_BYTES) and at
// least MIN_ROWS_FOR_PANELS rows of A read it: a weight gradient's [512, 784] input. Where the
// tile's width does not divide B's columns but half of it does (784 = 49 x 16 on AVX-512), the
// panels are a narrow tile's width.
UOpPtr panels(const UOpPtr& b, int64_t width) {
  int64_t k = b->shape[0], m = b->shape[1];
  UOpPtr copy = lazy::contiguous(lazy::permute(lazy::reshape(b, {k, m / width, width}), {1, 0, 2}));
  return lazy::reshape(lazy::permute(copy, {1, 0, 2}), {k, m});
}

// The product axis each dim of a view's source stands for (-1: a unit or broadcast dim), from
// that of the view's dims; nullopt for a reshape that does more than add or drop unit dims.
using Axes = std::vector<int64_t>;
std::optional<Axes> axes_below(const UOp& view, const Axes& axes) {
  if (view.src.size() != 1) return std::nullopt;
  const Shape& in = view.src[0]->shape;
  Axes below(in.size(), -1);
  switch (view.op) {
    case Op::CAST:
      return axes;
    case Op::EXPAND:
      for (size_t i = 0; i < in.size(); i++) below[i] = in[i] == view.shape[i] ? axes[i] : -1;
      return below;
    case Op::PERMUTE:
      for (size_t i = 0; i < axes.size(); i++) below[static_cast<size_t>(view.arg_ints()[i])] = axes[i];
      return below;
    case Op::RESHAPE: {
      std::vector<size_t> kept_out, kept_in;
      for (size_t i = 0; i < view.shape.size(); i++)
        if (view.shape[i] != 1) kept_out.push_back(i);
      for (size_t i = 0; i < in.size(); i++)
        if (in[i] != 1) kept_in.push_back(i);
      if (kept_out.size() != kept_in.size()) return std::nullopt;
      for (size_t i = 0; i < kept_in.size(); i++) {
        if (in[kept_in[i]] != view.shape[kept_out[i]]) return std::nullopt;
        below[kept_in[i]] = axes[kept_out[i]];
      }
      return below;
    }
    default:
      return std::nullopt;
  }
}

// Whether `axes` (the product axes of a node's dims) are those of a matmul's B: [batch..., k, m],
// its batch dims distinct batch axes of the product in order, before the product's three matrix
// axes (a batched B: Note [transposed B]).
bool is_b_form(const Axes& axes, int64_t k, int64_t m) {
  size_t n = axes.size();
  if (n < 2 || axes[n - 2] != k || axes[n - 1] != m) return false;
  for (size_t i = 0; i + 2 < n; i++)
    if (axes[i] < 0 || axes[i] >= std::min(k, m) - 1 || (i > 0 && axes[i] <= axes[i - 1])) return false;
  return true;
}

// The matmul's B below `side` (Note [the matmul form]), or null: the first node of shape
// [batch..., k, m] whose dims are the product's axes (is_b_form), below its casts. `chain`
// receives the nodes from `side` down to the one above B.
UOpPtr matmul_b(const UOpPtr& side, int64_t k, int64_t m, std::vector<UOpPtr>& chain) {
  UOpPtr n = side;
  Axes axes(side->shape.size());
  for (size_t i = 0; i < axes.size(); i++) axes[i] = static_cast<int64_t>(i);
  while (!is_b_form(axes, k, m)) {
    auto below = n->realized ? std::nullopt : axes_below(*n, axes);
    if (!below) {
      // a node whose dims are k and m with unit dims between (a flattened image batch that a
      // weight gradient reads): B is its [k, m] view, read back through the unit dims
      Axes kept;
      for (size_t i = 0; i < axes.size(); i++)
        if (n->shape[i] != 1) kept.push_back(axes[i]);
      if (kept != Axes{k, m}) return nullptr;
      UOpPtr b = lazy::reshape(n, without_ones(n->shape));
      chain.push_back(lazy::reshape(b, n->shape));
      return b;
    }
    chain.push_back(n);
    axes = *below;
    n = n->src[0];
  }
  while (n->op == Op::CAST && !n->realized) {
    chain.push_back(n);
    n = n->src[0];
  }
  return n;
}

// A copy of `u` over new sources.
UOpPtr with_src(const UOp& u, std::vector<UOpPtr> src) {
  return make_uop(u.op, u.dtype, std::move(src), u.arg, u.shape, u.device);
}

// A product's MUL with the axis it is summed over and the output's column axis: `Tensor::matmul`'s
// form sums the last axis (columns: the one before it); autograd's input gradients of a matmul
// sum the one before the last, and a 2-D matmul's weight gradient the first of three (columns:
// the last). Note [gradient products].
struct ProductForm {
  const UOp* mul = nullptr;
  int64_t reduce = 0, column = 0;
};

// The form of the MUL that `reduce` sums over one of its last two axes, or over the first of
// three (through casts), if any.
std::optional<ProductForm> product_of(const UOp& reduce) {
  const ReduceArg& r = reduce.arg_reduce();
  int64_t last = static_cast<int64_t>(reduce.src[0]->shape.size()) - 1;
  if (r.op != Op::ADD || last < 2 || r.axes.size() != 1) return std::nullopt;
  // a 2-D matmul's weight gradient sums its [k, n, m] product over its first axis
  const bool weight_gradient = last == 2 && r.axes[0] == 0;
  if (r.axes[0] < last - 1 && !weight_gradient) return std::nullopt;
  const UOp* product = reduce.src[0].get();
  while (product->op == Op::CAST && !product->realized) product = product->src[0].get();
  if (product->op != Op::MUL || product->realized) return std::nullopt;
  int64_t axis = r.axes[0];
  return ProductForm{product, axis, axis == last ? last - 1 : last};
}

// The width of the panels a float32 2-D B is copied into (Note [B panels]): the register tile's
// width where it divides B's columns, else half of it (a narrow tile's, Note [rows of a narrow
// tile] in codegen/opt.cpp), else 0 (no panels).
int64_t panel_width(const UOp& b, const DevicePolicy& policy) {
  if (b.dtype != DType::Float32) return 0;
  const int64_t wide = cpu_tiles(policy.cpu).wide_lanes, m = b.shape[1];
  return m % wide == 0 ? wide : m % (wide / 2) == 0 ? wide / 2 : 0;
}

// B in the layout the register tile reads well, or null where it already is (products of every
// form: Note [gradient products]): panels for a float32 B whose rows alias, or of at least
// MIN_B_BYTES where enough rows of A amortize the copy (Note [B panels]); else padded rows where
// contiguous rows alias (Note [padded B rows]), and a contiguous copy of a transposed B (Note
// [transposed B]).
UOpPtr relaid_b(const UOpPtr& b, int64_t a_rows, const DevicePolicy& policy) {
  const bool contiguous = contiguous_rows(*b), amortized = a_rows >= MIN_ROWS_FOR_COPY;
  if (!contiguous && (!policy.copy_transposed_b || !amortized)) return nullptr;
  const bool plain = policy.pad_aliasing_rows && b->shape.size() == 2;
  const bool alias = plain && rows_alias(*b);
  const int64_t width = plain ? panel_width(*b, policy) : 0;
  if (width > 0 && (alias || (a_rows >= MIN_ROWS_FOR_PANELS && large_b(*b)))) return panels(b, width);
  if (alias) return padded_rows(b);
  return contiguous ? nullptr : lazy::contiguous(b);
}

// `product` (a MUL of the given form) with B read from a new layout (relaid_b), or null when it
// is not a matmul or its B keeps its layout.
UOpPtr padded_product(const UOp& product, const ProductForm& form, const DevicePolicy& policy) {
  if (prod(product.shape) == 0) return nullptr;
  for (size_t side = 0; side < product.src.size(); side++) {
    std::vector<UOpPtr> chain;
    UOpPtr b = matmul_b(product.src[side], form.reduce, form.column, chain);
    if (!b) continue;
    // the rows of A that read one B (a batched B serves only its own batch's rows)
    int64_t a_rows = prod(product.shape) / prod(b->shape);
    UOpPtr v = relaid_b(b, a_rows, policy);
    if (!v) continue;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) v = with_src(**it, {v});
    std::vector<UOpPtr> src = product.src;
    src[side] = v;
    return with_src(product, std::move(src));
  }
  return nullptr;
}

// Note [bfloat16 operands in buffers]: on a CPU with bf16 dot tiles (CpuLimits::bf16_dot, Note
// [bf16 dot tiles] in codegen/cpu_dot.cpp) a product's kernel takes the tiles only where it loads
// its bfloat16 operands. An operand computed in bfloat16 (an activation or a gradient cast to it,
// a weight's cast) would be rounded inside the product's kernel, once for every tile of the
// other operand, and B's 32 columns could not be one load. So the bfloat16 node below the
// product's widening cast and its views is realized into a buffer of its own first (one pass
// that rounds each element once), for products of every form (weight gradients too), and the
// widening cast is moved above the views: a copy the product's B then gets (Note [transposed B])
// is made in bfloat16 instead of float32 (an input gradient's W read through W^T^T was copied
// in float32). Other devices and hosts keep the rounding inside the product, as before.
UOpPtr with_bf16_buffer(const UOpPtr& side) {
  std::vector<UOpPtr> views;  // outermost first
  size_t above_cast = 0;
  bool widened = false;
  UOpPtr n = side;
  for (; !n->realized; n = n->src[0]) {
    if (op_group(n->op) == OpGroup::Movement) {
      views.push_back(n);
    } else if (n->op == Op::CAST && !widened && n->dtype == DType::Float32 && n->src[0]->dtype == DType::BFloat16) {
      widened = true;
      above_cast = views.size();
    } else {
      break;
    }
  }
  if (!widened || n->dtype != DType::BFloat16) return nullptr;
  bool computed = !n->realized && is_alu(n->op);
  if (!computed && above_cast == 0) return nullptr;  // loaded, and widened where it is read
  UOpPtr v = computed ? lazy::contiguous(n) : n;
  for (auto it = views.rbegin(); it != views.rend(); ++it)
    v = make_uop((*it)->op, DType::BFloat16, {v}, (*it)->arg, (*it)->shape, (*it)->device);
  return lazy::cast(v, DType::Float32);
}

// Whether `product` (a MUL) reads an operand widened from bfloat16, which with_bf16_buffer relays
// out: float32 products, the common case, leave the graph as it is.
bool reads_bf16(const UOp& product) {
  return std::any_of(product.src.begin(), product.src.end(),
                     [](const UOpPtr& side) { return with_bf16_buffer(side) != nullptr; });
}

// `product` (a MUL) with its computed bfloat16 operands in buffers, or null where it has none.
UOpPtr with_bf16_buffers(const UOp& product) {
  std::vector<UOpPtr> src = product.src;
  bool changed = false;
  for (auto& s : src)
    if (UOpPtr v = with_bf16_buffer(s)) s = v, changed = true;
  return changed ? with_src(product, std::move(src)) : nullptr;
}

// `u` over the rebuilt nodes of its sources, or `u` itself where none of them was rebuilt.
UOpPtr over_rebuilt_sources(const UOpPtr& u, const std::unordered_map<const UOp*, UOpPtr>& replaced) {
  auto rebuilt = [&](const UOpPtr& s) { return replaced.count(s.get()) > 0; };
  if (replaced.empty() || std::none_of(u->src.begin(), u->src.end(), rebuilt)) return u;
  std::vector<UOpPtr> src = u->src;
  for (auto& s : src)
    if (auto it = replaced.find(s.get()); it != replaced.end()) s = it->second;
  return with_src(*u, std::move(src));
}

// The MUL that a sum of products (through casts) reduces, or null.
const UOp* summed_product(const UOp& reduce) {
  if (reduce.arg_reduce().op != Op::ADD) return nullptr;
  const UOp* product = reduce.src[0].get();
  while (product->op == Op::CAST && !product->realized) product = product->src[0].get();
  return product->op == Op::MUL && !product->realized ? product : nullptr;
}

}  // namespace

std::optional<PaddedRows> pad_aliasing_rows(const std::vector<UOpPtr>& outputs, const std::vector<UOpPtr>& order,
                                            const std::function<bool(const UOp*)>& is_input) {
  // the products to relay out, with their form and their device's policy
  std::unordered_map<const UOp*, std::pair<ProductForm, const DevicePolicy*>> products;
  std::unordered_set<const UOp*> bf16_products;     // Note [bfloat16 operands in buffers]
  std::unordered_set<const UOp*> library_copies;  // nodes to copy: Note [library operands]
  for (auto& u : order) {
    if (u->op != Op::REDUCE_AXIS || is_input(u.get())) continue;
    auto form = product_of(*u);
    const DevicePolicy& policy = get_device(u->device).policy();
    if (form && (policy.pad_aliasing_rows || policy.copy_transposed_b)) products.emplace(form->mul, std::make_pair(*form, &policy));
    const UOp* mul = summed_product(*u);
    if (mul && policy.cpu.bf16_dot && reads_bf16(*mul)) bf16_products.insert(mul);
    if (mul && runs_library_products(u->device))
      for (auto& side : mul->src)
        if (const UOp* node = library_copy_point(side)) library_copies.insert(node);
  }
  if (products.empty() && bf16_products.empty() && library_copies.empty()) return std::nullopt;
  // The rebuild below changes a product only where it is relaid out, or a node under it changed;
  // so where no product of the graph as it is would be, nothing changes (a small MLP's products:
  // B too small to pad, A too few rows to copy B for), and the walk over every node is skipped.
  auto relaid = [](const auto& p) { return padded_product(*p.first, p.second.first, *p.second.second) != nullptr; };
  if (bf16_products.empty() && library_copies.empty() && std::none_of(products.begin(), products.end(), relaid))
    return std::nullopt;
  // Note [products above products]: rebuild every node, sources first, and relay a product out
  // after its own sources were rebuilt: an MLP's second product reads the first one's rebuilt
  // output. (Relaying each product out of the original graph left the second product reading
  // the first one's original, un-copied form: that product was computed twice, once per layout,
  // and every product past the first in a model kept its strided B.)
  std::unordered_map<const UOp*, UOpPtr> replaced;
  PaddedRows r;
  for (auto& u : order) {
    if (is_input(u.get())) continue;
    UOpPtr now = over_rebuilt_sources(u, replaced);
    if (bf16_products.count(u.get()))
      if (auto buffered = with_bf16_buffers(*now)) now = buffered;
    if (library_copies.count(u.get())) now = lazy::contiguous(now);
    if (auto p = products.find(u.get()); p != products.end())
      if (auto padded = padded_product(*now, p->second.first, *p->second.second)) now = padded;
    if (now == u) continue;
    r.original_of[now.get()] = u;
    replaced[u.get()] = now;
  }
  if (replaced.empty()) return std::nullopt;
  for (auto& o : outputs) {
    auto it = replaced.find(o.get());
    r.outputs.push_back(it == replaced.end() ? o : it->second);
  }
  return r;
}

}  // namespace tg
