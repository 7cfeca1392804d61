// Linear algebra and neural-network compositions: matmul, conv2d and pooling (sliding windows
// built from movement ops), normalisation, dropout, losses.
#include <cmath>

#include "tinygrad/device.h"
#include "tinygrad/gradient.h"
#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

std::vector<int64_t> expand_param(const char* op, const char* what, std::vector<int64_t> v, size_t n) {
  TG_CHECK(v.size() == 1 || v.size() == n, op, ": ", what, " needs 1 or ", n, " values, got ", v.size());
  if (v.size() == 1) v.assign(n, v[0]);
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Note [channel-last convolutions]: on the CPU a convolution reduces into [N, oy, ox, Cout] and
// its weight gradient into [kh, kw, Cin, Cout] (per group), then views them back as NCHW and
// [Cout, Cin, kh, kw]. The output channel is then the kernel's contiguous output loop, and the
// weights (forward: copied once into [Cin, kh, kw, Cout]) or the output gradient (weight gradient:
// copied once into [N, oy, ox, Cout]) are contiguous along it while the input is the same for
// every channel: the kernel optimizer's register tile is vectors of output channels times a few
// output pixels (forward) or input channels (weight gradient), one broadcast input value per
// vector FMA, whatever the image width. In NCHW the contiguous loop was the output row, 20, 8 or
// 6 wide on the CNN, which no vector width divides. The copies cost a few milliseconds against
// the convolution's hundreds (forward: the reduce is stored channel-last, and the CUSTOM_GRAD
// realize point transposes it). The weight gradient reduces over the batch in blocks of images
// (weight_gradient_images: Note [weight gradient blocks]), into one partial sum per
// block that a second small reduce adds up: a block's input and output gradient stay in the L2
// cache while every tile of the weight gradient passes over them, and the blocks give the thread
// pool an outer loop to split. The weight gradient of the CNN's 32->32 5x5 layer at batch 512
// took 1.13 s on both cores in NCHW and takes about 0.14 s of one core's time channel-last.
// GPU-style devices keep the NCHW reduces (their kernels get no register tiles). The device policy
// says which (DevicePolicy::channels_last_convolutions), read while the graph is built: Note
// [convolution layout while building].
//
// Note [convolution layout while building]: padded B rows are a layout of the same nodes, which
// the scheduler chooses (schedule/padded_rows.cpp); a channel-last convolution is another graph.
// Its forward reduce runs over other axes against a copy of the weights, its weight gradient is
// two reduces (partial sums per block of images, then their sum) against a copy of the output
// gradient, and the NCHW transposed convolution reads a copy of the flipped weight. The scheduler
// sees none of this as a convolution: the CUSTOM_GRAD node that names one exists only with
// gradients on, and the weight gradient is built from primitives by conv2d_gradient. Choosing the
// layout there would mean recognising both reduces from their views and rebuilding the blocked
// weight gradient in a pattern matcher, a second copy of the index bookkeeping below. So conv2d
// and its gradient rule ask the device's policy when they build the graph: the choice is the
// device's, made in its DevicePolicy, and only read here.
bool channels_last(const std::string& device) { return get_device(device).policy().channels_last_convolutions; }

// Note [half products in float32]: a matmul or convolution of float16/bfloat16 operands casts
// them to float32 (arith_dtype) before multiplying, so it multiplies and sums in float32 and
// rounds only the result, as tensor cores do (a product of two half values is exact in float32).
// Multiplying in the half type would round every product before the sum:
// (1+2^-7)*(1+2^-6) - (1+2^-6+2^-7) would be 0 instead of 2^-13.

// The dtype a convolution's channel-last copy of operand t is made in: the product's `acc`, or
// t's own bfloat16 where the CPU multiplies bfloat16 in dot tiles (Note [bf16 dot tiles] in
// codegen/cpu_dot.cpp), whose kernels load it as it is stored.
DType copy_dtype(const Tensor& t, DType acc) {
  return t.dtype() == DType::BFloat16 && get_device(t.device()).policy().cpu.bf16_dot ? t.dtype() : acc;
}

}  // namespace

