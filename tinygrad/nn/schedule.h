// Learning-rate schedules for tg::nn: lr_at(step) for a 0-based step. Constant, step decay,
// cosine annealing to a floor, and linear warm-up in front of any of them. A training loop sets
// `optimizer.lr = schedule.lr_at(step)` before each optimizer step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace tg::nn {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double lr_at(int64_t step) const = 0;  // step >= 0
  virtual std::string type_name() const = 0;
};

class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr);
  double lr_at(int64_t step) const override;
  std::string type_name() const override { return "ConstantLR"; }
  double lr;
};

// lr * gamma^floor(step / step_size)
class StepLR : public LRSchedule {
 public:
  StepLR(double lr, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;
  std::string type_name() const override { return "StepLR"; }
  double lr;
  int64_t step_size;
  double gamma;
};

// min_lr + (lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2; min_lr from total_steps on.
class CosineLR : public LRSchedule {
 public:
  CosineLR(double lr, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t step) const override;
  std::string type_name() const override { return "CosineLR"; }
  double lr;
  int64_t total_steps;
  double min_lr;
};

// Linear warm-up: step s < warmup_steps gives after.lr_at(0) * (s + 1) / warmup_steps; later
// steps give after.lr_at(s - warmup_steps), so the wrapped schedule starts when warm-up ends.
class WarmupLR : public LRSchedule {
 public:
  WarmupLR(std::unique_ptr<LRSchedule> after, int64_t warmup_steps);
  double lr_at(int64_t step) const override;
  std::string type_name() const override { return "WarmupLR"; }
  const LRSchedule& after() const { return *after_; }
  int64_t warmup_steps;

 private:
  std::unique_ptr<LRSchedule> after_;
};

}  // namespace tg::nn
