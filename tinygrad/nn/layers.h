// Layers for tg::nn: Linear, Conv2d, BatchNorm1d/2d, LayerNorm, RMSNorm, Embedding, Dropout,
// pooling, activations, Flatten and Sequential. Initialisation follows PyTorch's defaults and
// draws from Tensor's seeded generator, so Tensor::manual_seed makes a model reproducible.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tinygrad/nn/module.h"

namespace tg::nn {

// Note [compute dtype]: with a compute dtype (Module::set_compute_dtype; `train.precision: bf16`
// in the trainer), Linear and Conv2d cast their input and weight to it, run the matmul or
// convolution there (products and sums in float32, the result rounded to the compute dtype:
// Note [half products in float32] in tensor_nn.cpp) and cast the result back to the dtype they
// return without one; the bias is added after that, in that dtype. Activations, normalisation
// and the loss stay in float32. Autograd differentiates the casts: the output gradient is rounded
// to the compute dtype at the layer, the input and weight gradients come from the rounded
// operands, and the weight gradient is cast back to the weight's dtype, so the optimizer updates
// float32 master weights with float32 gradients. The casts fuse into the kernels around them.
// `op` is the product (a linear, a convolution, a matmul) of the two operands it is given.
template <class Op>
Tensor at_compute_dtype(std::optional<DType> compute, const Tensor& x, const Tensor& weight, Op op) {
  if (!compute) return op(x, weight);
  return op(x.cast(*compute), weight.cast(*compute)).cast(promote(x.dtype(), weight.dtype()));
}

// y = x @ weight.T + bias; weight [out, in], bias [out], both U(-1/sqrt(in), 1/sqrt(in))
// (PyTorch's kaiming_uniform(a=sqrt(5)) for the weight and its fan-in bound for the bias).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // With a compute dtype, y in it: the bias rounded to the compute dtype and added to the product
  // in it (Note [bias in the compute dtype]); without one, forward(x).
  Tensor forward_rounded(const Tensor& x);
  std::string type_name() const override { return "Linear"; }
  // Tensor parallel halves (Note [tensor parallel] in module.cpp). Column-parallel: weight and
  // bias split along the outputs (in `groups`: Note [grouped splits] in multi.cpp); row-parallel:
  // the weight split along the inputs, the bias whole on each device. `what` names the layer in
  // the error when the device count does not divide its width.
  Linear& shard_columns(const std::vector<std::string>& devices, const std::string& what, int64_t groups = 1);
  Linear& shard_rows(const std::vector<std::string>& devices, const std::string& what);
  int64_t in_features, out_features;
  Tensor weight;
  std::optional<Tensor> bias;

 private:
  void check_input(const Tensor& x) const;  // ends in in_features
};

// 2-D convolution over [N, C, H, W]. kernel/stride/padding/dilation take one value (both dims)
// or two (h, w). weight [out, in/groups, kh, kw]; init as Linear with fan_in = in/groups*kh*kw.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel, std::vector<int64_t> stride = {1},
         std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1}, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  int64_t in_channels, out_channels, groups;
  std::vector<int64_t> kernel, stride, padding, dilation;
  Tensor weight;
  std::optional<Tensor> bias;
};

// Batch normalisation over channel axis 1. Training: normalise with the batch mean and biased
// variance over every axis but 1, and update running_mean / running_var (the unbiased variance)
// as running = (1 - momentum) * running + momentum * batch, counting num_batches_tracked.
// Eval: normalise with the running stats. With track_running_stats=false there are no running
// buffers and batch statistics are used in both modes. Affine: weight (init 1) and bias (init 0)
// per channel.
class BatchNorm : public Module {
 public:
  // ranks: the input ranks this layer accepts ({2, 3} for BatchNorm1d, {4} for BatchNorm2d).
  BatchNorm(int64_t num_features, std::vector<int64_t> ranks, double eps = 1e-5, double momentum = 0.1,
            bool affine = true, bool track_running_stats = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return ranks_ == std::vector<int64_t>{4} ? "BatchNorm2d" : "BatchNorm1d"; }
  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  std::optional<Tensor> weight, bias;
  std::optional<Tensor> running_mean, running_var, num_batches_tracked;  // num_batches_tracked: int64 scalar

