// Seeded batch shards, parameter broadcast and gradient buckets (see data_parallel.h).
#include "distributed/data_parallel.h"

#include "distributed/collective_runner.h"
#include "distributed/host_exchange.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/ops.h"

namespace tg::dist {

std::pair<int64_t, int64_t> shard_range(int64_t global, int rank, int world) {
  TG_CHECK(world >= 1 && rank >= 0 && rank < world, "shard: rank ", rank, " is outside a world of ", world);
  TG_CHECK(global % world == 0, "shard: the global batch of ", global, " examples does not split evenly over ", world,
           " ranks (choose data.batch_size as a multiple of the world size)");
  int64_t per = global / world;
  return {per * rank, per * (rank + 1)};
}

std::vector<std::string> rank_devices(const std::string& backend, int64_t per_rank, LocalRanks local, int gpus_on_node) {
  TG_CHECK(per_rank >= 1, "rank devices: at least 1 device per rank, got ", per_rank);
  int64_t first = 0;
  if (backend == "CUDA") {  // Note [a rank's devices]
    const int64_t needed = static_cast<int64_t>(local.size) * per_rank;
    TG_CHECK(needed <= gpus_on_node, per_rank, " devices per rank: ", local.size, " rank(s) on this node need ", needed,
             " CUDA devices; this node has ", gpus_on_node);
    first = static_cast<int64_t>(local.rank) * per_rank;
  }
  std::vector<std::string> out;
  for (int64_t i = 0; i < per_rank; i++) out.push_back(canonical_device(backend + ":" + std::to_string(first + i)));
  return out;
}

Tensor shard_batch(const Tensor& x, int rank, int world) {
  if (world == 1) return x;
  auto [b, e] = shard_range(x.shape(0), rank, world);
  std::vector<std::pair<int64_t, int64_t>> bounds(x.ndim(), {0, 0});
  for (int64_t d = 0; d < x.ndim(); d++) bounds[d] = {0, x.shape(d)};
  bounds[0] = {b, e};
  return x.shrink(bounds);
}

// Note [bfloat16 gradients]: with grad_dtype bfloat16 a bucket crosses the network in half the
// bytes. Each rank rounds its float32 gradient to bfloat16 (8 bits of mantissa), the backend
// adds the ranks' values in float32 and rounds after each addition (MPI here, NCCL alike), and
// the sum is cast back to float32 before the 1/N scale, so the average and the optimizer's
// update run in float32. The cost is a relative error of about 2^-8 per gradient element, as with
// PyTorch DDP's bf16 compression hook; parameters and optimizer state are untouched.
DataParallel::DataParallel(ProcessGroup& pg, std::vector<Tensor*> params, DataParallelOptions opt)
    : pg_(pg), params_(std::move(params)), grad_dtype_(opt.grad_dtype) {
  TG_CHECK(opt.bucket_mb > 0, "data parallel: bucket size must be > 0 MB, got ", opt.bucket_mb);
  TG_CHECK(grad_dtype_ == DType::Float32 || grad_dtype_ == DType::BFloat16, "data parallel: gradients travel in ",
           "float32 or bfloat16, not ", dtype_name(grad_dtype_));
  const double limit = opt.bucket_mb * 1e6;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = *params_[k];
    check_collective_dtype("data parallel", p.dtype());
    bool fits = !buckets_.empty() && buckets_.back().dtype == p.dtype() &&
                static_cast<double>((buckets_.back().numel + p.numel()) * itemsize(p.dtype())) <= limit;
    if (!fits) buckets_.push_back(GradBucket{{}, 0, p.dtype()});
    buckets_.back().params.push_back(k);
    buckets_.back().numel += p.numel();
  }
}

void DataParallel::broadcast_parameters(int root) {
  NoGradGuard no_grad;
  for (Tensor* p : params_) {
    const std::string own = p->devices()[0];  // a replicated parameter's first copy stands for all
    Tensor v = p->detach().to(own).contiguous();
    v.realize();
    std::vector<uint8_t> host(static_cast<size_t>(p->numel()) * itemsize(p->dtype()));
    auto buf = v.uop()->op == Op::BUFFER ? v.uop()->arg_buffer() : v.uop()->realized;
    TG_ASSERT(buf, "broadcast_parameters: parameter not realized");
    if (!host.empty()) buf->copy_out(host.data(), host.size());
    broadcast_host(pg_, host.data(), static_cast<size_t>(p->numel()), p->dtype(), root);
    if (pg_.rank() != root)
      p->assign(Tensor::from_data(host.data(), p->dtype(), p->shape(), {.dtype = p->dtype(), .device = own}).shard_like(*p));
  }
}

// Note [gradients over a rank's devices]: with train.devices each rank replicates the parameters
// over its devices and splits its share of the batch over them, so backward's gradients are
// logical tensors over the device tuple, whose lowering sums the devices' partial gradients (the
// multi-device rewrite's all-reduce). A bucket of them is one ALLREDUCE across the ranks as on
// one device: the node takes the bucket from the tuple's first device and returns the sum
// replicated over the tuple (Note [collectives of a tensor over several devices] in
// collective_runner.cpp), so the gradients are summed within the process, then across the ranks,
// then copied back to every device, and each is scaled by 1/world there. Each rank's loss is the
// mean over its share of the global batch, so the result is the global batch's mean gradient, as
// with one device per rank, and every device applies the same update.
Tensors DataParallel::reduce_gradients() {
  NoGradGuard no_grad;
  Tensors outs;
  const double inv = 1.0 / pg_.size();
  for (auto& b : buckets_) {
    Tensors flat;
    for (size_t k : b.params) {
      Tensor& p = *params_[k];
      auto g = p.grad();
      Tensor gd = g ? g->detach() : p.detach().zeros_like();
      if (gd.dtype() != p.dtype()) gd = gd.cast(p.dtype());
      flat.push_back(gd.reshape({p.numel()}));
    }
    Tensor bucket = flat.size() == 1 ? flat[0] : Tensor::cat(flat, 0);
    const bool narrowed = grad_dtype_ != b.dtype && is_float(b.dtype);
    if (narrowed) bucket = bucket.cast(grad_dtype_);  // Note [bfloat16 gradients]
    Tensor node = all_reduce_node(pg_, bucket);
    Tensor reduced = narrowed ? node.cast(b.dtype) : node;
    int64_t off = 0;
    for (size_t k : b.params) {
      Tensor& p = *params_[k];
      if (p.grad()) p.set_grad(reduced.shrink({{off, off + p.numel()}}).reshape(p.shape()) * inv);
      off += p.numel();
    }
    outs.push_back(node);
  }
  return outs;
}

}  // namespace tg::dist
