// Options of the guard: the anomaly detector's thresholds, the recovery ladder, the
// snapshot budget, the gradient-noise-scale estimator and fault injection. Every field
// is read from the `guard` section of the config (sub-sections guard.recovery.*,
// guard.snapshot.*, guard.noise_scale.*, guard.inject.*); docs/guard.md explains how
// they work together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::guard {

struct RecoveryOptions {
  // Actions tried in order of escalation: skip | cooldown | reset_moments | rollback | halt.
  // An anomaly within calm_steps of the previous action climbs one rung; a rung whose
  // budget is spent is passed over; past the last rung the run halts (exit 3).
  std::vector<std::string> ladder = {"skip", "cooldown", "reset_moments", "rollback", "halt"};
  int64_t skip_budget = 20;      // skips the ladder may take per run; >= 0
  int64_t cooldown_budget = 5;   // LR cool-downs per run; >= 0
  int64_t reset_budget = 3;      // optimizer-moment resets per run; >= 0
  int64_t rollback_budget = 2;   // rollbacks per run; >= 0 (needs checkpoint.every > 0)
  int64_t calm_steps = 10;       // steps after an action within which the same anomaly again climbs the ladder; >= 1
  double cooldown_factor = 0.1;  // LR multiplier during a cool-down; in (0, 1]
  int64_t cooldown_steps = 20;   // steps a cool-down (and a moment reset) lasts; >= 1
  int64_t rollback_skip_steps = 0;  // extra steps of data skipped after a rollback, beyond the window that led to the anomaly; >= 0
  void validate() const;
};

struct SnapshotOptions {
  bool enabled = true;          // false: anomalies are logged but no snapshot is written
  int64_t max_count = 5;        // snapshots per run; >= 0
  double max_mb = 2048;         // disk budget of all snapshots of a run (MiB); > 0
  int64_t min_interval = 20;    // steps between two snapshots (a halt always tries one); >= 0
  int64_t history = 50;         // metrics lines (steps) kept in a snapshot; >= 1
  void validate() const;
};

struct NoiseScaleOptions {
  int64_t every = 10;           // estimate every N steps (one extra norm pass on those steps); 0 disables
  double ema = 0.95;            // smoothing of the |G|^2 and tr(S) estimates; in [0, 1)
  double warn_ratio = 10;       // warn when global_batch > warn_ratio x B_simple; 0 disables
  int64_t warn_after = 20;      // estimates before the warning may fire; >= 1
  void validate() const;
};

// Faults injected on purpose, to test the guard and to demonstrate it.
struct InjectOptions {
  std::vector<int64_t> nonfinite_steps;  // steps whose gradients get an inf after backward
  std::vector<int64_t> spike_steps;      // steps whose batch is replaced by uniform random tokens (a loss spike)
  std::vector<int64_t> overflow_storm;   // [start, length]: gradients overflow on `length` steps from `start`; [] = none
  int64_t rank = 0;                      // the rank whose gradients or batch are corrupted; -1 = every rank
  bool nonfinite_at(int64_t step) const;  // nonfinite_steps or inside the overflow storm
  bool spike_at(int64_t step) const;
  void validate() const;
};

struct GuardOptions {
  bool enabled = true;            // false: no detection, snapshots or recovery (non-finite steps are still skipped)
  int64_t warmup = -1;            // steps before the loss and per-layer rules arm; -1 = schedule.warmup_steps
  double grad_norm_factor = 10;   // anomaly: grad_norm > factor x clip threshold (x the recent mean without clipping); 0 disables
  int64_t grad_norm_patience = 3; // steps in a row above the limit before a clipped explosion is critical (1 = at once); >= 1
  double loss_zscore = 6;         // anomaly: loss z-score against the recent trend above this; 0 disables
  int64_t loss_window = 30;       // healthy steps in the loss (and grad-norm) window; >= 3
  double layer_zscore = 6;        // per-layer outlier: z-score of log(layer norm) against its EMA; 0 disables
  int64_t backoff_limit = 3;      // anomaly: this many loss-scale backoffs ...; 0 disables
  int64_t backoff_window = 20;    // ... within this many steps; >= 1
  int64_t skip_streak = 5;        // anomaly: this many skipped steps in a row; 0 disables
  RecoveryOptions recovery;
  SnapshotOptions snapshot;
  NoiseScaleOptions noise_scale;
  InjectOptions inject;
  void validate() const;          // throws gradguard::Error (bad input) naming guard.<key>
};

}  // namespace gradguard::guard
