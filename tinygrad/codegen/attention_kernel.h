// Fused (flash) attention kernels for the GPU backends, written from a template rather than
// generated from a graph (Note [template kernels] in attention_kernel.cpp): the forward pass and
// the two backward kernels of FlashAttention-2, none of which writes the [B*H, L, S] scores.
// tensor_attention.cpp puts them into the lazy graph; the pipeline renders them.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/codegen/renderer.h"
#include "tinygrad/dtype.h"
#include "tinygrad/ops.h"

namespace tg {

// The templates a TEMPLATE_KERNEL node names (the first entry of its arg).
enum class TemplateKernel : int64_t { AttentionForward = 0, AttentionBackwardQ = 1, AttentionBackwardKV = 2 };

// The operands the kernels read through a layout (Note [strided operands] in tensor_attention.cpp).
enum class AttentionOperand : size_t { Q, K, V, OutputGrad };
inline constexpr size_t ATTENTION_OPERANDS = 4;

// Where row r of problem (batch b, head h) of an operand starts in the buffer a kernel reads:
// offset + b * batch + h * head + r * row; the row's columns follow one element apart.
struct OperandLayout {
  int64_t offset = 0, batch = 0, head = 0, row = 0;
  bool operator==(const OperandLayout&) const = default;
};

// One attention kernel over bh = batch * heads independent (L x E query, S x E key, S x Ev value)
// problems (Note [fused attention] in attention_kernel.cpp).
struct AttentionSpec {
  TemplateKernel kernel = TemplateKernel::AttentionForward;
  int64_t bh = 1, l = 1, s = 1, e = 1, ev = 1;
  DType dtype = DType::Float32;  // of q, k and v
  bool causal = false;
  double scale = 1.0;
  bool tensor_cores = false;  // Note [tensor-core attention] (attention_tensor_cores.cpp): the products on mma.sync (CUDA, half inputs)
  int64_t heads = 1;          // problem y is batch y / heads, head y % heads
  // q, k, v and dO (the backward kernels' output gradient); nullopt: a contiguous [bh, rows, width]
  // buffer of its own
  std::array<std::optional<OperandLayout>, ATTENTION_OPERANDS> layouts{};

  // The TEMPLATE_KERNEL arg, and back.
  std::vector<int64_t> encode() const;
  static AttentionSpec decode(const std::vector<int64_t>& arg);
  // The kernel's one output, of output_dtype(): forward (Note [the forward's output] in
  // attention_kernel.cpp) O in [batch, l, heads, ev] order, then each row's logsumexp in
  // lse_slots() elements, [bh * l * (ev + lse_slots())]; backward Q [bh, l, e] (dQ), backward KV
  // [bh, s, e + ev] (dK, then dV).
  Shape output_shape() const;
  // The dtype the backward kernels take dO in and give dQ, dK and dV in: the input type on the
  // tensor cores (their products round dO to that anyway, and the gradients are rounded to it
  // next; Note [fused attention in the graph]), else float32.
  DType output_grad_dtype() const { return tensor_cores ? dtype : DType::Float32; }
  // The forward output's dtype (the input type) or the backward results' (output_grad_dtype).
  DType output_dtype() const {
    return kernel == TemplateKernel::AttentionForward ? dtype : output_grad_dtype();
  }
  // Note [the forward's output]: a row's logsumexp takes two elements of a half input type (a
  // rounded value and the rest), one of float32.
  int64_t lse_slots() const { return is_half(dtype) ? 2 : 1; }
  // Where row r of problem y has its row statistics (L and D) in [batch, l, heads] order, its O in
  // the forward output, and its logsumexp there.
  int64_t stat_index(int64_t y, int64_t r) const { return (y / heads * l + r) * heads + y % heads; }
  int64_t output_row_start(int64_t y, int64_t r) const { return stat_index(y, r) * ev; }
  int64_t lse_start(int64_t y, int64_t r) const { return bh * l * ev + stat_index(y, r) * lse_slots(); }
  // An operand's rows, its width, and its layout (the contiguous one where it has none).
  int64_t rows(AttentionOperand x) const {
    return x == AttentionOperand::K || x == AttentionOperand::V ? s : l;
  }
  int64_t width(AttentionOperand x) const {
    return x == AttentionOperand::Q || x == AttentionOperand::K ? e : ev;
  }
  OperandLayout layout(AttentionOperand x) const;
  // The element where row r of problem y of operand x starts.
  int64_t row_start(AttentionOperand x, int64_t y, int64_t r) const;
};

// The source languages the templates are written for.
enum class KernelDialect { CUDA, OpenCL };
std::optional<KernelDialect> kernel_dialect(const Renderer& renderer);

// Whether the templates take these sizes, dtype and layouts in `dialect` (head dims up to 128,
// float32 and bfloat16 everywhere, float16 on CUDA; on the tensor cores, rows that start at an
// even element).
bool attention_kernel_takes(const AttentionSpec& spec, KernelDialect dialect);
// Whether the tensor-core form takes spec (Note [tensor-core attention]): CUDA, bfloat16/float16
// inputs, head dims that are multiples of 16.
bool attention_tensor_cores_take(const AttentionSpec& spec, KernelDialect dialect);

// A rendered template kernel: its name, parameters and launch sizes (no uops), and its source.
struct TemplateSource {
  LinearKernel kernel;
  std::string source;
};
TemplateSource render_attention(const AttentionSpec& spec, KernelDialect dialect);

// What a TEMPLATE_KERNEL node computes, in double precision, from its sources' values in order
// (each dense, row-major): the reference interpreter's definition of it (runtime/reference.cpp;
// written in attention_reference.cpp).
std::vector<double> template_kernel_reference(const std::vector<int64_t>& arg,
                                              const std::vector<const std::vector<double>*>& inputs);

// The pipeline's entry (Note [template kernels]): the source of a TEMPLATE_KERNEL schedule item
// for the device whose renderer is `renderer`.
TemplateSource render_template_kernel(const UOp& kernel, const Renderer& renderer);

}  // namespace tg
