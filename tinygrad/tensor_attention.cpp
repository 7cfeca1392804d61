// Scaled dot-product attention as a composition of primitives, on every device: the reference
// that a fused attention kernel is checked against, and what runs where there is none.
//
// Note [attention as a composition]: softmax(q k^T * scale + mask) v over the last two dims of
// q [..., L, E], k [..., S, E] and v [..., S, Ev], leading dims broadcast, as PyTorch's
// F.scaled_dot_product_attention. The products are matmuls (so their operands, dtypes and
// precision follow Note [half products in float32] in tensor_nn.cpp), the softmax runs in
// float32 for half inputs (a float16 score row overflows long before its exp does) and its
// result goes back to the inputs' dtype before the second product. A causal mask lets query i
// see keys j <= i, aligned at the top left (PyTorch's is_causal); a boolean mask (true: attend)
// broadcasts against [..., L, S]. A masked score is -inf, so a row whose keys are all masked
// comes out NaN, as in PyTorch. Dropout drops attention weights after the softmax and scales the
// kept ones by 1/(1-p). The [..., L, S] scores exist as an intermediate here; only a fused kernel
// avoids them.
//
// Note [fused attention in the graph]: on a device with a template dialect (CUDA, OpenCL), with
// FLASH_ATTENTION at 1 or 2 (the default), no mask and no dropout, q, k and v of one dtype the kernels
// take and the same leading dims, attention is one TEMPLATE_KERNEL node (Note [template kernels]
// in codegen/attention_kernel.cpp): q, k and v in, read in place where they are views (Note
// [strided operands]), one buffer in the inputs' dtype out, O in [B, L, H, Ev] order followed by
// each row's logsumexp (Note [the forward's output] there: one buffer, so the node keeps the lazy
// graph's one output per node; the scheduler keeps it for the backward pass like a convolution's
// output). FLASH_ATTENTION=2 runs the kernels of bfloat16/float16 inputs on CUDA's tensor cores
// (FLASH_ATTENTION=1: the plain kernels) (Note [tensor-core attention] in
// codegen/attention_tensor_cores.cpp). The result is a view of O, permuted to [B, H, L, Ev]; a
// model that merges the heads back permutes it into the buffer's own order, so its next product
// reads it in place. The node's sources need not be q, k and v themselves, so the gradient goes around it:
// a CUSTOM_GRAD (CustomGrad::ATTENTION) holds the node as its value and q, k and v as its inputs, and its
// rule (attention_gradient) computes D = rowsum(dO * O) and L in float32 with ordinary kernels and emits the
// dQ and dK/dV kernels (Note [fused attention] there), whose results (float32, or the input type on the
// tensor cores: AttentionSpec::output_dtype) are cast back. The tensor-core kernels take dO rounded to the
// input type (the value their products would round it to anyway), which halves what they stage; D is then the
// sum over the rounded dO too, as in FlashAttention-2. Everything else runs the composition, which stays the
// reference the fused kernels are tested against. A model opts in by nothing: the GPT's attention calls this
// function, so on CUDA it is fused.
//
// Note [strided operands]: q, k and v are usually views of one buffer (GPT's c_attn writes
// [B, T, 3, H, hd]; q, k and v are its permuted thirds), and dO is the permuted view of c_proj's
// input gradient [B, T, H, hd]. Copying each into a contiguous [B*H, T, hd] buffer took a kernel
// that moved as many bytes as the attention kernel reads: four a layer, 1.1 ms of GPT-2 124M's
// 41 ms step on an H100. Instead the kernels read an operand through its layout (OperandLayout
// in codegen/attention_kernel.h: a row of problem (b, h) starts at offset + b * batch + h * head +
// r * row, its columns one element apart), and the template node takes the node below the
// operand's views (strided_view.h) as its source. The views of [batch, heads, rows, width] must
// be strides with columns one apart, and the node below must hold no more elements than the
// operands that read it hold (a few rows of a large tensor are copied rather than the whole
// realized); else the operand is copied as before.
#include <cmath>
#include <limits>
#include <unordered_map>

