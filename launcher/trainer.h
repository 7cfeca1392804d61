// The training loop of `tg train`: builds model, data, optimizer and schedule from a Config,
// runs steps, evaluates, and emits events (step end, eval, checkpoint written, begin/end) to
// observers. Observers print progress, write metrics.jsonl and train.log, and write checkpoints;
// the trainer itself never prints. Checkpoints hold the model state ("model." prefix), the
// optimizer state ("optim." prefix) and the trainer state (step, epoch) in the metadata.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/config.h"
#include "distributed/collective_runner.h"
#include "distributed/data_parallel.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "launcher/registry.h"
#include "tinygrad/engine/jit.h"
#include "tinygrad/nn/data.h"
#include "tinygrad/nn/module.h"
#include "tinygrad/nn/optim.h"
#include "tinygrad/nn/schedule.h"

namespace tg::launcher {

struct StepEvent {
  int64_t step = 0;         // steps done, 1-based (this one included)
  int64_t total_steps = 0;
  int64_t epoch = 0;        // the epoch of this step's batch, 1-based (Note [epoch numbers] in trainer.cpp)
  int64_t batch = 0;        // this batch's index in its epoch, 0-based
  int64_t batches_per_epoch = 0;
  double loss = 0;          // this step's training loss
  double lr = 0;            // the learning rate this step used
  double examples_per_s = 0;  // since the previous step event
  double tokens_per_s = 0;    // next-token tasks: examples/s times the sequence length
  std::optional<double> mfu;  // model FLOPs utilisation, where the model and train.peak_tflops say (Note [mfu])
  std::optional<double> grad_norm;  // the global gradient norm before clipping (Note [the gradient norm of every run])
};

// What an evaluation measured (Note [training tasks] in trainer.cpp).
struct EvalResult {
  std::optional<double> accuracy;  // classification: on the test split
  std::optional<double> loss;      // next token: mean cross entropy per token on the validation split
};

struct EvalEvent {
  int64_t step = 0, epoch = 0;
  EvalResult result;
  double seconds = 0;  // the evaluation's wall time
};

struct CheckpointEvent {
  int64_t step = 0, epoch = 0;
  std::string path;
};

// Steps whose update every rank skipped (non-finite gradients): the device counts them, and the
// trainer reads the count at the next log step or evaluation (Note [skipped steps are read at
// log steps] in trainer.cpp), so an event names the steps read together.
struct SkipEvent {
  int64_t first_step = 0, last_step = 0;  // the steps read together (1-based, both included)
  int64_t skipped = 0;                    // how many of them were skipped (at least 1)
};

struct TrainSummary {
  int64_t steps = 0;              // the step count at the end
  int64_t skipped_steps = 0;      // steps whose update every rank skipped (non-finite gradients)
  std::optional<double> accuracy; // the last evaluation (classification)
  std::optional<double> val_loss; // the last evaluation (next token)
  double seconds = 0;             // wall time of fit()
  std::string run_dir, last_checkpoint;
};

class Trainer;

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_train_begin(Trainer&) {}
  // Every step, after the optimizer update (the loss is not read).
  virtual void on_step(Trainer&, int64_t /*step*/) {}
  // Every train.log_every steps and at the last step (the loss is read from the device then).
  virtual void on_step_end(Trainer&, const StepEvent&) {}
  // distributed.strategy=ddp, zero1, fsdp: a non-finite gradient on some rank made every rank
  // skip e.skipped of the updates of steps e.first_step..e.last_step (reported at the last one).
  virtual void on_step_skipped(Trainer&, const SkipEvent&) {}
  virtual void on_eval(Trainer&, const EvalEvent&) {}
  virtual void on_checkpoint(Trainer&, const CheckpointEvent&) {}
  virtual void on_train_end(Trainer&, const TrainSummary&) {}
};