// Note [weight gradient blocks]: a block's images are read by every register tile of the weight
// gradient, so they should stay in the L2; each block also writes a whole weight's partial sum,
// which the second reduce reads back. Blocks of at most 1024 output pixels (2 of the CNN's 20 x 20
// images, 250 KB of input and gradient) made 256 partial sums of its 32->32 5x5 weight at batch
// 512, 26 MB written and read back: the second reduce took 2.5-3.1 ms. Half the L2 holds 8 of
// those images on the 2-core Intel Xeon (2 MB L2), and their 64 partial sums take 0.7 ms to add
// up as AVX2 (0.36 ms against 1.4 with AVX-512); the first reduce kept its time (about 56 ms as
// AVX2), where 16 images a block (the whole L2) took 65 ms. The whole CNN step's time stayed
// within its noise (medians of 4 alternated runs: 282 against 283 ms as AVX2, 183 against 181 ms
// with AVX-512).
int64_t weight_gradient_images(int64_t n, int64_t image_bytes, int64_t l2_bytes) {
  int64_t best = 1;
  for (int64_t b = 1; b <= n; b++)
    if (n % b == 0 && b * image_bytes <= l2_bytes / 2) best = b;
  return best;
}

Tensor Tensor::matmul(const Tensor& o) const {
  TG_CHECK(ndim() >= 1 && o.ndim() >= 1, "matmul: both operands need at least one dim (a: ", describe(), ", b: ",
           o.describe(), ")");
  check_same_device("matmul", *this, o);
  Tensor a = ndim() == 1 ? unsqueeze(0) : *this;
  Tensor b = o.ndim() == 1 ? o.unsqueeze(-1) : o;
  TG_CHECK(a.shape().back() == b.shape()[b.ndim() - 2], "matmul: a.shape[-1]=", a.shape().back(),
           " != b.shape[-2]=", b.shape()[b.ndim() - 2], " (a: ", describe(), ", b: ", o.describe(), ")");
  // [..., n, k] x [..., k, m] -> [..., n, 1, k] * [..., 1, m, k] summed over k; the scheduler may
  // read a large B through padded rows (Note [padded B rows] in schedule/padded_rows.cpp)
  // Note [half products in float32]
  DType out = promote(dtype(), o.dtype()), acc = arith_dtype(out);
  Tensor prod = a.cast(acc).unsqueeze(-2) * b.cast(acc).transpose(-1, -2).unsqueeze(-3);
  Tensor r = prod.sum(-1).cast(out);
  if (ndim() == 1) r = r.squeeze(-2);
  if (o.ndim() == 1) r = r.squeeze(-1);
  return r;
}

// Note [linear layers as one product]: an input with several leading dims ([batch, tokens,
// features]) is flattened to one matrix of rows before the product and its result reshaped back,
// as PyTorch's linear does: the product is then one 2-D matmul, and so are both of its
// gradients. Over [batch, tokens] the weight gradient would sum over two axes, a form the CPU's
// B panels do not take (Note [gradient products] in schedule/padded_rows.cpp); flattened, the
// character GPT's step took about 14% less CPU time on the 2-core Intel Xeon. The GPU schedule of
// a GPT-2 block keeps its kernels and library products: the same products, over 16384 rows.
Tensor Tensor::linear(const Tensor& weight, const std::optional<Tensor>& bias) const {
  Tensor r;
  if (ndim() > 2) {
    Shape out = shape();
    out.back() = weight.shape(0);
    r = reshape({-1, shape().back()}).matmul(weight.T()).reshape(out);
  } else {
    r = matmul(weight.T());
  }
  return bias ? r + *bias : r;
}