#include "tinygrad/codegen/attention_kernel.h"
#include "tinygrad/device.h"
#include "tinygrad/gradient.h"
#include "tinygrad/knobs.h"
#include "tinygrad/lazy.h"
#include "tinygrad/strided_view.h"
#include "tinygrad/tensor_internal.h"

namespace tg {

namespace {

void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask) {
  const char* op = "scaled_dot_product_attention";
  TG_CHECK(q.ndim() >= 2 && k.ndim() >= 2 && v.ndim() >= 2, op, ": q, k and v need at least 2 dims [..., seq, dim] (q: ",
           q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(is_float(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
           ": q, k and v need one floating dtype (q: ", q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(q.device() == k.device() && q.device() == v.device(), op, ": q, k and v must be on one device (q: ",
           q.describe(), ", k: ", k.describe(), ", v: ", v.describe(), ")");
  TG_CHECK(q.shape().back() == k.shape().back(), op, ": q and k need the same last dim (q: ", q.describe(),
           ", k: ", k.describe(), ")");
  TG_CHECK(k.shape()[k.ndim() - 2] == v.shape()[v.ndim() - 2], op, ": k and v need the same sequence length (k: ",
           k.describe(), ", v: ", v.describe(), ")");
  if (mask) {
    TG_CHECK(mask->dtype() == DType::Bool, op, ": the mask must be bool (true: attend), got ", mask->describe());
    TG_CHECK(mask->device() == q.device(), op, ": the mask must be on q's device (mask: ", mask->describe(),
             ", q: ", q.describe(), ")");
  }
}

// [L, S] bool: key j visible from query i when j <= i.
Tensor causal_mask(int64_t l, int64_t s, const std::string& device) {
  TensorOptions ints{.dtype = DType::Int32, .device = device};
  Tensor rows = Tensor::arange(0, static_cast<double>(l), 1, ints).reshape({l, 1});
  Tensor cols = Tensor::arange(0, static_cast<double>(s), 1, ints).reshape({1, s});
  return cols.le(rows);
}

// Note [fused attention in the graph]: the fused kernels' spec for these inputs, or none where
// the composition must run.
std::optional<AttentionSpec> fused_attention_spec(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  double dropout_p, const std::optional<Tensor>& mask, double scale) {
  if (!knobs::FLASH_ATTENTION.get() || mask || dropout_p > 0 || q.devices().size() != 1) return std::nullopt;
  if (k.ndim() != q.ndim() || v.ndim() != q.ndim()) return std::nullopt;
  size_t n = q.shape().size();
  for (size_t i = 0; i + 2 < n; i++)
    if (k.shape()[i] != q.shape()[i] || v.shape()[i] != q.shape()[i]) return std::nullopt;
  Device& dev = get_device(q.device());
  std::optional<KernelDialect> dialect = kernel_dialect(dev.renderer());
  if (!dialect) return std::nullopt;
  Shape lead(q.shape().begin(), q.shape().end() - 2);
  AttentionSpec spec{TemplateKernel::AttentionForward, prod(lead), q.shape()[n - 2], k.shape()[n - 2],
                     q.shape()[n - 1], v.shape()[n - 1], q.dtype(), causal, scale};
  spec.heads = lead.empty() ? 1 : lead.back();
  if (spec.bh == 0 || !attention_kernel_takes(spec, *dialect)) return std::nullopt;
  spec.tensor_cores = knobs::FLASH_ATTENTION.get() >= 2 && dev.supports(Feature::TensorCores) &&
                      attention_tensor_cores_take(spec, *dialect);
  return spec;
}

UOpPtr template_node(const AttentionSpec& spec, std::vector<UOpPtr> srcs) {
  std::string device = srcs[0]->device;
  return make_uop(Op::TEMPLATE_KERNEL, spec.output_dtype(), std::move(srcs), spec.encode(),
                  spec.output_shape(), device);
}

// The first `cols` columns of a [bh, rows, *] node from column `from`.
UOpPtr columns(const UOpPtr& x, int64_t from, int64_t cols) {
  return lazy::shrink(x, {{0, x->shape[0]}, {0, x->shape[1]}, {from, from + cols}});
}

// Note [the forward's output] in codegen/attention_kernel.cpp: O of the forward node `fwd` (or of
// its CUSTOM_GRAD, or of its gradient) as [batch, L, heads, Ev].
UOpPtr output_part(const AttentionSpec& spec, const UOpPtr& fwd) {
  return lazy::reshape(lazy::shrink(fwd, {{0, spec.bh * spec.l * spec.ev}}),
                       {spec.bh / spec.heads, spec.l, spec.heads, spec.ev});
}

// The rows' logsumexp from the forward node, float32 [batch, L, heads, 1]: the sum of its slots.
UOpPtr row_logsumexp(const AttentionSpec& spec, const UOpPtr& fwd) {
  using namespace lazy;
  const int64_t from = spec.bh * spec.l * spec.ev, slots = spec.lse_slots(), batch = spec.bh / spec.heads;
  UOpPtr stats =
      reshape(shrink(fwd, {{from, from + spec.bh * spec.l * slots}}), {batch, spec.l, spec.heads, slots});
  auto slot = [&](int64_t i) {
    return cast(shrink(stats, {{0, batch}, {0, spec.l}, {0, spec.heads}, {i, i + 1}}), DType::Float32);
  };
  return contiguous(slots == 2 ? alu(Op::ADD, slot(0), slot(1)) : slot(0));
}

// Note [strided operands]: operand x of spec ([..., rows, width] with the spec's leading dims) as
// the node below its views and its layout there, or nullopt where its views are no such layout
// (or one the spec's kernels do not take: rows at odd elements on the tensor cores).
struct OperandView {
  UOpPtr node;
  OperandLayout layout;
};
std::optional<OperandView> operand_view(const AttentionSpec& spec, AttentionOperand operand,
                                        const UOpPtr& x) {
  int64_t rows = spec.rows(operand), width = spec.width(operand);
  std::optional<StridedView> v =
      strided_view(lazy::reshape(x, {spec.bh / spec.heads, spec.heads, rows, width}));
  if (!v || (v->strides[3] != 1 && width != 1)) return std::nullopt;
  OperandView view{v->base, OperandLayout{v->offset, v->strides[0], v->strides[1], v->strides[2]}};
  AttentionSpec with = spec;
  with.layouts[static_cast<size_t>(operand)] = view.layout;
  if (!attention_kernel_takes(with, *kernel_dialect(get_device(x->device).renderer()))) return std::nullopt;
  return view;
}

// The template node's sources for `operands` of spec, whose layouts it sets (Note [strided
// operands]): the node below each operand's views where that pays, else a contiguous copy.
std::vector<UOpPtr> operand_sources(AttentionSpec& spec,
                                    const std::vector<std::pair<AttentionOperand, UOpPtr>>& operands) {
  std::vector<std::optional<OperandView>> views;
  std::unordered_map<const UOp*, int64_t> elements_read;
  for (const auto& [operand, x] : operands) {
    views.push_back(operand_view(spec, operand, x));
    if (views.back()) elements_read[views.back()->node.get()] += prod(x->shape);
  }
  std::vector<UOpPtr> sources;
  for (size_t i = 0; i < operands.size(); i++) {
    const auto& [operand, x] = operands[i];
    std::optional<OperandLayout>& layout = spec.layouts[static_cast<size_t>(operand)];
    layout.reset();
    const std::optional<OperandView>& v = views[i];
    if (!v || prod(v->node->shape) > elements_read[v->node.get()]) {
      sources.push_back(
          lazy::contiguous(lazy::reshape(x, {spec.bh, spec.rows(operand), spec.width(operand)})));
      continue;
    }
    if (v->layout != spec.layout(operand)) layout = v->layout;
    sources.push_back(v->node);
  }
  return sources;
}

Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, AttentionSpec spec) {
  std::vector<UOpPtr> sources = operand_sources(
      spec, {{AttentionOperand::Q, q.uop()}, {AttentionOperand::K, k.uop()}, {AttentionOperand::V, v.uop()}});
  UOpPtr fwd = template_node(spec, sources);
  UOpPtr wrapped =
      lazy::custom_grad(fwd, {q.uop(), k.uop(), v.uop()}, {static_cast<int64_t>(CustomGrad::ATTENTION)});
  Shape shape = q.shape();
  shape.back() = spec.ev;
  return result(lazy::reshape(lazy::permute(output_part(spec, wrapped), {0, 2, 1, 3}), shape), {&q, &k, &v});
}

}  // namespace

// Note [fused attention in the graph]: gradients of q, k and v (src[1..3] of the CUSTOM_GRAD
// node) from the forward node's output gradient (of O; the logsumexp is not a result). D and L
// are float32 in [batch, L, heads] order (Note [the forward's output] in
// codegen/attention_kernel.cpp).
std::vector<UOpPtr> attention_gradient(const UOpPtr& node, const UOpPtr& grad) {
  using namespace lazy;
  const UOpPtr& fwd = node->src[0];
  AttentionSpec spec = AttentionSpec::decode(fwd->arg_ints());
  UOpPtr dout = cast(output_part(spec, grad), spec.output_grad_dtype());
  UOpPtr delta = contiguous(reduce(
      alu(Op::MUL, cast(dout, DType::Float32), cast(output_part(spec, fwd), DType::Float32)), Op::ADD, {3}));
  UOpPtr dout_source =
      operand_sources(spec, {{AttentionOperand::OutputGrad, permute(dout, {0, 2, 1, 3})}})[0];
  std::vector<UOpPtr> srcs{fwd->src[0], fwd->src[1], fwd->src[2], row_logsumexp(spec, fwd),
                           dout_source, delta};
  AttentionSpec dq_spec = spec, dkv_spec = spec;
  dq_spec.kernel = TemplateKernel::AttentionBackwardQ;
  dkv_spec.kernel = TemplateKernel::AttentionBackwardKV;
  UOpPtr dq = template_node(dq_spec, srcs), dkv = template_node(dkv_spec, srcs);
  const Shape &q = node->src[1]->shape, &k = node->src[2]->shape, &v = node->src[3]->shape;
  return {nullptr, reshape(cast(dq, spec.dtype), q), reshape(cast(columns(dkv, 0, spec.e), spec.dtype), k),
          reshape(cast(columns(dkv, spec.e, spec.ev), spec.dtype), v)};
}

// Note [attention as a composition]
Tensor Tensor::scaled_dot_product_attention(const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                            const std::optional<Tensor>& mask, std::optional<double> scale) const {
  check_attention_inputs(*this, k, v, mask);
  TG_CHECK(dropout_p >= 0 && dropout_p < 1, "scaled_dot_product_attention: dropout_p must be in [0, 1), got ",
           dropout_p);
  int64_t l = shape()[ndim() - 2], s = k.shape()[k.ndim() - 2];
  double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(shape().back())));
  if (auto spec = fused_attention_spec(*this, k, v, causal, dropout_p, mask, sc))
    return fused_attention(*this, k, v, *spec);  // Note [fused attention in the graph]
  DType dt = dtype(), acc = is_half(dt) ? DType::Float32 : dt;
  Tensor scores = matmul(k.transpose(-1, -2)).cast(acc) * sc;
  std::optional<Tensor> visible = mask;
  if (causal) {
    Tensor c = causal_mask(l, s, device());
    visible = visible ? (*visible).logical_and(c) : c;
  }
  if (visible) scores = visible->where(scores, scores.full_like(-std::numeric_limits<double>::infinity()));
  Tensor weights = scores.softmax(-1).cast(dt);
  if (dropout_p > 0) weights = weights.dropout(dropout_p);
  return weights.matmul(v);
}

}  // namespace tg
