// Closed-form schedule (no recursion, so any step can be evaluated directly, which makes
// resume exact and avoids the drift of torch's recursive cosine formula).
#include "gradguard/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "gradguard/core/error.h"

namespace gradguard::optim {

void ScheduleOptions::validate() const {
  if (total_steps < 1)
    throw bad_input("schedule.total_steps", "must be >= 1, got " + std::to_string(total_steps));
  // With epochs, total_steps is known once the data is (checked again then).
  if (warmup_steps < 0 || (warmup_steps > total_steps && epochs == 0))
    throw bad_input("schedule.warmup_steps", "must be in [0, schedule.total_steps = " +
                                                 std::to_string(total_steps) + "], got " +
                                                 std::to_string(warmup_steps));
  if (!(wsd_decay_fraction > 0 && wsd_decay_fraction <= 1))
    throw bad_input("schedule.wsd_decay_fraction", "must be in (0, 1], got " + std::to_string(wsd_decay_fraction));
  if (!(min_lr >= 0 || min_lr == -1.0) || !std::isfinite(min_lr))
    throw bad_input("schedule.min_lr", "must be a finite number >= 0, or -1 for min_lr_ratio x optim.lr, got " +
                                           std::to_string(min_lr));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    throw bad_input("schedule.min_lr_ratio", "must be in [0, 1], got " + std::to_string(min_lr_ratio));
  if (!(warmup_ratio >= 0 && warmup_ratio < 1))
    throw bad_input("schedule.warmup_ratio", "must be in [0, 1), got " + std::to_string(warmup_ratio));
  if (!(epochs >= 0) || !std::isfinite(epochs) || epochs > 1e6)
    throw bad_input("schedule.epochs", "must be a finite number in [0, 1e6] (0 = use total_steps), got " +
                                           std::to_string(epochs));
}

void ScheduleOptions::resolve() {
  if (warmup_ratio > 0)
    warmup_steps = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps))),
                                       1, total_steps);
}

int64_t ScheduleOptions::steps_for_epochs(double epochs, int64_t sequences, int64_t global_batch) {
  const double steps = std::ceil(epochs * static_cast<double>(sequences) / static_cast<double>(global_batch));
  return std::max<int64_t>(1, static_cast<int64_t>(steps));
}

double ScheduleOptions::floor_lr(double peak_lr, double configured_lr) const {
  if (min_lr >= 0) return configured_lr > 0 ? min_lr * peak_lr / configured_lr : min_lr;
  return min_lr_ratio * peak_lr;
}

double scaled_lr(double lr, LrScaling rule, int64_t base_batch, int64_t global_batch) {
  if (rule == LrScaling::kNone || base_batch <= 0) return lr;
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(base_batch);
  return rule == LrScaling::kLinear ? lr * ratio : lr * std::sqrt(ratio);
}

LrSchedule::LrSchedule(double peak_lr, const ScheduleOptions& options, double configured_lr)
    : peak_(peak_lr), floor_(options.floor_lr(peak_lr, configured_lr)), options_(options) {
  options_.validate();
}

double LrSchedule::lr_at(int64_t step) const {
  const int64_t W = options_.warmup_steps, N = options_.total_steps;
  const double lo = floor_;
  if (step < W) return peak_ * static_cast<double>(step + 1) / static_cast<double>(W);
  if (options_.decay == Decay::kConstant) return peak_;
  if (step >= N) return lo;
  const double p = static_cast<double>(step - W) / static_cast<double>(N - W);
  double lr;
  if (options_.decay == Decay::kCosine) {
    lr = lo + (peak_ - lo) * 0.5 * (1.0 + std::cos(M_PI * p));
  } else if (options_.decay == Decay::kLinear) {
    lr = peak_ - (peak_ - lo) * p;
  } else {  // wsd: stable, then linear over the last fraction
    const double f = options_.wsd_decay_fraction;
    lr = p < 1.0 - f ? peak_ : peak_ - (peak_ - lo) * (p - (1.0 - f)) / f;
  }
  return std::max(lr, lo);
}

}  // namespace gradguard::optim
