// Options of the guard: the anomaly detector's thresholds, the recovery ladder, the
// snapshot budget, the gradient-noise-scale estimator and fault injection, and the two
// vocabularies they share: the kinds of anomaly the detector reports and the actions of
// the recovery ladder. Every field is read from the `guard` section of the config
// (sub-sections guard.recovery.*, guard.snapshot.*, guard.noise_scale.*,
// guard.inject.*); docs/guard.md explains how they work together.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gradguard/core/choice.h"
#include "gradguard/core/option_fields.h"

namespace gradguard::guard {

// What the detector can find (guard/detector.h describes each rule).
enum class AnomalyKind { kNonfinite, kLossScaleStuck, kGradNorm, kLossSpike, kLayerOutlier, kBackoffStorm, kSkipStreak };
constexpr std::array<Choice<AnomalyKind>, 7> choices(AnomalyKind) {
  return {{{AnomalyKind::kNonfinite, "nonfinite"},
           {AnomalyKind::kLossScaleStuck, "loss_scale_stuck"},
           {AnomalyKind::kGradNorm, "grad_norm"},
           {AnomalyKind::kLossSpike, "loss_spike"},
           {AnomalyKind::kLayerOutlier, "layer_outlier"},
           {AnomalyKind::kBackoffStorm, "backoff_storm"},
           {AnomalyKind::kSkipStreak, "skip_streak"}}};
}

enum class Severity { kWarning, kCritical };
constexpr std::array<Choice<Severity>, 2> choices(Severity) {
  return {{{Severity::kWarning, "warning"}, {Severity::kCritical, "critical"}}};
}

// The rungs of the recovery ladder (guard/recovery.h describes each).
enum class RecoveryAction { kSkip, kCooldown, kResetMoments, kRollback, kHalt, kPrecision };
constexpr std::array<Choice<RecoveryAction>, 6> choices(RecoveryAction) {
  return {{{RecoveryAction::kSkip, "skip"},
           {RecoveryAction::kPrecision, "precision"},
           {RecoveryAction::kCooldown, "cooldown"},
           {RecoveryAction::kResetMoments, "reset_moments"},
           {RecoveryAction::kRollback, "rollback"},
           {RecoveryAction::kHalt, "halt"}}};
}

struct RecoveryOptions {
  std::vector<RecoveryAction> ladder = {RecoveryAction::kSkip, RecoveryAction::kCooldown,
                                        RecoveryAction::kResetMoments, RecoveryAction::kRollback,
                                        RecoveryAction::kHalt};
  int64_t skip_budget = 20;
  int64_t cooldown_budget = 5;
  int64_t reset_budget = 3;
  int64_t rollback_budget = 2;
  int64_t calm_steps = 10;
  double cooldown_factor = 0.1;
  int64_t cooldown_steps = 20;
  int64_t rollback_skip_steps = 0;
  int64_t precision_budget = 2;
  int64_t precision_steps = 100;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("ladder", ladder,
          "actions in order of escalation, each at most once, halt last: skip (drop the update) | precision (for "
          "loss-scale anomalies only: compute one dtype wider, fp16 -> bf16 -> fp32, for precision_steps; passed "
          "over for other anomalies) | cooldown (LR x cooldown_factor) | reset_moments (zero the moments of the "
          "layers involved) | rollback (last good checkpoint, skip its data) | halt (exit 3); past the last rung the "
          "run halts");
    field("skip_budget", skip_budget, "skips the ladder may take per run; >= 0");
    field("cooldown_budget", cooldown_budget, "LR cool-downs per run; >= 0");
    field("reset_budget", reset_budget, "optimizer-moment resets per run; >= 0");
    field("rollback_budget", rollback_budget, "rollbacks per run (they need checkpoint.every > 0); >= 0");
    field("calm_steps", calm_steps,
          "steps after an action within which the same kind of anomaly climbs one rung; >= 1");
    field("cooldown_factor", cooldown_factor, "LR multiplier during a cool-down; in (0, 1]");
    field("cooldown_steps", cooldown_steps, "steps a cool-down (and the one after a moment reset) lasts; >= 1");
    field("rollback_skip_steps", rollback_skip_steps,
          "extra steps of data skipped after a rollback, beyond the window that led to the anomaly; >= 0");
    field("precision_budget", precision_budget, "precision fallbacks per run; >= 0");
    field("precision_steps", precision_steps,
          "steps a precision fallback lasts before the configured amp.dtype returns; >= 1");
  }
};