// Note [sliding windows from movement ops]: for one dim of size i, kernel k, stride s,
// dilation d, we want y[o, kk] = x[o*s + kk*d]. Repeat x enough times to fill a flat run of
// k*w elements with w = i*f + d (f >= 1 chosen so that w >= o*s); read as [k, w], row kk starts
// at flat kk*w = kk*d (mod i), so y[o, kk] = row kk, column o*s. Taking columns [0, o*s) split
// as [o, s] and keeping s-index 0 gives the windows. Index simplification later turns the
// modulo arithmetic back into plain strides. Disjoint windows (s == k, d == 1: the usual
// max_pool2d) skip the repeat: x[:o*k] reshaped to [o, k] is already them, and the gradient of
// a reshape is a reshape, where the repeat's gradient would be a division-heavy fold.
Tensor Tensor::pool_windows(const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                            const std::vector<int64_t>& dilation) const {
  size_t nk = kernel.size();
  TG_CHECK(static_cast<size_t>(ndim()) >= nk, "pool: ", nk, "-d window on ", describe());
  size_t lead = ndim() - nk;
  Tensor x = *this;
  Shape outs;
  for (size_t j = 0; j < nk; j++) {
    int64_t i = shape()[lead + j], k = kernel[j], s = stride[j], d = dilation[j];
    TG_CHECK(k > 0 && s > 0 && d > 0, "pool: kernel, stride and dilation must be positive");
    TG_CHECK(i >= d * (k - 1) + 1, "pool: window ", k, " (dilation ", d, ") is larger than dim ", lead + j, " of ",
             describe());
    outs.push_back((i - d * (k - 1) - 1) / s + 1);
  }
  // one dim at a time: the dim being windowed sits at position `lead + j`, windows go to the end
  for (size_t j = 0; j < nk; j++) {
    int64_t pos = static_cast<int64_t>(lead + j);
    int64_t i = x.shape()[pos], k = kernel[j], s = stride[j], d = dilation[j], o = outs[j];
    int64_t f = std::max<int64_t>(1, ceil_div(std::max<int64_t>(0, o * s - d), i));
    int64_t w = i * f + d;
    int64_t reps = ceil_div(k * w, i);
    // move the dim to the end, windowize there, move [o] back and keep [k] at the end
    std::vector<int64_t> order;
    for (int64_t a = 0; a < x.ndim(); a++)
      if (a != pos) order.push_back(a);
    order.push_back(pos);
    Tensor t = x.permute(order);  // [..., i]
    Shape base(t.shape().begin(), t.shape().end() - 1);
    auto with = [&](std::initializer_list<int64_t> tail) {
      Shape s2 = base;
      s2.insert(s2.end(), tail);
      return s2;
    };
    auto bounds = [&](std::initializer_list<std::pair<int64_t, int64_t>> tail) {
      std::vector<std::pair<int64_t, int64_t>> b;
      for (auto v : base) b.push_back({0, v});
      b.insert(b.end(), tail);
      return b;
    };
    if (s == k && d == 1) {
      // disjoint windows (see the note above)
      int64_t nb = static_cast<int64_t>(base.size());
      std::vector<int64_t> swap;
      for (int64_t a = 0; a < nb; a++) swap.push_back(a);
      swap.push_back(nb + 1);
      swap.push_back(nb);
      t = t.shrink(bounds({{0, o * k}})).reshape(with({o, k})).permute(swap);  // [..., k, o]
    } else {
      t = t.unsqueeze(-2).expand(with({reps, i})).reshape(with({reps * i}));
      t = t.shrink(bounds({{0, k * w}})).reshape(with({k, w}));
      t = t.shrink(bounds({{0, k}, {0, o * s}})).reshape(with({k, o, s}));
      t = t.shrink(bounds({{0, k}, {0, o}, {0, 1}})).reshape(with({k, o}));  // [..., k, o]
    }
    // back: [other dims with o at pos] + [earlier window dims] + [k]
    int64_t nb = static_cast<int64_t>(base.size());
    std::vector<int64_t> back;
    for (int64_t a = 0; a < pos; a++) back.push_back(a);
    back.push_back(nb + 1);  // o
    for (int64_t a = pos; a < nb; a++) back.push_back(a);
    back.push_back(nb);  // k
    x = t.permute(back);
  }
  // x is [..., o1..ok, (rest of the original trailing dims are none), k1..kk]
  return x;
}

