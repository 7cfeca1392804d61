// Seeded batch shards, parameter broadcast and gradient buckets (see data_parallel.h).
#include "distributed/data_parallel.h"

#include "distributed/collective_runner.h"
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

Tensor shard_batch(const Tensor& x, int rank, int world) {
  if (world == 1) return x;
  auto [b, e] = shard_range(x.shape(0), rank, world);
  std::vector<std::pair<int64_t, int64_t>> bounds(x.ndim(), {0, 0});
  for (int64_t d = 0; d < x.ndim(); d++) bounds[d] = {0, x.shape(d)};
  bounds[0] = {b, e};
  return x.shrink(bounds);
}

DataParallel::DataParallel(ProcessGroup& pg, std::vector<Tensor*> params, DataParallelOptions opt)
    : pg_(pg), params_(std::move(params)) {
  TG_CHECK(opt.bucket_mb > 0, "data parallel: bucket size must be > 0 MB, got ", opt.bucket_mb);
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
    Tensor v = p->detach().contiguous();
    v.realize();
    std::vector<uint8_t> host(static_cast<size_t>(p->numel()) * itemsize(p->dtype()));
    auto buf = v.uop()->op == Op::BUFFER ? v.uop()->arg_buffer() : v.uop()->realized;
    TG_ASSERT(buf, "broadcast_parameters: parameter not realized");
    if (!host.empty()) buf->copy_out(host.data(), host.size());
    pg_.broadcast(host.data(), static_cast<size_t>(p->numel()), p->dtype(), root)->wait();
    if (pg_.rank() != root)
      p->assign(Tensor::from_data(host.data(), p->dtype(), p->shape(), {.dtype = p->dtype(), .device = p->device()}));
  }
}

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
    Tensor reduced = all_reduce_node(flat.size() == 1 ? flat[0] : Tensor::cat(flat, 0));
    int64_t off = 0;
    for (size_t k : b.params) {
      Tensor& p = *params_[k];
      if (p.grad()) p.set_grad(reduced.shrink({{off, off + p.numel()}}).reshape(p.shape()) * inv);
      off += p.numel();
    }
    outs.push_back(reduced);
  }
  return outs;
}

}  // namespace tg::dist
