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
  if (warmup_steps < 0 || warmup_steps > total_steps)
    throw bad_input("schedule.warmup_steps", "must be in [0, schedule.total_steps = " +
                                                 std::to_string(total_steps) + "], got " +
                                                 std::to_string(warmup_steps));
  if (!(wsd_decay_fraction > 0 && wsd_decay_fraction <= 1))
    throw bad_input("schedule.wsd_decay_fraction", "must be in (0, 1], got " + std::to_string(wsd_decay_fraction));
  if (!(min_lr >= 0) || !std::isfinite(min_lr))
    throw bad_input("schedule.min_lr", "must be a finite number >= 0");
}

double scaled_lr(double lr, LrScaling rule, int64_t base_batch, int64_t global_batch) {
  if (rule == LrScaling::kNone || base_batch <= 0) return lr;
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(base_batch);
  return rule == LrScaling::kLinear ? lr * ratio : lr * std::sqrt(ratio);
}

LrSchedule::LrSchedule(double peak_lr, const ScheduleOptions& options)
    : peak_(peak_lr), options_(options) {
  options_.validate();
}

double LrSchedule::lr_at(int64_t step) const {
  const int64_t W = options_.warmup_steps, N = options_.total_steps;
  const double lo = options_.min_lr;
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