Tensor Tensor::conv2d(const Tensor& weight, const std::optional<Tensor>& bias, std::vector<int64_t> stride,
                      std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) const {
  TG_CHECK(ndim() == 4, "conv2d: input must be [N, C, H, W], got ", describe());
  TG_CHECK(weight.ndim() == 4, "conv2d: weight must be [Cout, Cin/groups, kH, kW], got ", weight.describe());
  check_same_device("conv2d", *this, weight);
  int64_t n = shape()[0], cin = shape()[1], cout = weight.shape()[0];
  TG_CHECK(groups > 0 && cin % groups == 0 && cout % groups == 0, "conv2d: groups=", groups,
           " must divide input channels ", cin, " and output channels ", cout);
  TG_CHECK(weight.shape()[1] * groups == cin, "conv2d: weight ", weight.describe(), " expects ", weight.shape()[1] * groups,
           " input channels, input ", describe(), " has ", cin);
  stride = expand_param("conv2d", "stride", stride, 2);
  padding = expand_param("conv2d", "padding", padding, 2);
  dilation = expand_param("conv2d", "dilation", dilation, 2);
  int64_t kh = weight.shape()[2], kw = weight.shape()[3];
  Tensor x = pad({{0, 0}, {0, 0}, {padding[0], padding[0]}, {padding[1], padding[1]}});
  Tensor win = x.pool_windows({kh, kw}, stride, dilation);  // [N, Cin, oy, ox, kh, kw]
  int64_t oy = win.shape()[2], ox = win.shape()[3], cg = cin / groups;
  int64_t cog = cout / groups;
  DType out_dtype = promote(dtype(), weight.dtype()), acc = arith_dtype(out_dtype);  // Note [half products in float32]
  Tensor wa = weight.cast(acc);
  win = win.cast(acc);
  Tensor out;
  if (channels_last(device())) {
    // Note [channel-last convolutions]
    Tensor xw = win.reshape({n, groups, cg, oy, ox, kh, kw})
                    .permute({0, 3, 4, 1, 2, 5, 6})
                    .reshape({n, oy, ox, groups, 1, cg, kh, kw});
    Tensor ww = weight.reshape({groups, cog, cg, kh, kw})
                    .permute({0, 2, 3, 4, 1})
                    .cast(copy_dtype(weight, acc))
                    .contiguous()  // [G, cg, kh, kw, cog]
                    .cast(acc)
                    .permute({0, 4, 1, 2, 3})
                    .reshape({1, 1, 1, groups, cog, cg, kh, kw});
    out = (xw * ww).sum({5, 6, 7}).contiguous().reshape({n, oy, ox, cout}).permute({0, 3, 1, 2});
  } else {
    Tensor xw = win.reshape({n, groups, 1, cg, oy, ox, kh, kw});
    Tensor ww = wa.reshape({1, groups, cog, cg, 1, 1, kh, kw});
    out = (xw * ww).sum({3, 6, 7}).reshape({n, cout, oy, ox});
  }
  out = out.cast(out_dtype);
  // the value is the composition above; its gradient comes from conv2d_gradient (Note [conv2d
  // gradient]). Under a NoGradGuard (evaluation) the output is not wrapped: a CUSTOM_GRAD node is
  // a realize point kept with its node (Note [kept convolution outputs] in
  // schedule/schedule.cpp), which an evaluation pass would hold to its end. (The transposed
  // convolution of a backward pass stays wrapped: there it is the realize point that both of
  // its readers share.)
  if (!NoGradGuard::enabled()) {
    std::vector<int64_t> params{static_cast<int64_t>(CustomGrad::CONV2D), stride[0], stride[1], padding[0],
                                padding[1], dilation[0], dilation[1], groups};
    out = result(lazy::custom_grad(out.uop(), {uop(), weight.uop()}, params), {this, &weight});
  }
  if (bias) {
    TG_CHECK(bias->ndim() == 1 && bias->shape()[0] == cout, "conv2d: bias ", bias->describe(), " must be [", cout, "]");
    out = out + bias->reshape({1, cout, 1, 1});
  }
  return out;
}

