// The training loop, checkpoints and the optimizer / schedule builders (see trainer.h).
#include "launcher/trainer.h"

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include "distributed/coordinated_step.h"
#include "distributed/host_exchange.h"
#include "launcher/rank_agreement.h"
#include "tinygrad/device.h"
#include "tinygrad/engine/trace.h"
#include "tinygrad/error.h"
#include "tinygrad/knobs.h"
#include "tinygrad/multi.h"
#include "tinygrad/nn/gpt.h"
#include "tinygrad/nn/state.h"

namespace fs = std::filesystem;

namespace tg::launcher {

namespace {

constexpr const char* CHECKPOINT_FORMAT = "tg-checkpoint-1";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A whole string of decimal digits as an int64; nullopt for anything else ("", "12x8", "-3",
// " 7", or past INT64_MAX).
std::optional<int64_t> parse_count(const std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// "step_120.safetensors" -> 120; nullopt for any other file. A name of that form whose number is
// no valid step (past INT64_MAX) gives nullopt too, with the reason in `why`.
std::optional<int64_t> checkpoint_step(const fs::path& p, std::string* why) {
  std::string n = p.filename().string();
  const std::string pre = "step_", suf = ".safetensors";
  if (n.size() <= pre.size() + suf.size() || n.rfind(pre, 0) != 0 || n.substr(n.size() - suf.size()) != suf)
    return std::nullopt;
  std::string digits = n.substr(pre.size(), n.size() - pre.size() - suf.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;  // e.g. a zero1 shard
  auto step = parse_count(digits);
  if (!step && why) *why = "'" + digits + "' is not a valid step number (more than 2^63-1); not a checkpoint of tg train";
  return step;
}

// The checkpoints of run_dir/checkpoints by name, newest first; names that look like checkpoints
// but are none go to `passed_over` ("<path>: <why>").
std::vector<std::pair<int64_t, std::string>> checkpoint_files(const fs::path& dir, std::vector<std::string>* passed_over) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (!fs::is_directory(dir)) return found;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string why;
    if (auto s = checkpoint_step(e.path(), &why)) found.emplace_back(*s, e.path().string());
    else if (!why.empty() && passed_over) passed_over->push_back(e.path().string() + ": " + why);
  }
  std::sort(found.rbegin(), found.rend());
  return found;
}

// Why the checkpoint at `path`, named for `step`, is not complete: empty when its header and
// metadata are sound and, for zero1, every rank's shard file is there. With `verify_data`, every
// tensor of the file and its shards is read and checked against its checksum too.
std::string incomplete_because(const std::string& path, int64_t step, bool verify_data) {
  try {
    if (verify_data) nn::safe_verify(path);
    nn::Metadata meta = nn::safe_metadata(path);
    TG_CHECK(meta.count("format") && meta.at("format") == CHECKPOINT_FORMAT, "it has no trainer metadata (not written by tg train)");
    int64_t saved = metadata_int(meta, "step", path);
    TG_CHECK(saved == step, "its metadata says step ", saved);
    for (const std::string strategy : {"zero1", "fsdp"}) {
      if (!meta.count(strategy + "_ranks")) continue;
      int64_t ranks = metadata_int(meta, strategy + "_ranks", path);
      for (int64_t r = 0; r < ranks; r++) {
        std::string shard = shard_path(path, static_cast<int>(r), strategy);
        TG_CHECK(fs::is_regular_file(shard), "the ", strategy == "zero1" ? "optimizer" : "fsdp", " shard of rank ", r, " of ", ranks,
                 " ('", shard, "') is missing");
        if (verify_data) nn::safe_verify(shard);
        else nn::safe_header(shard);
      }
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Note [keeping checkpoints]: with train.keep_checkpoints=N, once rank 0 has written a checkpoint
// (and, for zero1, every shard is on disk), the checkpoints before the N newest complete ones
// (as latest_checkpoint would take them, short of reading the data) are deleted, shards
// included, the main file first so that a checkpoint is never seen complete without its shards.
// Only checkpoints up to the one just written count: a resumed run that passed over a damaged
// newer checkpoint keeps its older good ones until it has written N of its own.
void delete_checkpoint(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  const std::string stem = path.filename().string().substr(0, path.filename().string().size() - std::string(".safetensors").size());
  for (const auto& e : fs::directory_iterator(path.parent_path(), ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(stem + ".zero1-rank", 0) == 0 || n.rfind(stem + ".fsdp-rank", 0) == 0) fs::remove(e.path(), ec);
  }
}

void prune_checkpoints(const fs::path& dir, int64_t newest_step, int64_t keep) {
  if (keep <= 0) return;
  int64_t kept = 0;
  for (const auto& [step, path] : checkpoint_files(dir, nullptr)) {
    if (step > newest_step) continue;
    if (kept >= keep) delete_checkpoint(path);
    else if (incomplete_because(path, step, /*verify_data=*/false).empty()) kept++;
  }
}

// A model's sizes that its dataset knows: model.vocab_size and model.block_size at 0 (where the
// model registered them) become the dataset's vocabulary and data.seq_len.
void fill_sizes_from_data(Config& c, const DataSplits& data) {
  if (find_field("model.vocab_size") && c.get_int("model.vocab_size") == 0) {
    TG_CHECK(data.num_classes > 0, "model.vocab_size is 0 (the dataset's) but dataset '", c.get_string("data.name"),
             "' does not say its vocabulary; set model.vocab_size");
    c.set("model.vocab_size", data.num_classes);
  }
  if (find_field("model.block_size") && find_field("data.seq_len") && c.get_int("model.block_size") == 0)
    c.set("model.block_size", c.get_int("data.seq_len"));
}

// Note [mfu]: model FLOPs utilisation is the FLOPs a step must do over what the device could do
// in its time: tokens/s times the FLOPs per token of a training step, over train.peak_tflops. A
// GPT's training FLOPs per token are 6 N (forward and backward through N weights, the position
// embedding excluded: it is a lookup) plus 12 L T D for the attention scores and their use
// (PaLM's appendix B, as nanoGPT and llm.c count them), T the sequence length.
double gpt_flops_per_token(const nn::GPT& m) {
  const auto& c = m.config;
  double n = static_cast<double>(m.num_parameters() - c.block_size * c.n_embd);
  return 6 * n + 12.0 * static_cast<double>(c.n_layer * c.block_size * c.n_embd);
}

}  // namespace

std::unique_ptr<nn::Optimizer> make_optimizer(const Config& c, std::vector<Tensor*> params, bool flat_shards) {
  const std::string& name = c.get_string("optim.name");
  double lr = c.get_float("optim.lr"), wd = c.get_float("optim.weight_decay");
  double b1 = c.get_float("optim.b1"), b2 = c.get_float("optim.b2"), eps = c.get_float("optim.eps");
  if (name == "sgd")
    return std::make_unique<nn::SGD>(std::move(params), lr, c.get_float("optim.momentum"), 0.0, wd,
                                     c.get_bool("optim.nesterov"));
  if (name == "adam") return std::make_unique<nn::Adam>(std::move(params), lr, b1, b2, eps, wd);
  if (name == "adamw" && flat_shards) return std::make_unique<nn::AdamW>(std::move(params), lr, b1, b2, eps, wd);
  if (name == "adamw") return std::make_unique<nn::AdamW>(nn::decay_matrices_only(params, wd), lr, b1, b2, eps);
  if (name == "lamb") return std::make_unique<nn::LAMB>(std::move(params), lr, b1, b2, eps, wd);
  throw Error("config: optim.name='" + name + "' is not one of sgd, adam, adamw, lamb");
}

std::unique_ptr<nn::LRSchedule> make_schedule(const Config& c, int64_t total_steps) {
  const std::string& name = c.get_string("schedule.name");
  double lr = c.get_float("optim.lr");
  int64_t warmup = c.get_int("schedule.warmup_steps");
  std::unique_ptr<nn::LRSchedule> s;
  if (name == "constant") {
    s = std::make_unique<nn::ConstantLR>(lr);
  } else if (name == "step") {
    s = std::make_unique<nn::StepLR>(lr, c.get_int("schedule.step_size"), c.get_float("schedule.gamma"));
  } else if (name == "cosine") {
    s = std::make_unique<nn::CosineLR>(lr, std::max<int64_t>(1, total_steps - warmup), c.get_float("schedule.min_lr"));
  } else {
    throw Error("config: schedule.name='" + name + "' is not one of constant, step, cosine");
  }
  if (warmup > 0) s = std::make_unique<nn::WarmupLR>(std::move(s), warmup);
  return s;
}

// Note [data parallel over devices]: train.devices lists devices of this process (or counts
// them on the default device's backend). The parameters are replicated over them once, and each
// (micro-)batch is sharded along dim 0 (an evaluation batch that does not split evenly is
// replicated): the multi-device rewrite (tinygrad/multi.h) then runs each device's share and
// all-reduces the gradients, so the optimizer updates equal replicas on every device. Such steps
// are captured by TinyJit like any other (Note [a state tensor over several devices] in
// tinygrad/engine/jit.h). It combines with ddp over ranks: each rank takes its rows of the global
// batch first, splits them over its own devices (Note [a rank's devices] in
// distributed/data_parallel.h: CUDA:<local rank * D + i>, the CPU's virtual devices on every
// rank), and the ddp buckets all-reduce the devices' summed gradients across the ranks from the
// first device (Note [gradients over a rank's devices]). zero1 and fsdp shard parameters or
// optimizer state over the ranks, one device each, and are refused with train.devices.
namespace {
// A count ("4") or a list ("[CPU:0, CPU:1]") of train.devices, without brackets and spaces.
std::string devices_spec(const Config& cfg) {
  std::string s;
  for (char c : cfg.get_string("train.devices"))
    if (c != ' ' && c != '[' && c != ']') s += c;
  return s;
}

bool is_count(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The backend of the run's device (train.device, else the default): "CUDA" for "CUDA:1".
std::string run_backend(const Config& cfg) {
  const std::string& device = cfg.get_string("train.device");
  std::string d = canonical_device(device.empty() ? default_device() : device);
  return d.substr(0, d.find(':'));
}

// n devices of the run's backend for this process: under a process group (`in_group`) the local
// rank's share of the node's GPUs (Note [a rank's devices] in distributed/data_parallel.h).
std::vector<std::string> process_devices(const Config& cfg, int64_t n, bool in_group) {
  const std::string backend = run_backend(cfg);
  return dist::rank_devices(backend, n, in_group ? dist::env_local_ranks() : dist::LocalRanks{}, device_count(backend));
}
}  // namespace

std::vector<std::string> tensor_parallel_devices(const Config& cfg, bool in_group) {
  const int64_t tp = cfg.get_int("model.tensor_parallel");
  if (tp < 2) return {};
  return process_devices(cfg, tp, in_group);
}

std::vector<std::string> train_devices(const Config& cfg, bool in_group) {
  const std::string spec = devices_spec(cfg);
  std::vector<std::string> out;
  if (is_count(spec)) {
    auto n = parse_count(spec);
    TG_CHECK(n && *n >= 1, "config: train.devices must be at least 1, got ", spec);
    if (*n == 1) return {};
    out = process_devices(cfg, *n, in_group);
  } else if (!spec.empty()) {
    for (auto& d : split_devices(spec)) out.push_back(canonical_device(d));  // a list is taken as given
  }
  if (out.size() < 2) return {};
  return out;
}

std::string group_device(const Config& cfg) {
  auto devices = train_devices(cfg, /*in_group=*/true);
  if (devices.empty()) devices = tensor_parallel_devices(cfg, /*in_group=*/true);
  if (!devices.empty()) return devices[0];
  const std::string& device = cfg.get_string("train.device");
  return dist::rank_device(device.empty() ? default_device() : device, dist::env_local_ranks(), device_count("CUDA"));
}

void Trainer::check_devices_fit() const {
  const std::string& strategy = cfg_.get_string("distributed.strategy");
  TG_CHECK(strategy != "zero1" && strategy != "fsdp", "config: distributed.strategy=", strategy, " with train.devices=",
           cfg_.get_string("train.devices"), " is not supported: ", strategy, " shards ",
           strategy == "zero1" ? "the optimizer state" : "the parameters", " over the ranks, one device each (use ",
           "distributed.strategy=ddp with train.devices, or ", strategy, " with one device per rank)");
  const auto n = static_cast<int64_t>(devices_.size());
  const int64_t batch = cfg_.get_int("data.batch_size"), accum = cfg_.get_int("train.grad_accum");
  const int64_t micro = batch / world_size() / accum;  // what each backward splits over the devices
  const std::string share = micro == batch ? "" : " (" + std::to_string(micro) + " examples per rank and micro-batch, over " +
                                                      std::to_string(world_size()) + " rank(s) and train.grad_accum=" +
                                                      std::to_string(accum) + ")";
  TG_CHECK(micro % n == 0, "config: data.batch_size ", batch, share, " does not split over the ", n, " devices of train.devices");
}

std::string Trainer::rank_devices() const {
  const auto& list = !devices_.empty() ? devices_ : tp_devices_;
  return list.empty() ? default_device() : join_devices(list);
}

// Note [tensor parallel over devices]: model.tensor_parallel=N splits the model's layers over N
// devices of the default device's backend (Note [tensor parallel] in tinygrad/nn/module.cpp)
// once it is built, before the optimizer, whose state then follows each parameter's layout. Each
// step replicates its batch over them. Like train.devices, such steps are captured by TinyJit.
// Under ddp (tensor x data parallel, as Megatron's) each rank splits its model over N devices of
// its own (the CPU's virtual devices, or its local rank's N GPUs: Note [a rank's devices] in
// distributed/data_parallel.h), replicates its rows of the global batch over them, and the
// gradients are averaged across the ranks part by part, staying split (Note [split gradients
// across the ranks] in distributed/data_parallel.cpp). zero1 and fsdp, which shard over the
// ranks one device each, and train.devices (a two-dimensional mesh within a process) are refused.
Tensor Trainer::place_batch(const Tensor& t) const {
  if (tp_devices_.size() > 1) return t.to(tp_devices_);
  if (devices_.size() < 2) return t;
  bool even = t.ndim() > 0 && t.shape(0) % static_cast<int64_t>(devices_.size()) == 0;
  return even ? t.shard(devices_, 0) : t.to(devices_);
}

Trainer::Trainer(const Config& cfg, std::string run_dir, dist::ProcessGroup* group)
    : cfg_(cfg), run_dir_(std::move(run_dir)), group_(group) {
  TG_CHECK(!group_ || cfg_.get_string("distributed.strategy") != "none", "trainer: a process group was given but distributed.strategy='",
           cfg_.get_string("distributed.strategy"), "'");
  TG_CHECK(group_ || cfg_.get_string("distributed.strategy") == "none", "trainer: distributed.strategy='",
           cfg_.get_string("distributed.strategy"), "' needs a process group");
  std::string device = cfg_.get_string("train.device");
  if (group_) device = group_device(cfg_);  // Note [a rank's device] in distributed/process_group.h
  if (!device.empty()) {
    // The engine's tensors go to the default device, so train.device sets it (the DEVICE knob) for
    // the whole process. An unknown or unavailable device fails here, naming it.
    get_device(device);
    knobs::DEVICE.set(canonical_device(device));
  }
  data_ = make_dataset(cfg_);
  const int64_t n_train = data_.train ? data_.train->size() : 0, n_test = data_.test ? data_.test->size() : 0;
  TG_CHECK(n_train > 0 && n_test > 0, "dataset '", cfg_.get_string("data.name"), "' has an empty split (train ",
           n_train, ", test ", n_test, " examples)");
  train_loader_ = std::make_unique<nn::DataLoader>(
      data_.train, nn::DataLoaderOptions{.batch_size = cfg_.get_int("data.batch_size"),
                                         .shuffle = cfg_.get_bool("data.shuffle"),
                                         .seed = static_cast<uint64_t>(cfg_.get_int("data.seed"))});
  test_loader_ = std::make_unique<nn::DataLoader>(
      data_.test, nn::DataLoaderOptions{.batch_size = cfg_.get_int("data.eval_batch_size"), .shuffle = false});
  int64_t steps = cfg_.get_int("train.steps");
  total_steps_ = steps > 0 ? steps : cfg_.get_int("train.epochs") * train_loader_->batches_per_epoch();
  const int64_t accum = cfg_.get_int("train.grad_accum"), per_rank = cfg_.get_int("data.batch_size") / world_size();
  TG_CHECK(per_rank % accum == 0, "config: each rank's batch (data.batch_size ", cfg_.get_int("data.batch_size"), " over ",
           world_size(), " ranks: ", per_rank, ") does not split into train.grad_accum=", accum, " micro-batches");
  devices_ = train_devices(cfg_, group_ != nullptr);
  if (const int64_t tp = cfg_.get_int("model.tensor_parallel"); tp > 1) {  // Note [tensor parallel over devices]
    TG_CHECK(devices_.size() < 2, "config: model.tensor_parallel=", tp, " with train.devices='",
             cfg_.get_string("train.devices"), "' is not supported yet (use one of them)");
    const std::string& strategy = cfg_.get_string("distributed.strategy");
    TG_CHECK(strategy != "zero1" && strategy != "fsdp", "config: model.tensor_parallel=", tp,
             " with distributed.strategy=", strategy, " is not supported: ", strategy, " shards ",
             strategy == "zero1" ? "the optimizer state" : "the parameters", " over the ranks, one device each (use ",
             "distributed.strategy=ddp with model.tensor_parallel, or ", strategy, " without it)");
    tp_devices_ = tensor_parallel_devices(cfg_, group_ != nullptr);
  }
  if (!devices_.empty()) check_devices_fit();  // Note [data parallel over devices]
  fill_sizes_from_data(cfg_, data_);
  Tensor::manual_seed(static_cast<uint64_t>(cfg_.get_int("train.seed")));
  model_ = make_model(cfg_);
  TG_CHECK(model_, "model '", cfg_.get_string("model.name"), "': the factory returned no model");
  if (auto* gpt = dynamic_cast<nn::GPT*>(model_.get())) flops_per_token_ = gpt_flops_per_token(*gpt);
  // train.precision=bf16: Note [compute dtype] in tinygrad/nn/layers.h (training and evaluation)
  if (cfg_.get_string("train.precision") == "bf16") model_->set_compute_dtype(DType::BFloat16);
  if (!devices_.empty())
    for (Tensor* p : model_->parameters()) p->shard_(devices_);  // Note [data parallel over devices]
  model_->tensor_parallel(tp_devices_);  // Note [tensor parallel over devices]
  const bool zero1 = cfg_.get_string("distributed.strategy") == "zero1";
  const bool fsdp = cfg_.get_string("distributed.strategy") == "fsdp";
  if (!zero1 && !fsdp) optim_ = make_optimizer(cfg_, model_->parameters());
  schedule_ = make_schedule(cfg_, total_steps_);
  jit_ = std::make_unique<TinyJit>([this](const Tensors& batch) { return train_step(batch); }, "train_step");
  if (group_) {
    group_->set_timeout(dist::Seconds(cfg_.get_float("distributed.timeout_s")));
    set_host_wait_limit(cfg_.get_float("distributed.timeout_s"));  // Note [host waits with a deadline]
    check_ranks_agree(*group_, "model", model_agreement_text(*model_));  // before the parameters are broadcast
    dist::shard_range(cfg_.get_int("data.batch_size"), group_->rank(), group_->size());  // checks divisibility
    engine_ = std::make_unique<dist::CollectiveEngine>(*group_);
    const DType grad_dtype = cfg_.get_string("distributed.grad_dtype") == "bf16" ? DType::BFloat16 : DType::Float32;
    dp_ = std::make_unique<dist::DataParallel>(
        *group_, model_->parameters(),
        dist::DataParallelOptions{.bucket_mb = cfg_.get_float("distributed.bucket_mb"), .grad_dtype = grad_dtype});
    dp_->broadcast_parameters(0);
    if (zero1)
      zero_ = std::make_unique<dist::Zero1>(
          *group_, model_->parameters(),
          [this](std::vector<Tensor*> ps) { return make_optimizer(cfg_, std::move(ps), /*flat_shards=*/true); },
          grad_dtype);
    if (fsdp)  // the shards keep their parameters' ranks, so adamw still decays matrices only
      fsdp_ = std::make_unique<dist::Fsdp>(
          *group_, *model_, [this](std::vector<Tensor*> ps) { return make_optimizer(cfg_, std::move(ps)); },
          dist::FsdpOptions{.grad_dtype = grad_dtype, .gathers = dist::fsdp_gathers(cfg_.get_string("distributed.fsdp_gathers"))});
  }
}

// Note [the trainer's step under TinyJit]: the whole step (forward, backward, gradient
// collectives, optimizer update) is one function of the batch, wrapped in a TinyJit, so from the
// third step on its kernels and collectives are replayed. The loss is realized in the update's
// schedule and returned, so reading it at a log step costs no kernel. Gradient clipping in one
// process is built on the device (clip_grad_norm_lazy). A ddp, zero1 or fsdp step with clipping
// or distributed.skip_nonfinite decides on the device too (coordinated_step_lazy,
// Zero1::step_lazy, Fsdp::step_lazy): it returns the 0-d ok flag and the global norm as outputs
// after the loss, and the optimizer counts a skipped step on the device (Note [a step skipped on
// the device] in nn/optim.h), so nothing is read between steps.
//
// Note [skipped steps are read at log steps]: reading a step's ok flag right after it waits for
// the device, so the host could not queue step n+1 while step n runs (on an H100 the ddp step
// cost 1.09x the plain one, zero1's 1.20x, with the read after every step). So the skipped
// steps are read and taken back (settle_skips: Optimizer::settle, one 0-d read) only where the
// host waits anyway and every rank passes alike: at log steps (with the loss), before an
// evaluation and at the last step. Alike matters: until the count is settled the bias
// corrections come from the device's float32 formula, after it from the host (Note [bias
// corrections after a skip] in nn/optim.h), and the two differ in the last bits, so ranks that
// settled at different steps would drift apart. A checkpoint (under ddp rank 0's alone) does
// not settle: its step count is read through Optimizer::state_dict, which subtracts the
// unsettled skips. An event reports how many steps of the window since the previous read were
// skipped (SkipEvent); which ones, the count does not say. The ok flag is still an output: at
// a log step it tells whether that step skipped, which allows its non-finite loss.
//
// Note [the next batch while a step runs]: a device runs the step's kernels after the call
// returns, and a host read (the loss at a log step) waits for them. The next batch is taken from
// the loader before that read, so the host's share of the next step (shuffling, collating, the
// trace span) overlaps the device's work instead of following it. The loader runs one batch
// ahead within an epoch and never past the last step; nothing else moves: the step is logged
// and checkpointed before the next one starts, as before.
//
// Note [the gradient norm of every run]: every other step returns the global gradient norm
// (before clipping) as its second output, so that every run's train records (metrics.jsonl, the
// TensorBoard scalar train/grad_norm, metrics.csv) carry grad_norm the same way: one process
// builds it lazily (nn::grad_norm_lazy, or clip_grad_norm_lazy's when clipping), a ddp step
// without checks takes the norm of the all-reduced gradients (StepOptions::report_norm), a zero1
// step all-reduces its shard's sum of squares. It is read only at a log step, with the loss.
Tensors Trainer::train_step(const Tensors& batch) {
  Tensor x = batch[0], y = batch[1];
  if (dp_) {  // this rank's rows, before they are split over its devices (accumulated_backward)
    x = dist::shard_batch(x, rank(), world_size());
    y = dist::shard_batch(y, rank(), world_size());
  }
  if (tp_devices_.size() > 1) x = place_batch(x), y = place_batch(y);
  if (fsdp_) fsdp_->unshard();  // Note [an fsdp step on the graph] in distributed/fsdp.cpp
  for (Tensor* p : model_->parameters()) p->zero_grad();
  Tensor loss = accumulated_backward(x, y);
  const double clip = cfg_.get_float("optim.clip_grad_norm");
  if (dp_) {
    dist::StepOptions so{.max_norm = clip, .skip_nonfinite = cfg_.get_bool("distributed.skip_nonfinite"), .report_norm = true};
    dist::LazyStepOutcome lazy;
    if (zero_) {
      lazy = zero_->step_lazy({loss}, so);
    } else if (fsdp_) {
      lazy = fsdp_->step_lazy({loss}, so);
    } else {
      Tensors first = dp_->reduce_gradients();
      so.grad_norm = dp_->grad_norm_lazy(first);  // Note [the norm from the buckets] in distributed/data_parallel.cpp
      first.push_back(loss);
      lazy = dist::coordinated_step_lazy(*optim_, first, so);
    }
    if (lazy.ok) return {loss, *lazy.ok, *lazy.grad_norm};  // Note [skipped steps are read at log steps]
    return {loss, *lazy.grad_norm};
  }
  // on the device: replayable
  Tensor norm = clip > 0 ? nn::clip_grad_norm_lazy(optim_->params(), clip) : nn::grad_norm_lazy(optim_->params());
  optim_->step({loss, norm});
  return {loss, norm};
}

// Note [training tasks]: the dataset says what its examples are for (DataSplits::task). A
// classifier's x gives logits [B, C] against labels y [B]: the loss is their cross entropy, the
// evaluation the accuracy on the test split. A next-token task's x is T tokens and y the same
// shifted by one: the model's logits [B, T, V] are scored at every position (cross entropy over
// the B*T tokens), and the evaluation is that mean loss on the validation split (perplexity:
// its exp), as nanoGPT and llm.c report it.
Tensor Trainer::loss_of(const Tensor& x, const Tensor& y) {
  Tensor out = (*model_)(x);
  if (data_.task == Task::Classify) return out.sparse_categorical_crossentropy(y);
  TG_CHECK(out.ndim() == 3 && y.ndim() == 2, "train: a next-token task needs logits [B, T, V] for targets [B, T]; model '",
           cfg_.get_string("model.name"), "' gave ", out.describe(), " for ", y.describe());
  return out.reshape({-1, out.shape(2)}).sparse_categorical_crossentropy(y.reshape({y.numel()}));
}

// Note [gradient accumulation]: with train.grad_accum = k, a rank's batch is split into k
// micro-batches whose losses (each over 1/k of the examples, so divided by k) go backward one
// after the other; each micro-batch's gradients are realized before the next starts, so only
// one micro-batch's activations are alive at a time, and the summed gradients equal those of the
// whole batch's mean loss. The returned loss is the batch's mean. With train.devices each
// micro-batch is split over the devices (Note [data parallel over devices]): cut from a batch
// already split, it would be gathered whole onto every device first.
Tensor Trainer::accumulated_backward(const Tensor& x, const Tensor& y) {
  const int64_t k = cfg_.get_int("train.grad_accum");
  auto spread = [&](const Tensor& t) { return devices_.empty() ? t : place_batch(t); };
  if (k == 1) {
    Tensor loss = loss_of(spread(x), spread(y));
    loss.backward();
    return loss;
  }
  Tensors xs = x.chunk(k, 0), ys = y.chunk(k, 0);
  std::optional<Tensor> total;
  for (int64_t i = 0; i < k; i++) {
    Tensor part = loss_of(spread(xs[static_cast<size_t>(i)]), spread(ys[static_cast<size_t>(i)])) / static_cast<double>(k);
    part.backward();
    Tensors now{part};
    for (Tensor* p : model_->parameters())
      if (auto g = p->grad()) now.push_back(*g);
    Tensor::realize_all(now);
    total = total ? *total + part : part;
  }
  return *total;
}

EvalResult Trainer::evaluate() {
  NoGradGuard no_grad;
  model_->train(false);
  const int64_t limit = cfg_.get_int("train.eval_batches");
  double correct = 0, loss_sum = 0;
  int64_t seen = 0, batches = 0;
  test_loader_->start_epoch(0);
  while (auto b = test_loader_->next()) {
    if (limit > 0 && batches++ >= limit) break;
    if (data_.task == Task::Classify) {
      correct += static_cast<double>((*model_)(place_batch(b->x)).argmax(-1).eq(place_batch(b->y)).sum().item<int64_t>());
    } else {
      loss_sum += loss_of(place_batch(b->x), place_batch(b->y)).item<float>() * static_cast<double>(b->y.shape(0));
    }
    seen += b->y.shape(0);
  }
  model_->train(true);
  TG_CHECK(seen > 0, "evaluate: the test split of '", cfg_.get_string("data.name"), "' is empty");
  if (data_.task == Task::Classify) return {correct / static_cast<double>(seen), std::nullopt};
  return {std::nullopt, loss_sum / static_cast<double>(seen)};
}

// Note [epoch numbers]: every output that names an epoch (progress lines, train.log,
// metrics.jsonl, TensorBoard, metrics.csv, checkpoint metadata) names the epoch of the last step
// done, counting from 1: with 6 batches an epoch, steps 1..6 are epoch 1 and step 7 is epoch 2,
// and a checkpoint, evaluation or record after step 6 says epoch 1. Where training resumes is
// the step alone (the loader seeks to epoch step / bpe, batch step % bpe, counting from 0).
TrainSummary Trainer::fit() {
  auto t_fit = std::chrono::steady_clock::now();
  const int64_t bpe = batches_per_epoch();
  const int64_t log_every = cfg_.get_int("train.log_every"), eval_every = cfg_.get_int("train.eval_every");
  const bool skip_nonfinite = cfg_.get_bool("distributed.skip_nonfinite");
  emit([&](TrainObserver& o) { o.on_train_begin(*this); });

  auto run_eval = [&]() {
    trace::Span span("eval", "evaluate");
    auto t0 = std::chrono::steady_clock::now();
    last_eval_ = evaluate();
    last_eval_step_ = step_;
    EvalEvent ev{step_, epoch_of(step_), last_eval_, seconds_since(t0)};
    emit([&](TrainObserver& o) { o.on_eval(*this, ev); });
  };

  // Rank 0 evaluates for everyone; every rank decides alike, since fsdp's gathers need them all
  // (Note [fsdp placeholders] in distributed/fsdp.cpp).
  auto eval_on_rank0 = [&]() {
    if (last_eval_step_ == step_) return;
    settle_skips();
    if (fsdp_) fsdp_->materialize();
    if (rank() == 0) run_eval();
    last_eval_step_ = step_;
    if (fsdp_) fsdp_->release();
  };

  auto next_batch = [&]() {
    trace::Span span("data", "next batch");
    return train_loader_->next();
  };

  auto t_window = std::chrono::steady_clock::now();
  int64_t window_examples = 0;
  settled_step_ = step_;
  while (step_ < total_steps_) {
    int64_t epoch = step_ / bpe;
    train_loader_->seek({epoch, step_ % bpe});  // a resumed run skips the batches it has seen
    auto b = next_batch();
    while (step_ < total_steps_ && b) {
      double lr = schedule_->lr_at(step_);
      optimizer().lr = lr;
      Tensors outs;
      decltype(b) next;
      {
        trace::Span span("step", "train step");
        span.arg("step", static_cast<double>(step_ + 1));
        outs = (*jit_)({b->x, b->y});
        if (step_ + 1 < total_steps_) next = next_batch();  // Note [the next batch while a step runs]
      }
      Tensor loss = outs[0];
      step_++;
      window_examples += b->y.shape(0);
      bool last = step_ == total_steps_;
      if (step_ % log_every == 0 || last) {
        double loss_v = loss.item<float>();
        settle_skips();  // Note [skipped steps are read at log steps]
        const bool skipped = outs.size() == 3 && outs[1].item<int32_t>() == 0;  // this step's ok flag
        if (group_) dist::all_reduce_host(*group_, &loss_v, 1, DType::Float64, dist::ReduceOp::Avg);  // the global batch's loss
        TG_CHECK(std::isfinite(loss_v) || (skipped && skip_nonfinite), "train: the loss is ", loss_v, " at step ", step_,
                 " (try a smaller optim.lr or optim.clip_grad_norm)");
        double dt = seconds_since(t_window);
        double examples_per_s = dt > 0 ? static_cast<double>(window_examples) / dt : 0.0;
        StepEvent ev{step_, total_steps_, epoch_of(step_), b->index, bpe, loss_v, lr, examples_per_s};
        ev.grad_norm = outs.back().item<double>();
        if (data_.task == Task::NextToken) {
          ev.tokens_per_s = examples_per_s * static_cast<double>(b->y.shape(1));
          double peak = cfg_.get_float("train.peak_tflops");
          if (flops_per_token_ && peak > 0) ev.mfu = *flops_per_token_ * ev.tokens_per_s / (peak * 1e12);  // Note [mfu]
        }
        emit([&](TrainObserver& o) { o.on_step_end(*this, ev); });
        t_window = std::chrono::steady_clock::now();
        window_examples = 0;
      }
      bool epoch_end = b->index == bpe - 1;
      if ((eval_every > 0 && step_ % eval_every == 0) || (eval_every == 0 && epoch_end) || last) {
        eval_on_rank0();
        t_window = std::chrono::steady_clock::now();  // evaluation time is not training throughput
        window_examples = 0;
      }
      emit([&](TrainObserver& o) { o.on_step(*this, step_); });  // after the step's records (checkpoints)
      b = std::move(next);
    }
  }
  if (step_ > 0) eval_on_rank0();
  TrainSummary sum{step_, skipped_, last_eval_.accuracy, last_eval_.loss, seconds_since(t_fit), run_dir_, last_checkpoint_};
  emit([&](TrainObserver& o) { o.on_train_end(*this, sum); });
  sum.last_checkpoint = last_checkpoint_;  // an observer may have written the final checkpoint
  return sum;
}

void Trainer::settle_skips() {
  if (settled_step_ == step_) return;
  const int64_t skipped = optimizer().settle();
  if (skipped > 0) {
    skipped_ += skipped;
    SkipEvent ev{settled_step_ + 1, step_, skipped};
    emit([&](TrainObserver& o) { o.on_step_skipped(*this, ev); });
  }
  settled_step_ = step_;
}

std::string Trainer::save_checkpoint() {
  trace::Span span("checkpoint", "checkpoint");
  fs::path dir = fs::path(run_dir_) / "checkpoints";
  fs::create_directories(dir);
  nn::StateDict sd;
  std::set<std::string> sharded;  // fsdp: the parameters are in the ranks' files
  if (fsdp_)
    for (const auto& p : fsdp_->params()) sharded.insert(p.name);
  for (auto& [k, v] : model_->state_dict())
    if (!sharded.count(k)) sd.emplace("model." + k, v);
  if (optim_)
    for (auto& [k, v] : optim_->state_dict()) sd.emplace("optim." + k, v);
  nn::Metadata meta{{"format", CHECKPOINT_FORMAT},
                    {"step", std::to_string(step_)},
                    {"epoch", std::to_string(epoch())},  // Note [epoch numbers]
                    {"batches_done_in_epoch", std::to_string(step_ - (epoch() - 1) * batches_per_epoch())},
                    {"batch_size", std::to_string(cfg_.get_int("data.batch_size"))},
                    {"model", cfg_.get_string("model.name")},
                    {"optimizer", optimizer().type_name()}};
  std::string path = (dir / ("step_" + std::to_string(step_) + ".safetensors")).string();
  if (zero_) {  // Note [zero1 checkpoints] in distributed/zero.cpp
    std::vector<std::string> names;
    for (auto& [name, p] : model_->named_parameters()) names.push_back(name);
    meta.merge(zero_->layout_metadata(names));
    nn::StateDict shard;
    for (auto& [k, v] : zero_->shard_optimizer().state_dict()) shard.emplace("optim." + k, v);
    nn::safe_save(shard, shard_path(path, rank()), {{"format", CHECKPOINT_FORMAT}, {"step", std::to_string(step_)}});
    group_->barrier()->wait();  // every shard is on disk before the main file names the step complete
  }
  if (fsdp_) {  // Note [fsdp checkpoints] in distributed/fsdp.cpp
    meta.merge(fsdp_->layout_metadata());
    nn::safe_save(fsdp_->shard_state_dict(), shard_path(path, rank(), "fsdp"),
                  {{"format", CHECKPOINT_FORMAT}, {"step", std::to_string(step_)}});
    group_->barrier()->wait();
  }
  if (rank() == 0) {
    nn::safe_save(sd, path, meta);
    prune_checkpoints(dir, step_, cfg_.get_int("train.keep_checkpoints"));  // Note [keeping checkpoints]
  }
  last_checkpoint_ = path;
  CheckpointEvent ev{step_, epoch(), path};
  emit([&](TrainObserver& o) { o.on_checkpoint(*this, ev); });
  return path;
}

void Trainer::load_checkpoint(const std::string& path) {
  nn::Metadata meta = nn::safe_metadata(path);
  TG_CHECK(meta.count("format") && meta.at("format") == CHECKPOINT_FORMAT && meta.count("step"), "checkpoint '", path,
           "' has no trainer metadata (not written by tg train)");
  int64_t saved_bs = meta.count("batch_size") ? metadata_int(meta, "batch_size", path) : 0;
  TG_CHECK(saved_bs == cfg_.get_int("data.batch_size"), "checkpoint '", path, "' was written with data.batch_size=",
           saved_bs, ", the config has ", cfg_.get_int("data.batch_size"), " (a resumed run must keep it)");
  const int64_t saved_step = metadata_int(meta, "step", path);
  TG_CHECK(saved_step <= total_steps_, "checkpoint '", path, "' is at step ", saved_step, ", beyond this run's total of ",
           total_steps_, " steps (raise train.steps or train.epochs)");
  TG_CHECK(!meta.count("optimizer") || meta.at("optimizer") == optimizer().type_name(), "checkpoint '", path,
           "' holds the state of optimizer ", meta.at("optimizer"), ", this run's is ", optimizer().type_name(),
           " (optim.name must stay)");
  std::vector<dist::ParamLayout> params;
  for (auto& [name, p] : model_->named_parameters()) params.push_back({name, p->shape()});
  std::set<std::string> buffers;
  for (auto& [name, b] : model_->named_buffers()) buffers.insert(name);
  RankShare share{.layout = fsdp_ ? RankShare::Layout::Fsdp : zero_ ? RankShare::Layout::Zero1 : RankShare::Layout::Whole,
                  .group = group_};
  FullCheckpoint full = read_full_checkpoint(path, meta, params, buffers, share);  // Note [checkpoints that reshard]
  model_->load_state_dict(full.model);
  if (fsdp_) {
    fsdp_->reload_parameters();
    fsdp_->load_full_optimizer_state(full.optim);
  } else if (zero_) {
    zero_->reload_parameters();
    zero_->load_full_optimizer_state(full.optim);
  } else {
    optim_->load_state_dict(full.optim);
  }
  step_ = saved_step;
  last_checkpoint_ = path;
  last_eval_step_ = step_;  // do not evaluate again right away
  settled_step_ = step_;    // the loaded step count is settled
}

void Trainer::load_weights(const std::string& path) {
  TG_CHECK(fs::exists(path), "train.init_weights: no file '", path, "'");
  nn::StateDict all = nn::safe_load(path), sd;
  bool prefixed = std::any_of(all.begin(), all.end(), [](const auto& kv) { return kv.first.rfind("model.", 0) == 0; });
  for (auto& [k, v] : all) {
    if (!prefixed) sd.emplace(k, v);
    else if (k.rfind("model.", 0) == 0) sd.emplace(k.substr(6), v);
  }
  model_->load_state_dict(sd);
  if (zero_) zero_->reload_parameters();
  if (fsdp_) fsdp_->reload_parameters();
}

std::string latest_checkpoint(const std::string& run_dir, std::vector<std::string>* passed_over, bool verify_data) {
  for (const auto& [step, path] : checkpoint_files(fs::path(run_dir) / "checkpoints", passed_over)) {
    std::string why = incomplete_because(path, step, verify_data);
    if (why.empty()) return path;
    if (passed_over) passed_over->push_back(path + ": " + why);
  }
  return "";
}

}  // namespace tg::launcher
