// Seeded batch shards, parameter broadcast and gradient buckets (see data_parallel.h).
#include "distributed/data_parallel.h"

#include <algorithm>
#include <optional>

#include "distributed/collective_runner.h"
#include "distributed/host_exchange.h"
#include "tinygrad/device.h"
#include "tinygrad/error.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/optim.h"
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

namespace {

ParamSplit split_of(const Tensor& p) {
  return {p.shard_axis().value_or(-1), p.shard_groups(), static_cast<int64_t>(p.devices().size())};
}

// The split's flat view [outer, devices, inner]: device k holds [:, k, :] (Note [grouped splits]
// in tinygrad/multi.cpp).
std::pair<int64_t, int64_t> outer_inner(const Shape& shape, int64_t numel, const ParamSplit& s) {
  int64_t outer = s.groups;
  for (int64_t i = 0; i < s.axis; i++) outer *= shape[static_cast<size_t>(i)];
  return {outer, numel / (outer * s.devices)};
}

// g, split as s, as [devices, numel / devices] split along axis 0: row k is device k's part,
// flattened (Note [split gradients across the ranks]).
Tensor device_rows(const Tensor& g, const ParamSplit& s) {
  auto [outer, inner] = outer_inner(g.shape(), g.numel(), s);
  return g.reshape({outer, s.devices, inner}).permute({1, 0, 2}).reshape({s.devices, outer * inner});
}

// The inverse of device_rows: rows [devices, m] back to `shape`, split as s.
Tensor from_device_rows(const Tensor& rows, const Shape& shape, const ParamSplit& s) {
  const int64_t numel = rows.numel();
  auto [outer, inner] = outer_inner(shape, numel, s);
  return rows.reshape({s.devices, outer, inner}).permute({1, 0, 2}).reshape(shape);
}

// Note [bucket layout]: backward's kernels store each gradient straight into its bucket where
// its offset there suits the device (Note [concatenations stored in place] in
// tinygrad/schedule/concat_in_place.cpp: any element's on the CPU, 16 bytes on CUDA), and the
// bucket is no kernel of its own only when every piece is so stored. Filled in reverse parameter
// order, one odd-sized piece (the CNN's 10-element bias: 40 bytes) would move every later one
// off the grid. So within a bucket the pieces whose bytes are a multiple of the alignment come
// first, in their order, and the others after them: the first odd piece still starts on the
// grid, and only the ones after it are written by a kernel. The order within a bucket changes
// nothing else: the bucket is summed element by element, and every rank lays it out alike.
void put_aligned_pieces_first(GradBucket& b, const std::vector<Tensor*>& params, const std::vector<ParamSplit>& splits) {
  const Tensor& first = *params[b.params.front()];
  const size_t align = get_device(first.devices().front()).policy().view_alignment;
  if (align == 0) return;
  auto aligned = [&](size_t k) {
    const int64_t elements = b.split ? params[k]->numel() / splits[k].devices : params[k]->numel();
    return static_cast<size_t>(elements) * itemsize(params[k]->dtype()) % align == 0;
  };
  std::stable_partition(b.params.begin(), b.params.end(), aligned);
}

}  // namespace

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
  std::vector<std::string> split_devices;  // the tuple every split parameter lies on
  std::optional<size_t> open[2];           // the bucket being filled, of replicated and of split parameters
  for (Tensor* p : params_) splits_.push_back(split_of(*p));
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = *params_[k];
    check_collective_dtype("data parallel", p.dtype());
    const bool split = splits_[k].axis >= 0;  // Note [split gradients across the ranks]
    if (split && split_devices.empty()) split_devices = p.devices();
    TG_CHECK(!split || p.devices() == split_devices, "data parallel: parameter ", k, " is split over ",
             join_devices(p.devices()), ", another over ", join_devices(split_devices),
             " (the split parameters of a rank must share one device tuple)");
    std::optional<size_t>& at = open[split ? 1 : 0];
    bool fits = at && buckets_[*at].dtype == p.dtype() &&
                static_cast<double>((buckets_[*at].numel + p.numel()) * itemsize(p.dtype())) <= limit;
    if (!fits) {
      buckets_.push_back(GradBucket{{}, 0, p.dtype(), split});
      at = buckets_.size() - 1;
    }
    buckets_[*at].params.push_back(k);
    buckets_[*at].numel += p.numel();
  }
  for (auto& b : buckets_) put_aligned_pieces_first(b, params_, splits_);
}

