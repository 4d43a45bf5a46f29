// Validation of the guard's options: every message names the key and the valid range.
#include "gradguard/guard/guard_options.h"

#include <algorithm>
#include <cmath>

#include "gradguard/core/error.h"

namespace gradguard::guard {
namespace {

void at_least(int64_t v, int64_t lo, const std::string& key) {
  if (v < lo) throw bad_input(key, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
}

void non_negative_steps(const std::vector<int64_t>& steps, const std::string& key) {
  for (int64_t s : steps)
    if (s < 0) throw bad_input(key, "steps must be >= 0, got " + std::to_string(s));
}

}  // namespace

void RecoveryOptions::validate() const {
  if (ladder.empty())
    throw bad_input("guard.recovery.ladder", "must list at least one action (valid: " +
                                                 choice_list<RecoveryAction>() + ")");
  for (size_t i = 0; i < ladder.size(); ++i) {
    if (std::count(ladder.begin(), ladder.end(), ladder[i]) > 1)
      throw bad_input("guard.recovery.ladder", std::string("'") + name_of(ladder[i]) + "' is listed twice");
    if (ladder[i] == RecoveryAction::kHalt && i + 1 != ladder.size())
      throw bad_input("guard.recovery.ladder", "'halt' must be the last rung");
  }
  at_least(skip_budget, 0, "guard.recovery.skip_budget");
  at_least(cooldown_budget, 0, "guard.recovery.cooldown_budget");
  at_least(reset_budget, 0, "guard.recovery.reset_budget");
  at_least(rollback_budget, 0, "guard.recovery.rollback_budget");
  at_least(precision_budget, 0, "guard.recovery.precision_budget");
  at_least(precision_steps, 1, "guard.recovery.precision_steps");
  at_least(calm_steps, 1, "guard.recovery.calm_steps");
  if (!(cooldown_factor > 0 && cooldown_factor <= 1))
    throw bad_input("guard.recovery.cooldown_factor", "must be in (0, 1], got " + format_number(cooldown_factor));
  at_least(cooldown_steps, 1, "guard.recovery.cooldown_steps");
  at_least(rollback_skip_steps, 0, "guard.recovery.rollback_skip_steps");
}

void SnapshotOptions::validate() const {
  at_least(max_count, 0, "guard.snapshot.max_count");
  if (!(max_mb > 0) || !std::isfinite(max_mb))
    throw bad_input("guard.snapshot.max_mb", "must be a finite number > 0, got " + format_number(max_mb));
  at_least(min_interval, 0, "guard.snapshot.min_interval");
  at_least(history, 1, "guard.snapshot.history");
}

void NoiseScaleOptions::validate() const {
  at_least(every, 0, "guard.noise_scale.every");
  if (!(ema >= 0 && ema < 1)) throw bad_input("guard.noise_scale.ema", "must be in [0, 1), got " + format_number(ema));
  if (!(warn_ratio >= 0) || !std::isfinite(warn_ratio))
    throw bad_input("guard.noise_scale.warn_ratio", "must be a finite number >= 0, got " + format_number(warn_ratio));
  at_least(warn_after, 1, "guard.noise_scale.warn_after");
}

void SkipRuleOptions::validate() const {
  if (!(sigma >= 0) || !std::isfinite(sigma))
    throw bad_input("guard.skip_rule.sigma", "must be a finite number >= 0 (0 = off), got " + format_number(sigma));
  at_least(window, 4, "guard.skip_rule.window");
}

bool InjectOptions::nonfinite_at(int64_t step) const {
  if (std::find(nonfinite_steps.begin(), nonfinite_steps.end(), step) != nonfinite_steps.end()) return true;
  return overflow_storm.size() == 2 && step >= overflow_storm[0] && step < overflow_storm[0] + overflow_storm[1];
}

bool InjectOptions::spike_at(int64_t step) const {
  return std::find(spike_steps.begin(), spike_steps.end(), step) != spike_steps.end();
}

void InjectOptions::validate() const {
  if (rank < -1) throw bad_input("guard.inject.rank", "must be -1 (every rank) or a rank >= 0, got " + std::to_string(rank));
  non_negative_steps(nonfinite_steps, "guard.inject.nonfinite_steps");
  non_negative_steps(spike_steps, "guard.inject.spike_steps");
  if (!overflow_storm.empty() &&
      (overflow_storm.size() != 2 || overflow_storm[0] < 0 || overflow_storm[1] < 1))
    throw bad_input("guard.inject.overflow_storm",
                    "expected [start, length] with start >= 0 and length >= 1, or [] for none");
}

void GuardOptions::validate() const {
  at_least(warmup, -1, "guard.warmup");
  if (!(grad_norm_factor == 0 || grad_norm_factor > 1) || !std::isfinite(grad_norm_factor))
    throw bad_input("guard.grad_norm_factor",
                    "must be a finite number > 1 (or 0 to disable), got " + format_number(grad_norm_factor));
  at_least(grad_norm_patience, 1, "guard.grad_norm_patience");
  if (!(loss_zscore >= 0) || !std::isfinite(loss_zscore))
    throw bad_input("guard.loss_zscore", "must be a finite number >= 0 (0 disables), got " + format_number(loss_zscore));
  at_least(loss_window, 3, "guard.loss_window");
  if (!(layer_zscore >= 0) || !std::isfinite(layer_zscore))
    throw bad_input("guard.layer_zscore", "must be a finite number >= 0 (0 disables), got " + format_number(layer_zscore));
  if (!(forecast_zscore >= 0) || !std::isfinite(forecast_zscore))
    throw bad_input("guard.forecast_zscore",
                    "must be a finite number >= 0 (0 disables), got " + format_number(forecast_zscore));
  at_least(backoff_limit, 0, "guard.backoff_limit");
  at_least(backoff_window, 1, "guard.backoff_window");
  at_least(skip_streak, 0, "guard.skip_streak");
  recovery.validate();
  snapshot.validate();
  noise_scale.validate();
  skip_rule.validate();
  inject.validate();
}

}  // namespace gradguard::guard
