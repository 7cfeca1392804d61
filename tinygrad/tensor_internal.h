// Internals shared by the tensor_*.cpp files: building results that track gradients, checks
// with messages that name the operands, axis normalisation.
#pragma once
#include <string>

#include "tinygrad/error.h"
#include "tinygrad/lazy.h"
#include "tinygrad/tensor.h"

namespace tg {

struct TensorAccess {
  // A new tensor for `u`; it tracks gradients when an input does (outside NoGradGuard).
  static Tensor result(UOpPtr u, std::initializer_list<const Tensor*> inputs);
  // The buffer t's value is in (null while it is lazy); never realizes.
  static std::shared_ptr<Buffer> buffer(const Tensor& t);
  // Points t (and every copy of it) at `buf`, which holds a value of t's shape and dtype.
  static void set_buffer(const Tensor& t, std::shared_ptr<Buffer> buf);
  // The buffers of t's parts, one per device of its tuple (one for a tensor on one device); empty
  // while t (or one of its parts) is lazy. Never realizes.
  static std::vector<std::shared_ptr<Buffer>> buffers(const Tensor& t);
  // Points t (and every copy of it) at `bufs`, one per part, keeping its split over the devices.
  static void set_buffers(const Tensor& t, const std::vector<std::shared_ptr<Buffer>>& bufs);
  // The same for t and all its copies (they share one state), different for any other tensor.
  static const void* identity(const Tensor& t);
  // Whether t's value is a buffer that only t (and its copies) holds, besides `others` references
  // its caller knows of: no other tensor, lazy graph or cached result sees it, so writing over it
  // changes no value but t's (Note [state updated in place] in engine/jit_in_place.cpp).
  static bool holds_buffer_alone(const Tensor& t, long others);
};

inline Tensor result(UOpPtr u, std::initializer_list<const Tensor*> inputs) {
  return TensorAccess::result(std::move(u), inputs);
}

// Images per partial sum of a channel-last convolution's weight gradient: the largest divisor of
// the batch n whose images (input and output gradient, image_bytes each) fill at most half of an
// L2 of l2_bytes (Note [weight gradient blocks] in tensor_nn.cpp).
int64_t weight_gradient_images(int64_t n, int64_t image_bytes, int64_t l2_bytes);

// Normalises a possibly negative axis; throws naming the op and tensor when out of range.
int64_t norm_axis(const char* op, const Tensor& t, int64_t axis, int64_t ndim_extra = 0);
std::vector<int64_t> norm_axes(const char* op, const Tensor& t, const std::vector<int64_t>& axes);
// Broadcast shape of two shapes; throws naming the op and both tensors.
Shape broadcast_shape(const char* op, const Tensor& a, const Tensor& b);
// Casts both to their promoted dtype and broadcasts to a common shape; checks devices.
std::pair<Tensor, Tensor> align(const char* op, const Tensor& a, const Tensor& b);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
// opt with its dtype defaulted.
inline TensorOptions with_dtype(TensorOptions opt, DType fallback) {
  if (!opt.dtype) opt.dtype = fallback;
  return opt;
}

}  // namespace tg