struct SnapshotOptions {
  bool enabled = true;
  int64_t max_count = 5;
  double max_mb = 2048;
  int64_t min_interval = 20;
  int64_t history = 50;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("enabled", enabled, "write snapshots/step-N-<kind>/ with a diagnosis on critical anomalies");
    field("max_count", max_count, "snapshots per run; >= 0");
    field("max_mb", max_mb, "disk budget of all snapshots of a run (MiB); > 0");
    field("min_interval", min_interval, "steps between two snapshots (a halt always tries one); >= 0");
    field("history", history, "metrics lines (steps) kept in a snapshot; >= 1");
  }
};

struct NoiseScaleOptions {
  int64_t every = 10;
  double ema = 0.95;
  double warn_ratio = 10;
  int64_t warn_after = 20;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("every", every,
          "estimate the gradient noise scale every N steps (one extra norm pass on those steps; needs accum_steps > "
          "1); 0 disables");
    field("ema", ema, "smoothing of the |G|^2 and tr(S) estimates; in [0, 1)");
    field("warn_ratio", warn_ratio, "warn when global_batch > warn_ratio x B_simple; 0 disables");
    field("warn_after", warn_after, "estimates before the warning may fire; >= 1");
  }
};

// OLMo-core's skip rule (guard/skip_rule.h).
struct SkipRuleOptions {
  double sigma = 0;
  int64_t window = 128;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("sigma", sigma,
          "skip a step whose loss or gradient norm is more than sigma standard deviations above the mean of the "
          "last `window` steps (OLMo-core's rule; OLMo 2 uses 6); independent of the detector and the ladder; 0 = off");
    field("window", window, "steps of loss and gradient-norm history the rule compares with; armed after window / 2; >= 4");
  }
};

// Faults injected on purpose, to test the guard and to demonstrate it.
struct InjectOptions {
  std::vector<int64_t> nonfinite_steps;
  std::vector<int64_t> spike_steps;
  std::vector<int64_t> overflow_storm;
  int64_t rank = 0;
  bool nonfinite_at(int64_t step) const;  // nonfinite_steps or inside the overflow storm
  bool spike_at(int64_t step) const;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("nonfinite_steps", nonfinite_steps, "steps whose gradients get an inf after backward");
    field("spike_steps", spike_steps, "steps whose batch is replaced by uniform random tokens (a loss spike)");
    field("overflow_storm", overflow_storm, "[start, length]: gradients overflow on `length` steps from `start`; [] = none");
    field("rank", rank, "the rank whose gradients or batch are corrupted; -1 = every rank");
  }
};

struct GuardOptions {
  bool enabled = true;
  int64_t warmup = -1;
  double grad_norm_factor = 10;
  int64_t grad_norm_patience = 3;
  double loss_zscore = 6;
  int64_t loss_window = 30;
  double layer_zscore = 6;
  double forecast_zscore = 4;
  int64_t backoff_limit = 3;
  int64_t backoff_window = 20;
  int64_t skip_streak = 5;
  RecoveryOptions recovery;
  SnapshotOptions snapshot;
  NoiseScaleOptions noise_scale;
  SkipRuleOptions skip_rule;
  InjectOptions inject;
  void validate() const;  // throws gradguard::Error (bad input) naming guard.<key>

  template <class Field>
  void fields(Field&& field) {
    field("enabled", enabled,
          "anomaly detection, snapshots and recovery; false: none of them (non-finite steps are still skipped)");
    field("warmup", warmup, "steps before the loss and per-layer rules arm; -1 = schedule.warmup_steps");
    field("grad_norm_factor", grad_norm_factor,
          "anomaly: grad_norm > factor x the clip threshold (x the recent mean when no global threshold applies); "
          "> 1, 0 disables");
    field("grad_norm_patience", grad_norm_patience,
          "steps in a row above that limit before an explosion that clipping bounds is critical (1 = at once); >= 1");
    field("loss_zscore", loss_zscore, "anomaly: loss z-score against the trend of the recent window; 0 disables");
    field("loss_window", loss_window, "healthy steps in the loss and grad-norm windows; >= 3");
    field("layer_zscore", layer_zscore,
          "per-layer outlier: z-score of log(layer norm) against the layer's EMA; 0 disables");
    field("forecast_zscore", forecast_zscore,
          "band of the gradient-norm forecast, in scale units of log(norm): a norm outside it is a forecast_breach "
          "in metrics.jsonl (an observation, never acted on); 0 disables");
    field("backoff_limit", backoff_limit, "anomaly: this many loss-scale backoffs within backoff_window; 0 disables");
    field("backoff_window", backoff_window, "steps of the backoff-storm window; >= 1");
    field("skip_streak", skip_streak, "anomaly: this many skipped steps in a row; 0 disables");
    nested(field, "recovery", recovery);
    nested(field, "snapshot", snapshot);
    nested(field, "noise_scale", noise_scale);
    nested(field, "skip_rule", skip_rule);
    nested(field, "inject", inject);
  }
};

}  // namespace gradguard::guard
