// Tensor methods for tensors over several devices: shard, replication, and the per-device parts
// (Note [multi-device tensors] in multi.cpp).
#include "tinygrad/multi.h"
#include "tinygrad/tensor_internal.h"

namespace tg {

Tensor Tensor::shard(const std::vector<std::string>& devices, std::optional<int64_t> axis, int64_t groups) const {
  int64_t a = axis ? norm_axis("shard", *this, *axis) : -1;
  return result(shard_uop(uop(), devices, a, groups), {this});
}

Tensor Tensor::to(const std::vector<std::string>& devices) const { return shard(devices); }

Tensor Tensor::shard_like(const Tensor& other) const {
  if (!is_device_tuple(other.device())) return device() == other.device() ? *this : to(other.device());
  SplitLayout split = multi_layout(other.uop());
  return shard(other.devices(), split.axis < 0 ? std::nullopt : std::optional<int64_t>(split.axis), split.groups);
}

std::vector<std::string> Tensor::devices() const { return split_devices(device()); }

std::optional<int64_t> Tensor::shard_axis() const {
  int64_t axis = multi_axis(uop());
  return axis < 0 ? std::nullopt : std::optional<int64_t>(axis);
}

int64_t Tensor::shard_groups() const { return multi_layout(uop()).groups; }

Tensors Tensor::shards() const {
  if (!is_device_tuple(device())) return {*this};
  Tensor t = *this;
  t.realize();
  Tensors out;
  Lowered lowered = lower_multi({t.uop()})[0];
  for (auto& part : lowered.parts) out.push_back(Tensor(part));
  return out;
}

}  // namespace tg
