// Layers for tg::nn: construction (shape checks, PyTorch-default initialisation, registration)
// and forward passes written with Tensor's compositions.
#include "tinygrad/nn/layers.h"

#include <algorithm>
#include <cmath>

#include "tinygrad/error.h"

namespace tg::nn {

namespace {

// A constant-filled tensor in its own buffer (written from the host, so no kernel runs and two
// parameters never share a hash-consed constant node).
Tensor filled(const Shape& shape, double v, DType dt = DType::Float32) {
  std::vector<double> host(static_cast<size_t>(tg::prod(shape)), v);
  return Tensor::from_data(host.data(), DType::Float64, shape, {.dtype = dt});
}

// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's kaiming_uniform_(a=sqrt(5)) bound
// gain*sqrt(3/fan_in) with gain = sqrt(2/(1+a^2)) = sqrt(1/3), which is the same as its bias bound.
Tensor fan_in_uniform(const Shape& shape, int64_t fan_in) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  return Tensor::uniform(shape, -bound, bound);
}

void check_positive(const char* layer, const char* what, int64_t v) {
  TG_CHECK(v > 0, layer, ": ", what, " must be positive, got ", v);
}

}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  check_positive("Linear", "in_features", in);
  check_positive("Linear", "out_features", out);
  weight = fan_in_uniform({out, in}, in);
  register_parameter("weight", weight);
  if (has_bias) register_parameter("bias", bias.emplace(fan_in_uniform({out}, in)));
}

namespace {
void check_splits(const std::string& what, const char* field, int64_t width, size_t devices, int64_t groups) {
  auto n = static_cast<int64_t>(devices);
  TG_CHECK(width % (n * groups) == 0, "tensor parallel over ", n, " devices: ", what, " has ", field, "=", width,
           groups > 1 ? " in " + std::to_string(groups) + " groups" : "", ", which does not split evenly (",
           width / groups, " % ", n, " = ", (width / groups) % n, ")");
}
}  // namespace

// Note [tensor parallel] in module.cpp
Linear& Linear::shard_columns(const std::vector<std::string>& devices, const std::string& what, int64_t groups) {
  if (devices.size() < 2) return *this;
  check_splits(what, "out_features", out_features, devices.size(), groups);
  weight.shard_(devices, 0, groups);
  if (bias) bias->shard_(devices, 0, groups);
  return *this;
}

Linear& Linear::shard_rows(const std::vector<std::string>& devices, const std::string& what) {
  if (devices.size() < 2) return *this;
  check_splits(what, "in_features", in_features, devices.size(), 1);
  weight.shard_(devices, 1);
  if (bias) bias->shard_(devices);
  return *this;
}

void Linear::check_input(const Tensor& x) const {
  TG_CHECK(x.ndim() >= 1 && x.shape().back() == in_features, "Linear: input ", x.describe(),
           " must end in in_features=", in_features);
}

Tensor Linear::forward(const Tensor& x) {
  check_input(x);
  Tensor y = at_compute_dtype(compute_dtype(), x, weight, [](const Tensor& a, const Tensor& w) { return a.linear(w); });
  return bias ? y + *bias : y;
}

// Note [bias in the compute dtype]: PyTorch's autocast runs a linear layer as one bfloat16 addmm:
// the bias is rounded to bfloat16 and cuBLASLt's epilogue adds it to the product. forward() adds
// the float32 bias to the rounded product instead, in whatever reads the output next (a GELU, a
// residual add), where it costs nothing. Where the output is wanted in the compute dtype itself
// (GPT's c_attn: attention reads q, k and v as stored), that add and a second rounding were a
// pass of their own over the output (GPT-2's [16384, 2304]): cuBLASLt takes no float32 bias with
// a bfloat16 output (Note [rounded products stay with the library] in schedule.cpp).
// forward_rounded() rounds the bias into a buffer of its own (an [out] kernel) and adds it to the
// product in the compute dtype, which a library device runs as its bias epilogue (Note [matching
// a matmul kernel] in match_matmul.cpp), as PyTorch does. (The epilogue adds the bias to the
// float32 sums and rounds once; a generated kernel rounds the sum first: they differ by a rounding.)
Tensor Linear::forward_rounded(const Tensor& x) {
  std::optional<DType> cd = compute_dtype();
  if (!cd) return forward(x);
  check_input(x);
  // Note [bias in the compute dtype]
  std::optional<Tensor> rounded_bias;
  if (bias) rounded_bias = bias->cast(*cd).contiguous();
  return x.cast(*cd).linear(weight.cast(*cd), rounded_bias);
}

// ---- Conv2d ----