// Note [conv2d gradient]: differentiating the composition above through its primitives would
// materialize the gradient of the windows, [N, Cin, oy, ox, kh, kw] (kh*kw times the input), and
// then fold it back onto the input with a reduce over the repeat of Note [sliding windows from
// movement ops], whose indices are all division and modulo. conv2d instead wraps its value in a
// CUSTOM_GRAD node whose rule builds both gradients from forward primitives:
//   dW[co, ci, i, j] = sum over n, y, x of g[n, co, y, x] * xpad[n, ci, y*s + i*d, x*s + j*d]
//     (the windows times the output gradient, one reduce, nothing materialized), and
//   dX = conv2d(g dilated by the stride (s-1 zeros between elements) and padded by d*(k-1) - p
//     (negative: cropped) on the leading side and whatever makes the output size H on the
//     trailing side, with the weight flipped in both spatial dims and its channel dims swapped
//     within each group, stride 1, the same dilation and groups): the transposed convolution.
// Both are ordinary graph nodes (dX is itself a conv2d, so it has this rule too).
//
// Note [a weight gradient reads its input from memory]: the input x of a convolution is mostly
// an activation computed from a kept convolution output (relu(conv + bias): Note [kept
// convolution outputs] in schedule/schedule.cpp), and the scheduler leaves sliding windows fused
// (Note [product operands] there). In the channel-last weight gradient each input value is a
// broadcast scalar against a vector of output channels, so a fused activation is recomputed
// (a load of the bias, an add, a max) for every one of the kernel's FMAs, kh*kw*Cout/16 times
// per element: the CNN's 5x5 32->32 weight gradient took 84 ms instead of the 48 ms it takes on a
// plain input (2-core AMD EPYC Zen 4, batch 512). On channel-last devices the rule realizes x
// first (one pass, a kernel of a few milliseconds, its buffer freed after the backward
// schedule; nothing where x is a buffer already). The forward convolution keeps reading the
// activation fused: its tile amortizes the recompute over more outputs, and realizing it there
// would keep one more activation alive from the forward pass to the backward one.
//
// Note [transposed convolutions skip the padded rows]: the input gradient reads the output
// gradient padded by d*(k-1) - p on each side; a 5x5 one over the CNN's 20 x 20 rows computes
// 24 x 24 outputs of 25 taps, 44% of them on the padding. On channel-last devices the columns
// are padded in memory (the kernel's register tile spans several output columns, whose taps
// reach different columns) and the rows through a view: each row's load is then gated by the
// row's validity, and the CPU pipeline runs the tap-row loop of every output row over the taps
// that reach a row of the gradient only (Note [reduce loops skip gated zeros] in
// codegen/reduce_bounds.cpp): 20 x 5 tap rows instead of 24 x 5. bfloat16 dot tiles (Note [bf16
// dot tiles] in codegen/cpu_dot.cpp) keep their loops and would load the gated rows element by
// element: where they take the convolution, both dims are padded in memory.
//
// Note [the output gradient channel-last]: both channel-last gradients read copies of the output
// gradient g, never g itself: the weight gradient [N, oy, ox, Cout], the transposed convolution
// g dilated and padded. So in float32 on the CPU g is realized once as [N, oy, ox, Cout] (the
// transposing write that made the weight gradient's copy, now from g's own expression) and the
// padded copy is made from it in the same layout, [N, oy', ox', Cout], which the transposed
// convolution reads through an NCHW view; a plain NCHW realize of g (a pass over it, 3 to 5 ms
// for the CNN's 32 x 20 x 20 at batch 512) is gone. g is still realized: its expression (the
// BatchNorm's and max-pool's backward) is too costly to compute in both copies: the padded copy
// took many times as long from it.
std::vector<UOpPtr> conv2d_gradient(const UOpPtr& node, const UOpPtr& grad) {
  const auto& a = node->arg_ints();  // {rule, sy, sx, py, px, dy, dx, groups}
  std::vector<int64_t> stride{a[1], a[2]}, padding{a[3], a[4]}, dilation{a[5], a[6]};
  int64_t groups = a[7];
  Tensor x(node->src[1]), w(node->src[2]), g(grad);
  int64_t n = x.shape(0), cin = x.shape(1), h = x.shape(2), wd = x.shape(3);
  int64_t cout = w.shape(0), cg = w.shape(1), kh = w.shape(2), kw = w.shape(3), cog = cout / groups;
  int64_t oy = g.shape(2), ox = g.shape(3);
  DType acc = arith_dtype(promote(x.dtype(), g.dtype()));  // Note [half products in float32]
  // g is realized once: both gradients read each of its elements kh*kw times or more; in float32
  // on the CPU as [N, oy, ox, Cout] (Note [the output gradient channel-last])
  bool gt_first = channels_last(x.device()) && copy_dtype(g, acc) == acc;
  Tensor gt = gt_first ? g.permute({0, 2, 3, 1}).cast(acc).contiguous() : Tensor();
  g = gt_first ? gt.permute({0, 3, 1, 2}) : g.contiguous();

  // Note [a weight gradient reads its input from memory]
  Tensor xin = channels_last(x.device()) ? x.contiguous() : x;
  Tensor win = xin.pad({{0, 0}, {0, 0}, {padding[0], padding[0]}, {padding[1], padding[1]}})
                   .pool_windows({kh, kw}, stride, dilation);  // [N, Cin, oy, ox, kh, kw]
  Tensor wa = win.cast(acc), ga = g.cast(acc);
  Tensor dw;
  if (channels_last(x.device())) {
    // Note [channel-last convolutions]: partial sums over blocks of images, [blocks, G, kh, kw, cg, cog]
    if (!gt_first) gt = g.permute({0, 2, 3, 1}).cast(copy_dtype(g, acc)).contiguous().cast(acc);  // [N, oy, ox, Cout]
    int64_t image_bytes = (cin * h * wd + oy * ox * cout) * static_cast<int64_t>(itemsize(acc));
    int64_t nb = weight_gradient_images(n, image_bytes, get_device(x.device()).policy().cpu.l2_bytes);
    int64_t blocks = n / nb;
    Tensor wv = wa.reshape({blocks, nb, groups, cg, oy, ox, kh, kw})
                    .permute({0, 1, 4, 5, 2, 6, 7, 3})
                    .reshape({blocks, nb, oy, ox, groups, kh, kw, cg, 1});
    Tensor gv = gt.reshape({blocks, nb, oy, ox, groups, 1, 1, 1, cog});
    Tensor partial = (wv * gv).sum({1, 2, 3});  // [blocks, G, kh, kw, cg, cog]
    dw = partial.sum(0).contiguous().permute({0, 4, 3, 1, 2}).reshape({cout, cg, kh, kw});
  } else {
    dw = (wa.reshape({n, groups, 1, cg, oy, ox, kh, kw}) * ga.reshape({n, groups, cog, 1, oy, ox, 1, 1}))
             .sum({0, 4, 5})
             .reshape({cout, cg, kh, kw});
  }

  Tensor gd = g;
  if (stride[0] > 1 || stride[1] > 1)
    gd = g.reshape({n, cout, oy, 1, ox, 1})
             .pad({{0, 0}, {0, 0}, {0, 0}, {0, stride[0] - 1}, {0, 0}, {0, stride[1] - 1}})
             .reshape({n, cout, oy * stride[0], ox * stride[1]})
             .shrink({{0, n}, {0, cout}, {0, (oy - 1) * stride[0] + 1}, {0, (ox - 1) * stride[1] + 1}});
  int64_t ty = dilation[0] * (kh - 1) - padding[0], tx = dilation[1] * (kw - 1) - padding[1];
  int64_t by = h + dilation[0] * (kh - 1) - ty - gd.shape(2), bx = wd + dilation[1] * (kw - 1) - tx - gd.shape(3);
  // materialized padded: the convolution's inner loop then loads without bounds checks
  // (channel-last: the columns; Note [transposed convolutions skip the padded rows])
  if (gt_first)
    gd = gd.pad({{0, 0}, {0, 0}, {0, 0}, {tx, bx}})
             .permute({0, 2, 3, 1})
             .contiguous()
             .permute({0, 3, 1, 2})
             .pad({{0, 0}, {0, 0}, {ty, by}, {0, 0}});
  else
    gd = gd.pad({{0, 0}, {0, 0}, {ty, by}, {tx, bx}}).contiguous();
  Tensor wt = w.reshape({groups, cog, cg, kh, kw}).permute({0, 2, 1, 3, 4}).reshape({cin, cog, kh, kw}).flip({2, 3});
  // NCHW (GPUs): the flipped weight is copied once (a weight-sized kernel), so the transposed
  // convolution indexes it directly; through the view, each of its loads took several 64-bit
  // divisions and the kernel ran 3x as long as the forward one (H200, the CNN's 5x5 32->32)
  if (!channels_last(x.device())) wt = wt.contiguous();
  Tensor dx = gd.conv2d(wt, std::nullopt, {1, 1}, {0, 0}, dilation, groups);
  return {nullptr, dx.cast(x.dtype()).uop(), dw.cast(w.dtype()).uop()};
}

