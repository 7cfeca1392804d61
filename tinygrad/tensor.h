// tg::Tensor: the user-facing array. Lazy (operations build a UOp graph; realize() or reading
// the data runs it), NumPy-like, with reverse-mode autograd (backward()).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tinygrad/dtype.h"
#include "tinygrad/error.h"
#include "tinygrad/ops.h"

namespace tg {

class Tensor;
using Tensors = std::vector<Tensor>;

struct TensorOptions {
  std::optional<DType> dtype;  // unset: float32 (from_data/from_vector: the source's dtype)
  std::string device;  // empty: default device
  bool requires_grad = false;
};

// Slicing: Slice{begin, end, step}; missing ends are open, negatives count from the end.
struct Slice {
  std::optional<int64_t> begin, end;
  int64_t step = 1;
};
struct Index {
  enum class Kind { Int, Slice, All, NewAxis } kind;
  int64_t i = 0;
  Slice s;
  Index(int64_t v) : kind(Kind::Int), i(v) {}  // NOLINT: implicit, as in t[{0, Slice{}}]
  Index(int v) : kind(Kind::Int), i(v) {}      // NOLINT
  Index(Slice v) : kind(Kind::Slice), s(v) {}  // NOLINT
  static Index all() { return Index(Kind::All); }
  static Index newaxis() { return Index(Kind::NewAxis); }

 private:
  explicit Index(Kind k) : kind(k) {}
};

class Tensor {
 public:
  Tensor();  // a scalar 0.0 (so Tensor can sit in containers)
  explicit Tensor(UOpPtr uop, bool requires_grad = false);