void DataParallel::broadcast_parameters(int root) {
  NoGradGuard no_grad;
  for (Tensor* p : params_) {
    // a replicated parameter's first copy stands for all; a split one is gathered there (once)
    const std::string own = p->devices()[0];
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
//
// Note [split gradients across the ranks]: with model.tensor_parallel=N under ddp (Megatron's
// tensor x data parallel) each rank holds the model split over its N devices: column- and
// row-parallel weights (and column-parallel biases) split, the rest replicated. Backward leaves
// each split gradient on the devices of its parameter, device k holding the gradient of its own
// part, and that part is to be averaged with device k's part on every other rank. So the split
// parameters get buckets of their own (the replicated ones keep the path of Note [gradients over
// a rank's devices]; each kind fills its own bucket, so alternating layers still make few
// buckets). A split bucket is a [N, m] tensor split along axis 0 whose row k is the
// concatenation of device k's parts of its gradients, each flattened from its split's view
// [outer, N, inner] (Note [grouped splits] in tinygrad/multi.cpp), so the rows are built on the
// devices with no copy between them. It is summed across the ranks part by part
// (all_reduce_split_node: one ALLREDUCE per device over a host group, one on the first device
// over nccl: Note [split tensors across the ranks] in collective_runner.cpp) and each gradient
// is cut back out of its device's row, with its parameter's layout, and scaled by 1/world: the
// optimizer's update stays per device. Every rank builds the same buckets in the same order
// (the same parameters, split alike over the same number of devices), so every rank issues the
// same collectives in the same order, which the engine's sequence check confirms. The global norm of the step's check and
// clipping sums each device's squares of a split gradient once (the reduction over a split
// tensor adds its parts) and each replicated gradient once (its copies are one value).
Tensor DataParallel::bucket_input(const GradBucket& b) const {
  Tensors flat;
  for (size_t k : b.params) {
    const Tensor& p = *params_[k];
    auto g = p.grad();
    Tensor gd = g ? g->detach() : p.detach().zeros_like();
    if (gd.dtype() != p.dtype()) gd = gd.cast(p.dtype());
    flat.push_back(b.split ? device_rows(gd, splits_[k]) : gd.reshape({p.numel()}));
  }
  return flat.size() == 1 ? flat[0] : Tensor::cat(flat, b.split ? 1 : 0);
}

void DataParallel::set_bucket_grads(const GradBucket& b, const Tensor& reduced, double scale) {
  int64_t off = 0;
  for (size_t k : b.params) {
    Tensor& p = *params_[k];
    const ParamSplit& s = splits_[k];
    const int64_t m = b.split ? p.numel() / s.devices : p.numel();  // the elements of one row
    if (p.grad()) {
      Tensor g = b.split ? from_device_rows(reduced.shrink({{0, s.devices}, {off, off + m}}), p.shape(), s)
                         : reduced.shrink({{off, off + m}}).reshape(p.shape());
      p.set_grad(g * scale);
    }
    off += m;
  }
}

Tensors DataParallel::reduce_gradients() {
  NoGradGuard no_grad;
  Tensors outs;
  const double inv = 1.0 / pg_.size();
  for (auto& b : buckets_) {
    Tensor bucket = bucket_input(b);
    const bool narrowed = grad_dtype_ != b.dtype && is_float(b.dtype);
    if (narrowed) bucket = bucket.cast(grad_dtype_);  // Note [bfloat16 gradients]
    Tensor node = b.split ? all_reduce_split_node(pg_, bucket) : all_reduce_node(pg_, bucket);
    set_bucket_grads(b, narrowed ? node.cast(b.dtype) : node, inv);
    outs.push_back(node);
  }
  return outs;
}

// Note [the norm from the buckets]: the skip check needs the global norm of the reduced
// gradients, and every step reports it. Summed parameter by parameter (nn::grad_norm_lazy) it is
// a reduce per gradient: 17 small kernels for the CNN's 20 parameters in the replayed ddp step on
// an H100, each a launch of its own in a 1 ms step. A bucket holds its parameters' gradients side
// by side (zeros for a parameter without one), so the same sum of squares is one reduce over each
// bucket's averaged values: the same elements, added in another order. Every rank runs the same
// kernels on the same bits, so the decision taken from it still agrees (Note [one decision from
// the reduced gradients] in coordinated_step.h). On the CPU the CNN's replayed ddp step went from
// 115 to 102 kernels (the plain step has 112: it sums parameter by parameter).
// Clipping keeps the per-parameter sum: its scale enters the update, and a norm rounded
// differently (6e-6 relative at most in the MLP of test_dist_train) moved a hidden unit of one
// example across the ReLU's kink by the fifth step, after which the parameters differed from one
// process's by far more than the 1e-5 that ddp holds to. The skip check (is the norm finite?) and
// the report do not feed the update. A bucket split over the rank's devices keeps the
// per-parameter sum too, which counts each device's rows once.
Tensor DataParallel::grad_norm_lazy(const Tensors& reduced) const {
  NoGradGuard no_grad;
  TG_CHECK(reduced.size() == buckets_.size(), "data parallel: the gradient norm needs the ", buckets_.size(),
           " buckets' all-reduce outputs (reduce_gradients), got ", reduced.size());
  const bool split = std::any_of(buckets_.begin(), buckets_.end(), [](const GradBucket& b) { return b.split; });
  if (split || reduced.empty()) return nn::grad_norm_lazy(params_);
  const double inv = 1.0 / pg_.size();
  std::optional<Tensor> sq;
  for (size_t i = 0; i < reduced.size(); i++) {  // the gradients as set_bucket_grads makes them
    Tensor g = reduced[i].dtype() == buckets_[i].dtype ? reduced[i] : reduced[i].cast(buckets_[i].dtype);
    Tensor s = (g * inv).cast(DType::Float32).square().sum();
    sq = sq ? *sq + s : s;
  }
  return sq->sqrt();
}

}  // namespace tg::dist