Tensor Tensor::max_pool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding,
                          std::vector<int64_t> dilation) const {
  TG_CHECK(ndim() >= 2, "max_pool2d: input needs at least 2 dims, got ", describe());
  kernel = expand_param("max_pool2d", "kernel", kernel, 2);
  stride = stride.empty() ? kernel : expand_param("max_pool2d", "stride", stride, 2);
  padding = expand_param("max_pool2d", "padding", padding, 2);
  dilation = expand_param("max_pool2d", "dilation", dilation, 2);
  std::vector<std::pair<int64_t, int64_t>> p(ndim(), {0, 0});
  p[ndim() - 2] = {padding[0], padding[0]};
  p[ndim() - 1] = {padding[1], padding[1]};
  double lowest = is_float(dtype()) ? -INFINITY : dtype_min(dtype());
  return pad(p, lowest).pool_windows(kernel, stride, dilation).max({-2, -1});
}

Tensor Tensor::avg_pool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) const {
  TG_CHECK(ndim() >= 2, "avg_pool2d: input needs at least 2 dims, got ", describe());
  kernel = expand_param("avg_pool2d", "kernel", kernel, 2);
  stride = stride.empty() ? kernel : expand_param("avg_pool2d", "stride", stride, 2);
  padding = expand_param("avg_pool2d", "padding", padding, 2);
  std::vector<std::pair<int64_t, int64_t>> p(ndim(), {0, 0});
  p[ndim() - 2] = {padding[0], padding[0]};
  p[ndim() - 1] = {padding[1], padding[1]};
  return pad(p).pool_windows(kernel, stride, {1, 1}).mean({-2, -1});
}