  // ---- creation ----
  // Copies host data; the tensor's dtype is opt.dtype, or src_dtype when that is unset.
  static Tensor from_data(const void* data, DType src_dtype, const Shape& shape, const TensorOptions& opt = {});
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape, const TensorOptions& opt = {});
  static Tensor from_vector(const std::vector<double>& v, const Shape& shape, const TensorOptions& opt = {});
  static Tensor from_vector(const std::vector<int32_t>& v, const Shape& shape, const TensorOptions& opt = {});
  static Tensor from_vector(const std::vector<int64_t>& v, const Shape& shape, const TensorOptions& opt = {});
  static Tensor from_vector(const std::vector<uint8_t>& v, const Shape& shape, const TensorOptions& opt = {});
  static Tensor scalar(double v, const TensorOptions& opt = {});
  static Tensor empty(const Shape& shape, const TensorOptions& opt = {});
  static Tensor zeros(const Shape& shape, const TensorOptions& opt = {});
  static Tensor ones(const Shape& shape, const TensorOptions& opt = {});
  static Tensor full(const Shape& shape, double value, const TensorOptions& opt = {});
  static Tensor arange(double start, double stop, double step = 1, const TensorOptions& opt = {});
  static Tensor arange(int64_t stop, const TensorOptions& opt = {.dtype = DType::Int32});
  static Tensor linspace(double start, double stop, int64_t steps, const TensorOptions& opt = {});
  static Tensor eye(int64_t n, const TensorOptions& opt = {});
  // Random tensors from a counter-based generator (Philox 4x32-10): the same seed and shape give
  // the same values on every device. rand is computed by the device's kernels from a draw counter
  // the device holds, so a replayed step draws new values every time (dropout); randn, uniform
  // and randint (initialisers) are drawn on the host (Note [random numbers on the device]).
  static void manual_seed(uint64_t seed);
  static Tensor rand(const Shape& shape, const TensorOptions& opt = {});
  static Tensor randn(const Shape& shape, const TensorOptions& opt = {});
  static Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& opt = {});
  static Tensor randint(const Shape& shape, int64_t low, int64_t high, const TensorOptions& opt = {.dtype = DType::Int32});
  Tensor zeros_like() const;
  Tensor ones_like() const;
  Tensor full_like(double v) const;

  // ---- properties ----
  const Shape& shape() const;
  int64_t shape(int64_t axis) const;
  int64_t ndim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const { return tg::prod(shape()); }
  DType dtype() const;
  const std::string& device() const;
  const UOpPtr& uop() const;
  std::string describe() const;  // "float32[4,768] on CPU"

  // ---- realization and host access ----
  Tensor& realize();
  static void realize_all(const Tensors& ts);
  template <class T>
  std::vector<T> to_vector() const;  // T in float, double, int32_t, int64_t, uint8_t
  template <class T>
  T item() const;
  Tensor to(const std::string& device) const;
  // ---- several devices (Note [multi-device tensors] in multi.cpp) ----
  // This tensor split along `axis` over `devices` (none: a whole copy on each), as tinygrad's
  // shard; the axis must split evenly. to(devices) is shard(devices) (replicated). With groups,
  // the axis is viewed as [groups, size / groups] and each device holds its part of every group
  // (Note [grouped splits] in multi.cpp: q, k and v side by side, split by heads).
  Tensor shard(const std::vector<std::string>& devices, std::optional<int64_t> axis = std::nullopt,
               int64_t groups = 1) const;
  Tensor to(const std::vector<std::string>& devices) const;
  // In place: this tensor (and every copy of it) becomes its shard, realized; keeps requires_grad.
  Tensor& shard_(const std::vector<std::string>& devices, std::optional<int64_t> axis = std::nullopt,
                 int64_t groups = 1);
  // This tensor laid out as `other` is: on its device or devices, split along its axis in its groups.
  Tensor shard_like(const Tensor& other) const;
  std::vector<std::string> devices() const;  // the device tuple, or {device()}
  std::optional<int64_t> shard_axis() const;  // the split axis; none when replicated or on one device
  int64_t shard_groups() const;  // the split's groups (1 unless sharded in groups)
  Tensors shards() const;  // each device's part, realized ({*this} on one device)
  Tensor contiguous() const;
  // Replaces this tensor's value (same shape, dtype, device) with `v`, realized; cuts history.
  Tensor& assign(const Tensor& v);
  // Overwrites the buffer of a realized tensor in place with numel() host values of src_dtype.
  // Only for inputs that change between steps while the kernels reading them stay the same
  // (the optimizers' per-step scalars, replayed by TinyJit); every lazy graph that reads the
  // buffer and is realized later sees the new values.
  Tensor& write_(const void* data, DType src_dtype);

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  std::optional<Tensor> grad() const;
  void set_grad(std::optional<Tensor> g);
  void zero_grad() { set_grad(std::nullopt); }
  Tensor detach() const;
  // Accumulates d(this)/d(leaf) into leaf.grad() for every requires_grad tensor this depends on.
  void backward(std::optional<Tensor> gradient = std::nullopt) const;
  // Gradients of this (a scalar, or weighted by `gradient`) with respect to `wrt`.
  Tensors gradients(const Tensors& wrt, std::optional<Tensor> gradient = std::nullopt) const;

  // ---- elementwise ----
  Tensor cast(DType t) const;
  Tensor bitcast(DType t) const;
  Tensor float_() const { return cast(DType::Float32); }
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor exp2() const;
  Tensor log2() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor reciprocal() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tan() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor leaky_relu(double slope = 0.01) const;
  Tensor gelu() const;  // tanh approximation, as tinygrad
  Tensor silu() const;
  Tensor abs() const;
  Tensor sign() const;
  Tensor square() const;
  Tensor trunc() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;  // half to even
  Tensor clip(double lo, double hi) const;
  Tensor pow(const Tensor& e) const;
  Tensor pow(double e) const;
  Tensor maximum(const Tensor& o) const;
  Tensor minimum(const Tensor& o) const;
  Tensor where(const Tensor& a, const Tensor& b) const;  // this is the condition
  Tensor where(double a, double b) const;
  Tensor logical_not() const;
  Tensor logical_and(const Tensor& o) const;
  Tensor logical_or(const Tensor& o) const;
  Tensor logical_xor(const Tensor& o) const;
  // Bitwise operations on integer tensors (shift_right is arithmetic on signed values).
  Tensor bitwise_and(const Tensor& o) const;
  Tensor bitwise_or(const Tensor& o) const;
  Tensor bitwise_xor(const Tensor& o) const;
  Tensor shift_left(int64_t bits) const;
  Tensor shift_right(int64_t bits) const;
  Tensor isnan() const;
  Tensor isinf() const;
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;  // true division (ints become float32)
  Tensor idiv(const Tensor& o) const;  // integer division, truncating
  Tensor mod(const Tensor& o) const;
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  // A scalar as a tensor of this tensor's dtype and device (float scalars make int tensors float).
  Tensor scalar_like(double v) const;

  // ---- reductions (axes may be negative; empty axes: all) ----
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor sum(int64_t axis, bool keepdim = false) const { return sum(std::vector<int64_t>{axis}, keepdim); }
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor mean(int64_t axis, bool keepdim = false) const { return mean(std::vector<int64_t>{axis}, keepdim); }
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor max(int64_t axis, bool keepdim = false) const { return max(std::vector<int64_t>{axis}, keepdim); }
  Tensor min(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor min(int64_t axis, bool keepdim = false) const { return min(std::vector<int64_t>{axis}, keepdim); }
  Tensor prod(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor var(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  Tensor std(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  Tensor argmax(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  Tensor logsumexp(int64_t axis, bool keepdim = false) const;
  Tensor softmax(int64_t axis = -1) const;
  Tensor log_softmax(int64_t axis = -1) const;
  Tensor cumsum(int64_t axis) const;

  // ---- movement (views) ----
  Tensor reshape(Shape shape) const;  // one dim may be -1
  Tensor view(Shape shape) const { return reshape(std::move(shape)); }
  Tensor permute(std::vector<int64_t> order) const;
  Tensor transpose(int64_t a = -2, int64_t b = -1) const;
  Tensor T() const { return transpose(); }
  Tensor expand(Shape shape) const;  // -1 keeps a dim
  Tensor broadcast_to(const Shape& shape) const;
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& pads, double value = 0) const;
  Tensor shrink(const std::vector<std::pair<int64_t, int64_t>>& bounds) const;
  Tensor flip(std::vector<int64_t> axes) const;
  Tensor squeeze(std::optional<int64_t> axis = std::nullopt) const;
  Tensor unsqueeze(int64_t axis) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor repeat(const std::vector<int64_t>& times) const;
  Tensor slice(const std::vector<Index>& idx) const;
  Tensor operator[](const std::vector<Index>& idx) const { return slice(idx); }
  Tensor operator[](int64_t i) const { return slice({Index(i)}); }
  Tensor gather(int64_t axis, const Tensor& index) const;  // torch.gather
  Tensor index_select(int64_t axis, const Tensor& index) const;  // x[idx] along axis
  // torch.Tensor.scatter_add: a copy of x with src[i] added at i with i[axis] = index[i] (index and
  // src of one shape, no larger than x off the axis); indices outside x add nothing.
  Tensor scatter_add(int64_t axis, const Tensor& index, const Tensor& src) const;
  static Tensor cat(const Tensors& ts, int64_t axis = 0);
  static Tensor stack(const Tensors& ts, int64_t axis = 0);
  Tensors split(int64_t size, int64_t axis = 0) const;
  Tensors split(const std::vector<int64_t>& sizes, int64_t axis = 0) const;
  Tensors chunk(int64_t n, int64_t axis = 0) const;

  // ---- linear algebra and neural-network compositions ----
  Tensor matmul(const Tensor& o) const;
  Tensor dot(const Tensor& o) const { return matmul(o); }
  Tensor linear(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt) const;  // x @ W.T + b
  Tensor conv2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, std::vector<int64_t> stride = {1},
                std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1}, int64_t groups = 1) const;
  Tensor max_pool2d(std::vector<int64_t> kernel = {2}, std::vector<int64_t> stride = {},
                    std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1}) const;
  Tensor avg_pool2d(std::vector<int64_t> kernel = {2}, std::vector<int64_t> stride = {},
                    std::vector<int64_t> padding = {0}) const;
  Tensor one_hot(int64_t num_classes) const;
  Tensor dropout(double p, bool training = true) const;
  Tensor layernorm(std::vector<int64_t> axes = {-1}, double eps = 1e-5) const;
  // softmax(self @ k^T * scale + mask) @ v with self the queries [..., L, E], k [..., S, E], v
  // [..., S, Ev] (PyTorch's F.scaled_dot_product_attention): causal lets query i see keys j <= i,
  // mask (bool, true: attend) broadcasts against [..., L, S], scale defaults to 1/sqrt(E), and
  // dropout_p drops attention weights (Note [attention as a composition] in tensor_attention.cpp).
  Tensor scaled_dot_product_attention(const Tensor& k, const Tensor& v, bool causal = false, double dropout_p = 0,
                                      const std::optional<Tensor>& mask = std::nullopt,
                                      std::optional<double> scale = std::nullopt) const;
  // Mean over the batch of -log softmax(self)[label]; labels are integers of shape [N].
  Tensor sparse_categorical_crossentropy(const Tensor& labels, double label_smoothing = 0) const;
  Tensor cross_entropy(const Tensor& labels) const { return sparse_categorical_crossentropy(labels); }
  Tensor binary_crossentropy(const Tensor& target) const;         // on probabilities
  Tensor binary_crossentropy_logits(const Tensor& target) const;  // on logits
  Tensor mse(const Tensor& target) const;

  // Sliding windows over the last k dims: [..., o1..ok, k1..kk] (a view).
  Tensor pool_windows(const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                      const std::vector<int64_t>& dilation) const;

  struct State;  // defined in tensor.cpp

 private:
  std::shared_ptr<State> state_;
  friend struct TensorAccess;
};

// Scopes where new tensors do not track gradients.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
  static bool enabled();  // true inside a NoGradGuard

 private:
  bool prev_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, double b);
Tensor operator>(const Tensor& a, double b);
Tensor operator==(const Tensor& a, const Tensor& b);

}  // namespace tg