Conv2d::Conv2d(int64_t in, int64_t out, std::vector<int64_t> kernel_, std::vector<int64_t> stride_,
               std::vector<int64_t> padding_, std::vector<int64_t> dilation_, int64_t groups_, bool has_bias)
    : in_channels(in), out_channels(out), groups(groups_), kernel(std::move(kernel_)), stride(std::move(stride_)),
      padding(std::move(padding_)), dilation(std::move(dilation_)) {
  check_positive("Conv2d", "in_channels", in);
  check_positive("Conv2d", "out_channels", out);
  check_positive("Conv2d", "groups", groups);
  TG_CHECK(in % groups == 0 && out % groups == 0, "Conv2d: groups=", groups, " must divide in_channels=", in,
           " and out_channels=", out);
  TG_CHECK(kernel.size() == 1 || kernel.size() == 2, "Conv2d: kernel needs 1 or 2 values, got ", kernel.size());
  if (kernel.size() == 1) kernel.push_back(kernel[0]);
  for (auto k : kernel) check_positive("Conv2d", "kernel size", k);
  int64_t fan_in = in / groups * kernel[0] * kernel[1];
  weight = fan_in_uniform({out, in / groups, kernel[0], kernel[1]}, fan_in);
  register_parameter("weight", weight);
  if (has_bias) register_parameter("bias", bias.emplace(fan_in_uniform({out}, fan_in)));
}

Tensor Conv2d::forward(const Tensor& x) {
  TG_CHECK(x.ndim() == 4 && x.shape()[1] == in_channels, "Conv2d: input ", x.describe(), " must be [N, ",
           in_channels, ", H, W]");
  Tensor y = at_compute_dtype(compute_dtype(), x, weight, [&](const Tensor& a, const Tensor& w) {
    return a.conv2d(w, std::nullopt, stride, padding, dilation, groups);
  });
  return bias ? y + bias->reshape({1, out_channels, 1, 1}) : y;
}

// ---- BatchNorm ----

BatchNorm::BatchNorm(int64_t n, std::vector<int64_t> ranks, double eps_, double momentum_, bool affine_,
                     bool track)
    : num_features(n), eps(eps_), momentum(momentum_), affine(affine_), track_running_stats(track),
      ranks_(std::move(ranks)) {
  check_positive(type_name().c_str(), "num_features", n);
  TG_CHECK(momentum >= 0 && momentum <= 1, type_name(), ": momentum must be in [0, 1], got ", momentum);
  if (affine) {
    register_parameter("weight", weight.emplace(filled({n}, 1.0)));
    register_parameter("bias", bias.emplace(filled({n}, 0.0)));
  }
  if (track) {
    register_buffer("running_mean", running_mean.emplace(filled({n}, 0.0)));
    register_buffer("running_var", running_var.emplace(filled({n}, 1.0)));
    register_buffer("num_batches_tracked", num_batches_tracked.emplace(filled({}, 0.0, DType::Int64)));
  }
}

// Note [BatchNorm's running statistics]: Tensor::assign realizes at once, so a training forward
// realizes the batch mean and variance together with the new running statistics in one
// schedule; the normalisation below then reads the realized mean and variance (autograd still
// sees the graph that produced them), so they are not computed twice. The input is realized in
// the same schedule: otherwise every later schedule that reads it (the normalisation, the
// backward pass) would recompute the layers before it, convolutions included.
Tensor BatchNorm::forward(const Tensor& x) {
  TG_CHECK(std::find(ranks_.begin(), ranks_.end(), x.ndim()) != ranks_.end() && x.shape()[1] == num_features,
           type_name(), ": input ", x.describe(), " must be ",
           ranks_ == std::vector<int64_t>{4} ? "[N, C, H, W]" : "[N, C] or [N, C, L]", " with C=", num_features);
  std::vector<int64_t> axes;
  Shape bshape(x.ndim(), 1);
  bshape[1] = num_features;
  for (int64_t a = 0; a < x.ndim(); a++)
    if (a != 1) axes.push_back(a);

  Tensor mean, var;
  if (is_training() || !track_running_stats) {
    mean = x.mean(axes);
    var = (x - mean.reshape(bshape)).square().mean(axes);  // biased, for normalising
    if (is_training() && track_running_stats) {
      int64_t count = x.numel() / num_features;
      TG_CHECK(count > 1, type_name(), ": training needs more than one value per channel, got input ", x.describe());
      NoGradGuard no_grad;
      double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      DType rt = running_mean->dtype();
      Tensor rm = *running_mean * (1.0 - momentum) + mean.detach().cast(rt) * momentum;
      Tensor rv = *running_var * (1.0 - momentum) + var.detach().cast(rt) * (momentum * unbias);
      Tensor nb = *num_batches_tracked + Tensor::scalar(1, {.dtype = DType::Int64, .device = x.device()});
      Tensor::realize_all({x, mean, var, rm, rv, nb});
      running_mean->assign(rm);
      running_var->assign(rv);
      num_batches_tracked->assign(nb);
    }
  } else {
    mean = running_mean->cast(x.dtype());
    var = running_var->cast(x.dtype());
  }
  Tensor y = (x - mean.reshape(bshape)) * (var.reshape(bshape) + eps).rsqrt();
  if (affine) y = y * weight->reshape(bshape) + bias->reshape(bshape);
  return y;
}

