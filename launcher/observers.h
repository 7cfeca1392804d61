// The standard observers of the trainer (trainer.h): a progress printer (a bar redrawn with \r,
// or plain lines; elapsed time and ETA), the metrics writer (run_dir/metrics.jsonl), the text log
// (run_dir/train.log) and the checkpoint writer (every train.checkpoint_every steps and at the end).
#pragma once
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/log.h"
#include "launcher/trainer.h"

namespace tg::launcher {

class ProgressPrinter : public TrainObserver {
 public:
  // tty: redraw one line with \r; otherwise a line every train.print_every steps.
  explicit ProgressPrinter(std::FILE* out = stdout, bool tty = false);
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t, const StepEvent& e) override;
  void on_step_skipped(Trainer& t, const SkipEvent& e) override;
  void on_eval(Trainer& t, const EvalEvent& e) override;
  void on_checkpoint(Trainer& t, const CheckpointEvent& e) override;
  void on_train_end(Trainer& t, const TrainSummary& s) override;

 private:
  void end_bar();
  std::string timing(const StepEvent& e) const;
  std::FILE* out_;
  bool tty_, bar_open_ = false;
  int64_t last_printed_ = 0, first_step_ = 0;
  std::chrono::steady_clock::time_point began_;
};

// One JSON object per line: {"type":"train","step","epoch","loss","lr","examples_per_s"} or
// {"type":"eval","step","epoch","eval_accuracy" | "val_loss","perplexity","eval_seconds"} (train
// records of next-token tasks add "tokens_per_s" and, with train.peak_tflops, "mfu") or {"type":"checkpoint",...} or
// {"type":"skip","step","first_step","skipped"} (ddp, zero1, fsdp: "skipped" of the steps
// first_step..step were skipped on every rank on a non-finite gradient; SkipEvent);
// train records carry "grad_norm", the global gradient norm before clipping (every run).
// Every record carries "time" (wall clock, seconds since the Unix epoch) and "elapsed_s" (training
// time of the run, continued across resumes). A resumed run first drops the records after its
// checkpoint's step, so the file reads like one uninterrupted run.
class MetricsWriter : public TrainObserver {
 public:
  // Receives every record right after metrics.jsonl has it (metric_sinks.h: TensorBoard, CSV).
  class Sink {
   public:
    virtual ~Sink() = default;
    // Training begins at `step` (> 0: resumed; metrics.jsonl holds the records up to it).
    virtual void begin(int64_t step) = 0;
    virtual void write(const nlohmann::json& record) = 0;
  };
  explicit MetricsWriter(std::string path);
  void add_sink(std::shared_ptr<Sink> sink) { sinks_.push_back(std::move(sink)); }
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t, const StepEvent& e) override;
  void on_step_skipped(Trainer& t, const SkipEvent& e) override;
  void on_eval(Trainer& t, const EvalEvent& e) override;
  void on_checkpoint(Trainer& t, const CheckpointEvent& e) override;

 private:
  void write(nlohmann::json record);
  static double last_elapsed_s(const std::string& path);
  std::string path_;
  std::ofstream out_;
  double elapsed_before_ = 0;  // a resumed run's elapsed_s at its checkpoint
  std::chrono::steady_clock::time_point began_;
  std::vector<std::shared_ptr<Sink>> sinks_;
};

// Plain text lines with a timestamp, appended to run_dir/train.log.
class TrainLog : public TrainObserver {
 public:
  explicit TrainLog(std::string path);
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t, const StepEvent& e) override;
  void on_step_skipped(Trainer& t, const SkipEvent& e) override;
  void on_eval(Trainer& t, const EvalEvent& e) override;
  void on_checkpoint(Trainer& t, const CheckpointEvent& e) override;
  void on_train_end(Trainer& t, const TrainSummary& s) override;
  void line(const std::string& text);  // also used by run_train for errors

 private:
  std::unique_ptr<FileLog> out_;  // appends "YYYY-MM-DD HH:MM:SS  text" lines (log.h)
};

// Writes a checkpoint every train.checkpoint_every steps (when > 0) and at the end of training.
class CheckpointWriter : public TrainObserver {
 public:
  void on_train_begin(Trainer& t) override;
  void on_step(Trainer& t, int64_t step) override;
  void on_train_end(Trainer& t, const TrainSummary& s) override;

 private:
  int64_t written_step_ = -1;
};

}  // namespace tg::launcher