class Trainer {
 public:
  // Builds everything from the config (the model with Tensor::manual_seed(train.seed)). The run
  // directory must exist; checkpoints go to run_dir/checkpoints. With distributed.strategy=ddp,
  // `group` holds the ranks: each trains on its shard of every global batch (data.batch_size
  // examples), starting from rank 0's parameters.
  Trainer(const Config& cfg, std::string run_dir, dist::ProcessGroup* group = nullptr);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_observer(std::shared_ptr<TrainObserver> obs) { observers_.push_back(std::move(obs)); }
  // Trains from the current step to total_steps(), evaluating every train.eval_every steps (or at
  // each epoch end when 0) and at the end.
  TrainSummary fit();
  // Accuracy on the test split, or the validation loss of a next-token task (model in eval mode
  // meanwhile; at most train.eval_batches batches, 0: all).
  EvalResult evaluate();

  // Writes run_dir/checkpoints/step_<N>.safetensors (atomically) and emits on_checkpoint; under
  // zero1 and fsdp every rank calls this. With zero1 every rank r also writes its optimizer block
  // to step_<N>.zero1-rank<r>.safetensors, and the main file holds the model and the layout (Note
  // [zero1 checkpoints]); with fsdp its parameter shards and their optimizer state to
  // step_<N>.fsdp-rank<r>.safetensors, and the main file holds the layout and the model's buffers
  // (Note [fsdp checkpoints]).
  std::string save_checkpoint();
  // Restores model, optimizer and step from a checkpoint written by save_checkpoint under any
  // strategy, world size and device count (Note [checkpoints that reshard] in checkpoint.cpp),
  // reading only what this rank keeps (Note [reading what a rank needs]); a checkpoint of another
  // batch size, optimizer or model is an error naming the difference, and a damaged tensor one
  // naming the file. Under a strategy of ranks every rank calls it together.
  void load_checkpoint(const std::string& path);
  // Loads model weights only (keys with or without the "model." prefix), e.g. train.init_weights.
  void load_weights(const std::string& path);

  int64_t step() const { return step_; }
  // The epoch of the last step done, 1-based (0 before the first step): the number every output
  // names (Note [epoch numbers] in trainer.cpp).
  int64_t epoch() const { return epoch_of(step_); }
  int64_t epoch_of(int64_t step) const { return step == 0 ? 0 : (step - 1) / batches_per_epoch() + 1; }
  int64_t total_steps() const { return total_steps_; }
  int64_t batches_per_epoch() const { return train_loader_->batches_per_epoch(); }
  const Config& config() const { return cfg_; }
  const std::string& run_dir() const { return run_dir_; }
  nn::Module& model() { return *model_; }
  // zero1: the optimizer of this rank's block of the flat parameters (see distributed/zero.h)
  // fsdp: the optimizer of this rank's shards (see distributed/fsdp.h)
  nn::Optimizer& optimizer() { return zero_ ? zero_->shard_optimizer() : fsdp_ ? fsdp_->shard_optimizer() : *optim_; }
  const nn::LRSchedule& schedule() const { return *schedule_; }
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  int rank() const { return group_ ? group_->rank() : 0; }
  int world_size() const { return group_ ? group_->size() : 1; }
  // The devices this rank trains on, comma-separated ("CPU:0,CPU:1" under train.devices=2 or
  // model.tensor_parallel=2; the default device alone otherwise), as run.json records them.
  std::string rank_devices() const;
  dist::DataParallel* data_parallel() { return dp_.get(); }
  // The step's JIT (see Note [the trainer's step under TinyJit] in trainer.cpp).
  const TinyJit& jit() const { return *jit_; }

 private:
  // One training step on a batch {x, y}; returns {loss, grad_norm}, or {loss, ok, grad_norm} for
  // a ddp step that checks or clips (settled by fit() after the step). Run through jit_.
  Tensors train_step(const Tensors& batch);
  // The task's loss of the model on x against y (Note [training tasks]).
  Tensor loss_of(const Tensor& x, const Tensor& y);
  // Backward through the batch's loss in train.grad_accum micro-batches; returns the loss
  // (Note [gradient accumulation]).
  Tensor accumulated_backward(const Tensor& x, const Tensor& y);