// ---- LayerNorm, RMSNorm ----

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine) : normalized_shape(std::move(shape)), eps(eps_) {
  TG_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must not be empty");
  for (auto d : normalized_shape) check_positive("LayerNorm", "normalized_shape dimension", d);
  if (affine) {
    register_parameter("weight", weight.emplace(filled(normalized_shape, 1.0)));
    register_parameter("bias", bias.emplace(filled(normalized_shape, 0.0)));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  auto k = static_cast<int64_t>(normalized_shape.size());
  bool ok = x.ndim() >= k && std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k);
  TG_CHECK(ok, "LayerNorm: input ", x.describe(), " must end in normalized_shape ", shape_str(normalized_shape));
  std::vector<int64_t> axes;
  for (int64_t a = -k; a < 0; a++) axes.push_back(a);
  Tensor y = x.layernorm(axes, eps);
  if (weight) y = y * *weight + *bias;
  return y;
}

RMSNorm::RMSNorm(int64_t d, double eps_) : dim(d), eps(eps_) {
  check_positive("RMSNorm", "dim", d);
  weight = filled({d}, 1.0);
  register_parameter("weight", weight);
}

Tensor RMSNorm::forward(const Tensor& x) {
  TG_CHECK(x.ndim() >= 1 && x.shape().back() == dim, "RMSNorm: input ", x.describe(), " must end in dim=", dim);
  return x * (x.square().mean(-1, true) + eps).rsqrt() * weight;
}

// ---- Embedding ----

Embedding::Embedding(int64_t vocab, int64_t d) : vocab_size(vocab), dim(d) {
  check_positive("Embedding", "vocab_size", vocab);
  check_positive("Embedding", "dim", d);
  weight = Tensor::randn({vocab, d});
  register_parameter("weight", weight);
}

// Indices outside [0, vocab_size) give a zero row and no gradient. The lookup is a gather and
// its gradient a scatter-add: O(N*D) for N indices (Note [gather and scatter-add] in lazy.cpp).
Tensor Embedding::forward(const Tensor& idx) {
  TG_CHECK(is_int(idx.dtype()), "Embedding: indices must be an integer tensor, got ",
           idx.describe());
  Shape out = idx.shape();
  out.push_back(dim);
  return weight.index_select(0, idx.reshape({idx.numel()})).reshape(out);
}

// ---- Dropout, Sequential ----

Dropout::Dropout(double p_) : p(p_) { TG_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got ", p); }

Module& Sequential::append(std::unique_ptr<Module> m) {
  TG_CHECK(m != nullptr, "Sequential: cannot append a null module");
  Module& ref = *m;
  register_module(std::to_string(layers_.size()), ref);
  layers_.push_back(std::move(m));
  if (!is_training()) ref.train(false);
  return ref;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

namespace {
bool is_activation(Module& m) {
  return dynamic_cast<ReLU*>(&m) || dynamic_cast<GELU*>(&m) || dynamic_cast<SiLU*>(&m) || dynamic_cast<Tanh*>(&m) ||
         dynamic_cast<Sigmoid*>(&m) || dynamic_cast<Identity*>(&m) || dynamic_cast<Dropout*>(&m);
}
}  // namespace

// Note [tensor parallel] in module.cpp
void Sequential::tensor_parallel(const std::vector<std::string>& devices) {
  if (devices.size() < 2) return;
  for (size_t i = 0; i < layers_.size(); i++) {
    auto* first = dynamic_cast<Linear*>(layers_[i].get());
    size_t j = i + 1;
    while (first && j < layers_.size() && is_activation(*layers_[j])) j++;
    auto* second = first && j < layers_.size() ? dynamic_cast<Linear*>(layers_[j].get()) : nullptr;
    if (!second) {
      layers_[i]->tensor_parallel(devices);
      continue;
    }
    first->shard_columns(devices, "layer " + std::to_string(i) + " (Linear)");
    second->shard_rows(devices, "layer " + std::to_string(j) + " (Linear)");
    for (size_t k = i + 1; k < j; k++) layers_[k]->tensor_parallel(devices);
    i = j;
  }
}

Module& Sequential::operator[](size_t i) {
  TG_CHECK(i < layers_.size(), "Sequential: index ", i, " is out of range for ", layers_.size(), " layers");
  return *layers_[i];
}

}  // namespace tg::nn