 private:
  std::vector<int64_t> ranks_;
};
// [N, C] or [N, C, L]
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNorm(num_features, {2, 3}, eps, momentum, affine, track_running_stats) {}
};
// [N, C, H, W]
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNorm(num_features, {4}, eps, momentum, affine, track_running_stats) {}
};

// Normalises over the trailing dims given by normalized_shape (biased variance), then
// weight (init 1) * y + bias (init 0) when affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  Shape normalized_shape;
  double eps;
  std::optional<Tensor> weight, bias;
};

// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight (init 1).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RMSNorm"; }
  int64_t dim;
  double eps;
  Tensor weight;
};

// A lookup table: integer indices of any shape S -> [S..., dim]. weight [vocab, dim] ~ N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab_size, int64_t dim);
  Tensor forward(const Tensor& idx) override;
  std::string type_name() const override { return "Embedding"; }
  int64_t vocab_size, dim;
  Tensor weight;
};

// Zeroes elements with probability p and scales the rest by 1/(1-p), in training mode only.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override { return x.dropout(p, is_training()); }
  std::string type_name() const override { return "Dropout"; }
  double p;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                     std::vector<int64_t> dilation = {1})
      : kernel(std::move(kernel)), stride(std::move(stride)), padding(std::move(padding)), dilation(std::move(dilation)) {}
  Tensor forward(const Tensor& x) override { return x.max_pool2d(kernel, stride, padding, dilation); }
  std::string type_name() const override { return "MaxPool2d"; }
  std::vector<int64_t> kernel, stride, padding, dilation;  // stride empty: the kernel size
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0})
      : kernel(std::move(kernel)), stride(std::move(stride)), padding(std::move(padding)) {}
  Tensor forward(const Tensor& x) override { return x.avg_pool2d(kernel, stride, padding); }
  std::string type_name() const override { return "AvgPool2d"; }
  std::vector<int64_t> kernel, stride, padding;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.relu(); }
  std::string type_name() const override { return "ReLU"; }
};
class GELU : public Module {  // tanh approximation
 public:
  Tensor forward(const Tensor& x) override { return x.gelu(); }
  std::string type_name() const override { return "GELU"; }
};
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.silu(); }
  std::string type_name() const override { return "SiLU"; }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.tanh(); }
  std::string type_name() const override { return "Tanh"; }
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.sigmoid(); }
  std::string type_name() const override { return "Sigmoid"; }
};
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};
class Flatten : public Module {  // flattens dims start..end (default: all but the batch dim)
 public:
  explicit Flatten(int64_t start = 1, int64_t end = -1) : start(start), end(end) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start, end); }
  std::string type_name() const override { return "Flatten"; }
  int64_t start, end;
};

// Runs its children in order; they are named "0", "1", ... in state dicts.
//   Sequential net(std::make_unique<Linear>(2, 8), std::make_unique<ReLU>());
//   auto& head = net.emplace<Linear>(8, 1);
class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... M>
  explicit Sequential(std::unique_ptr<M>... ms) {
    (append(std::move(ms)), ...);
  }
  Module& append(std::unique_ptr<Module> m);
  template <class T, class... A>
  T& emplace(A&&... args) {
    auto m = std::make_unique<T>(std::forward<A>(args)...);
    T& ref = *m;
    append(std::move(m));
    return ref;
  }
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  // Splits each Linear that is followed, through elementwise activations only, by another Linear
  // as a column-parallel / row-parallel pair (Note [tensor parallel] in module.cpp); every other
  // layer, an unpaired last Linear included, is asked in turn (and so replicated).
  void tensor_parallel(const std::vector<std::string>& devices) override;
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i);

 private:
  std::vector<std::unique_ptr<Module>> layers_;
};

}  // namespace tg::nn