Tensor Tensor::one_hot(int64_t num_classes) const {
  TG_CHECK(!is_float(dtype()), "one_hot: needs an integer tensor, got ", describe());
  TG_CHECK(num_classes > 0, "one_hot: num_classes must be positive, got ", num_classes);
  return unsqueeze(-1).eq(Tensor::arange(num_classes, {.dtype = dtype(), .device = device()})).cast(DType::Int32);
}

Tensor Tensor::dropout(double p, bool training) const {
  TG_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0) return *this;
  Tensor keep = Tensor::rand(shape(), {.device = device()}).ge(Tensor::scalar(p, {.device = device()}));
  return keep.where(*this * (1.0 / (1.0 - p)), zeros_like());
}

Tensor Tensor::layernorm(std::vector<int64_t> axes, double eps) const {
  Tensor y = *this - mean(axes, true);
  return y * ((y * y).mean(axes, true) + eps).rsqrt();
}

// Note [cross-entropy from the target's logit]: a row's loss is logsumexp(x) - x[label]. Its
// passes over the logits are the row maximum and the sum of exponentials (a [N, C] read each);
// the target's logit is a GATHER, one element a row, not a one-hot sum over the row (a third
// [N, C] read: 0.56 ms a step for GPT-2's 16384 x 50304 bf16 logits on an H100). The GATHER's own
// gradient would be a SCATTER_ADD into a zeroed [N, C] buffer, a kernel and a buffer of their
// own; a CUSTOM_GRAD (CustomGrad::PICK, fused as its value: no kernel of its own) gives it the
// one-hot gradient instead, a select that fuses into the backward pass's one kernel over the
// logits: dx = softmax(x) * g - where(hit, g).
// The row statistics and the loss are float32 (float64 for float64 logits). A label outside
// [0, C) gathers 0 (Note [gather and scatter-add] in lazy.cpp), and its row's loss is the
// logsumexp alone.
Tensor Tensor::sparse_categorical_crossentropy(const Tensor& labels, double label_smoothing) const {
  TG_CHECK(ndim() == 2, "sparse_categorical_crossentropy: logits must be [N, C], got ", describe());
  TG_CHECK(!is_float(labels.dtype()) && labels.ndim() == 1 && labels.shape()[0] == shape()[0],
           "sparse_categorical_crossentropy: labels must be integer [", shape()[0], "], got ", labels.describe());
  check_same_device("sparse_categorical_crossentropy", *this, labels);
  Tensor x = is_float(dtype()) ? *this : float_();
  const DType wide = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor top = x.max(-1, true).detach();
  // [N, 1], a buffer of its own: the kernel of the sum (with the maximum where rows fuse: Note
  // [row fusion] in schedule/schedule.cpp) writes it, and the loss reads it alone
  Tensor lse = ((x - top).cast(wide).exp().sum(-1, true).log() + top.cast(wide)).contiguous();
  Tensor at = labels.unsqueeze(-1);
  Tensor hit = at.eq(Tensor::arange(shape()[1], {.dtype = labels.dtype(), .device = device()}));
  Tensor picked = result(lazy::custom_grad(lazy::gather(x.uop(), at.uop(), 1), {x.uop(), hit.uop()},
                                           {static_cast<int64_t>(CustomGrad::PICK)}),
                         {&x});
  Tensor nll = (lse - picked.cast(wide)).mean();
  if (label_smoothing == 0) return nll;
  Tensor smooth = (lse - x.cast(wide).mean(-1, true)).mean();  // -mean(log_softmax(x))
  return (1 - label_smoothing) * nll + label_smoothing * smooth;
}

std::vector<UOpPtr> pick_gradient(const UOpPtr& node, const UOpPtr& grad) {
  const UOpPtr &x = node->src[1], &hit = node->src[2];
  UOpPtr g = lazy::expand(grad, x->shape);
  return {nullptr, lazy::where(hit, g, lazy::const_like(g, 0)), nullptr};
}

Tensor Tensor::binary_crossentropy(const Tensor& t) const {
  return -(t * log() + (1.0 - t) * (1.0 - *this).log()).mean();
}

Tensor Tensor::binary_crossentropy_logits(const Tensor& t) const {
  // max(x, 0) - x*t + log(1 + exp(-|x|)): stable for large |x|
  return (relu() - *this * t + (1.0 + (-abs()).exp()).log()).mean();
}

Tensor Tensor::mse(const Tensor& t) const { return (*this - t).square().mean(); }

}  // namespace tg
