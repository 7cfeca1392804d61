// Learning-rate schedules for tg::nn: argument checks and the closed-form value at each step.
#include "tinygrad/nn/schedule.h"

#include <cmath>

#include "tinygrad/error.h"

namespace tg::nn {

namespace {
void check_step(const LRSchedule& s, int64_t step) {
  TG_CHECK(step >= 0, s.type_name(), ": step must be non-negative, got ", step);
}
}  // namespace

ConstantLR::ConstantLR(double lr_) : lr(lr_) { TG_CHECK(lr >= 0, "ConstantLR: lr must be non-negative, got ", lr); }

double ConstantLR::lr_at(int64_t step) const {
  check_step(*this, step);
  return lr;
}

StepLR::StepLR(double lr_, int64_t step_size_, double gamma_) : lr(lr_), step_size(step_size_), gamma(gamma_) {
  TG_CHECK(lr >= 0, "StepLR: lr must be non-negative, got ", lr);
  TG_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  TG_CHECK(gamma > 0, "StepLR: gamma must be positive, got ", gamma);
}

double StepLR::lr_at(int64_t step) const {
  check_step(*this, step);
  return lr * std::pow(gamma, static_cast<double>(step / step_size));
}

CosineLR::CosineLR(double lr_, int64_t total, double min_lr_) : lr(lr_), total_steps(total), min_lr(min_lr_) {
  TG_CHECK(lr >= 0 && min_lr >= 0, "CosineLR: lr and min_lr must be non-negative, got lr=", lr, " min_lr=", min_lr);
  TG_CHECK(total_steps > 0, "CosineLR: total_steps must be positive, got ", total_steps);
}

double CosineLR::lr_at(int64_t step) const {
  check_step(*this, step);
  if (step >= total_steps) return min_lr;
  double frac = static_cast<double>(step) / static_cast<double>(total_steps);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * frac));
}

WarmupLR::WarmupLR(std::unique_ptr<LRSchedule> after, int64_t warmup) : warmup_steps(warmup), after_(std::move(after)) {
  TG_CHECK(after_ != nullptr, "WarmupLR: needs a schedule to warm up into");
  TG_CHECK(warmup_steps >= 0, "WarmupLR: warmup_steps must be non-negative, got ", warmup_steps);
}

double WarmupLR::lr_at(int64_t step) const {
  check_step(*this, step);
  if (step < warmup_steps)
    return after_->lr_at(0) * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  return after_->lr_at(step - warmup_steps);
}

}  // namespace tg::nn
