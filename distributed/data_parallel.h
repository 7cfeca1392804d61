// Data parallelism: every rank holds the whole model and a disjoint shard of each global batch.
// DataParallel broadcasts the initial parameters from rank 0 and, after backward, groups the
// gradients into buckets (in reverse parameter order, the order backward produces them) of about
// bucket_mb megabytes and replaces each gradient by a view of its bucket's ALLREDUCE, scaled by
// 1/world, so the averaging fuses into the optimizer's update kernels. The buckets' all-reduces
// are scheduled as graph nodes (collective_runner.h). A rank may train on several devices of its
// process (Note [gradients over a rank's devices] in data_parallel.cpp); rank_devices says which.
// Parameters split over those devices (tensor parallel) go into buckets of their own, reduced
// part by part and kept split (Note [split gradients across the ranks]).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "tinygrad/tensor.h"

namespace tg::dist {

// Rows [begin, end) of a global batch of `global` examples that `rank` takes (global % world == 0).
std::pair<int64_t, int64_t> shard_range(int64_t global, int rank, int world);
// This rank's shard of x along axis 0.
Tensor shard_batch(const Tensor& x, int rank, int world);

// Note [a rank's devices]: with train.devices=D (a count) each rank trains on D devices of its
// process. GPUs are the node's, shared by its ranks: local rank l takes CUDA:l*D .. CUDA:l*D+D-1,
// and a node whose ranks need more GPUs than it has is refused, naming both numbers. Every other
// backend's devices are numbered from 0 on each rank: the CPU's devices are virtual, each
// process's own (Note [virtual CPU devices] in tinygrad/runtime/cpu.cpp). The first device is
// the rank's own: its default device, where its process group's buffers live.
std::vector<std::string> rank_devices(const std::string& backend, int64_t per_rank, LocalRanks local, int gpus_on_node);

struct DataParallelOptions {
  double bucket_mb = 25.0;  // bucket size in MB (1e6 bytes); a parameter larger than it is a bucket alone
  // The dtype gradients travel in: float32, or bfloat16 (half the bytes; Note [bfloat16
  // gradients]). Each bucket is cast before its all-reduce and back to the parameters' dtype
  // after it, so the averaging and the update stay in float32.
  DType grad_dtype = DType::Float32;
};

struct GradBucket {
  std::vector<size_t> params;  // indices into the parameter list
  int64_t numel = 0;
  DType dtype = DType::Float32;  // the parameters' dtype (the bucket travels in the grad dtype)
  // Its parameters are split over the rank's devices: one all-reduce per device (over pg's host
  // memory) or one on the first device (Note [split gradients across the ranks]).
  bool split = false;
};

// How a parameter lies over the rank's devices: split along `axis` in `groups` over `devices`
// devices (axis -1: replicated, or on one device).
struct ParamSplit {
  int64_t axis = -1;
  int64_t groups = 1;
  int64_t devices = 1;
};

class DataParallel {
 public:
  DataParallel(ProcessGroup& pg, std::vector<Tensor*> params, DataParallelOptions opt = {});

  // Gives every rank rank `root`'s parameter values (on every device of a parameter's tuple).
  void broadcast_parameters(int root = 0);
  // After backward: the buckets' lazy ALLREDUCE outputs, in bucket order (pass them to the
  // optimizer step's also_realize first, so the schedule starts each as early as it can); every
  // parameter's gradient becomes its averaged slice. A parameter without a gradient contributes
  // zeros and gets none. Parameters over several devices of this process are reduced over them
  // first (Note [gradients over a rank's devices]).
  Tensors reduce_gradients();
  // The global L2 norm of the gradients that reduce_gradients set, lazily, as a 0-d float32
  // tensor, from its outputs `reduced`: one reduce per bucket instead of one per parameter (Note
  // [the norm from the buckets]); the per-parameter nn::grad_norm_lazy where a bucket is split
  // over this rank's devices.
  Tensor grad_norm_lazy(const Tensors& reduced) const;

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  ProcessGroup& group() { return pg_; }
  const std::vector<Tensor*>& params() const { return params_; }

 private:
  ProcessGroup& pg_;
  std::vector<Tensor*> params_;
  std::vector<ParamSplit> splits_;  // of each parameter
  std::vector<GradBucket> buckets_;
  DType grad_dtype_;

  Tensor bucket_input(const GradBucket& b) const;
  void set_bucket_grads(const GradBucket& b, const Tensor& reduced, double scale);
};

}  // namespace tg::dist
