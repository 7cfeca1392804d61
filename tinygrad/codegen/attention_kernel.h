// Fused (flash) attention kernels for the GPU backends, written from a template rather than
// generated from a graph (Note [template kernels] in attention_kernel.cpp): the forward pass and
// the two backward kernels of FlashAttention-2, none of which writes the [B*H, L, S] scores.
// tensor_attention.cpp puts them into the lazy graph; the pipeline renders them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/codegen/renderer.h"
#include "tinygrad/dtype.h"
#include "tinygrad/ops.h"

namespace tg {

// The templates a TEMPLATE_KERNEL node names (the first entry of its arg).
enum class TemplateKernel : int64_t { AttentionForward = 0, AttentionBackwardQ = 1, AttentionBackwardKV = 2 };

// One attention kernel over bh = batch * heads independent (L x E query, S x E key, S x Ev value)
// problems, each stored contiguously (Note [fused attention] in attention_kernel.cpp).
struct AttentionSpec {
  TemplateKernel kernel = TemplateKernel::AttentionForward;
  int64_t bh = 1, l = 1, s = 1, e = 1, ev = 1;
  DType dtype = DType::Float32;  // of q, k and v
  bool causal = false;
  double scale = 1.0;
  bool tensor_cores = false;  // Note [tensor-core attention] (attention_tensor_cores.cpp): the products on mma.sync (CUDA, half inputs)

  // The TEMPLATE_KERNEL arg, and back.
  std::vector<int64_t> encode() const;
  static AttentionSpec decode(const std::vector<int64_t>& arg);
  // The kernel's one float32 output: forward [bh, l, ev + 1] (O, then the row's logsumexp),
  // backward Q [bh, l, e] (dQ), backward KV [bh, s, e + ev] (dK, then dV).
  Shape output_shape() const;
  // The dtype the backward kernels take dO in: the input type on the tensor cores (their products
  // round it to that anyway; Note [fused attention in the graph]), else float32.
  DType output_grad_dtype() const { return tensor_cores ? dtype : DType::Float32; }
};

// The source languages the templates are written for.
enum class KernelDialect { CUDA, OpenCL };
std::optional<KernelDialect> kernel_dialect(const Renderer& renderer);

// Whether the templates take these sizes and dtype in `dialect` (head dims up to 128, float32
// and bfloat16 everywhere, float16 on CUDA).
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