  template <class F>
  void emit(F f) {
    for (auto& o : observers_) f(*o);
  }

  Config cfg_;
  std::string run_dir_;
  DataSplits data_;
  std::unique_ptr<nn::DataLoader> train_loader_, test_loader_;
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<nn::Optimizer> optim_;
  std::unique_ptr<nn::LRSchedule> schedule_;
  std::vector<std::shared_ptr<TrainObserver>> observers_;
  dist::ProcessGroup* group_ = nullptr;
  std::unique_ptr<dist::CollectiveEngine> engine_;
  std::unique_ptr<dist::DataParallel> dp_;
  std::unique_ptr<dist::Zero1> zero_;
  std::unique_ptr<dist::Fsdp> fsdp_;
  std::unique_ptr<TinyJit> jit_;
  // train.devices (Note [data parallel over devices] in trainer.cpp); empty: one device.
  std::vector<std::string> devices_;
  // model.tensor_parallel (Note [tensor parallel over devices] in trainer.cpp); empty: none.
  std::vector<std::string> tp_devices_;
  Tensor place_batch(const Tensor& t) const;
  void check_devices_fit() const;  // the strategy and the batch suit train.devices, or an error says why
  // Reads the optimizer's count of the steps skipped since the last read and reports them
  // (Note [skipped steps are read at log steps] in trainer.cpp).
  void settle_skips();
  int64_t step_ = 0, total_steps_ = 0, skipped_ = 0;
  int64_t settled_step_ = 0;  // the skipped steps up to this one are counted in skipped_
  EvalResult last_eval_;
  std::optional<double> flops_per_token_;  // Note [mfu]
  int64_t last_eval_step_ = -1;
  std::string last_checkpoint_;
};

// The newest complete checkpoint in run_dir/checkpoints (a step_<N>.safetensors with trainer
// metadata whose tensors all match their checksums and, for zero1 and fsdp, every rank's shard file, as
// sound); empty when none. Leftover .tmp files are ignored; damaged or incomplete checkpoints
// and names that are no valid step are passed over, each noted in `passed_over` as
// "<path>: <why>". Without `verify_data` only the files' headers are checked (sizes included,
// so a truncated file is still passed over), not their tensors' checksums: a resume verifies
// what it reads as it reads it (Note [reading what a rank needs] in checkpoint.cpp).
std::string latest_checkpoint(const std::string& run_dir, std::vector<std::string>* passed_over = nullptr,
                              bool verify_data = true);

// Builders from the config, also used on their own.
// adamw decays matrices only (nn::decay_matrices_only: no weight decay for biases and norms)
// where the parameters keep their shapes; a zero1 shard is one flat block (flat_shards), so
// there every element decays.
// The devices of train.devices for this rank (Note [a rank's devices] in
// distributed/data_parallel.h; under a process group, `in_group`, they follow the local rank);
// empty for one device.
std::vector<std::string> train_devices(const Config& cfg, bool in_group);
// The devices model.tensor_parallel splits the model over, chosen as train.devices' count is;
// empty below 2.
std::vector<std::string> tensor_parallel_devices(const Config& cfg, bool in_group);
// The device this rank's process group runs on: the first of its train.devices or of its tensor
// parallel devices, else its one device (Note [a rank's device] in distributed/process_group.h).
std::string group_device(const Config& cfg);

std::unique_ptr<nn::Optimizer> make_optimizer(const Config& cfg, std::vector<Tensor*> params, bool flat_shards = false);
std::unique_ptr<nn::LRSchedule> make_schedule(const Config& cfg, int64_t total_steps);

}  // namespace tg::launcher
