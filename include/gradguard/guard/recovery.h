// The recovery ladder: what the guard does about a critical anomaly, escalating when
// anomalies keep coming. Every rung discards the anomalous step's update; above that:
//   skip           nothing more
//   precision      for the loss-scale anomalies (backoff storm, scale stuck at its floor)
//                  only, passed over for any other: forward and backward compute one
//                  dtype wider for precision_steps (fp16 -> bf16 -> fp32; a second
//                  fallback inside the window widens once more), then amp.dtype returns
//   cooldown       the learning rate is multiplied by cooldown_factor for cooldown_steps
//   reset_moments  the optimizer moments of the affected tensors are zeroed (they restart
//                  with bias correction), with a cool-down so the fresh moments settle
//   rollback       the last good checkpoint is restored and the data window that led to
//                  the anomaly is skipped (PaLM's remedy for loss spikes)
//   halt           training stops with exit code 3 and the snapshot path
// An anomaly of the same kind as the previous one within calm_steps of its action climbs
// one rung above it (the remedy did not work); after a calm period, or for an anomaly
// of another kind (an independent event), the ladder starts again at the bottom. A rung whose budget is spent (or a
// rollback without a checkpoint) is passed over; past the top the run halts. The ladder
// is pure host logic with state_dict(), so a resumed run keeps its spent budgets.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/guard/guard_options.h"

namespace gradguard::guard {

struct RecoveryDecision {
  RecoveryAction action = RecoveryAction::kSkip;
  int64_t rung = 0;           // index in the ladder
  int64_t budget_left = 0;    // budget of this action after taking it (-1: unlimited, halt)
  std::string note;           // why lower rungs were passed over, if they were
};

class RecoveryLadder {
 public:
  explicit RecoveryLadder(const RecoveryOptions& options);

  // Decides the action for a critical anomaly of `kind` at `step` and spends its
  // budget. `rollback_possible`: a checkpoint to roll back to exists.
  RecoveryDecision decide(int64_t step, AnomalyKind kind, bool rollback_possible);

  // Learning-rate multiplier at `step`: cooldown_factor inside a cool-down, else 1.
  double lr_factor(int64_t step) const;
  // How many dtypes wider than amp.dtype `step` computes in: 0 outside a precision
  // fallback, 1 inside one, 2 after a second one inside the first's window.
  int64_t precision_level(int64_t step) const;

  int64_t budget_left(RecoveryAction action) const;  // -1 for halt

  nlohmann::json state_dict() const;
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "recovery state");

 private:
  RecoveryOptions options_;
  int64_t skips_ = 0, cooldowns_ = 0, resets_ = 0, rollbacks_ = 0;  // spent
  int64_t last_step_ = -1;       // step of the last action; -1 = none yet
  int64_t last_rung_ = -1;       // rung of the last action
  AnomalyKind last_kind_ = AnomalyKind::kNonfinite;  // anomaly kind of the last action (when last_step_ >= 0)
  int64_t cooldown_until_ = -1;  // steps < this (and > the action's step) run cooled down
  int64_t cooldown_from_ = -1;
  int64_t precisions_ = 0;        // precision fallbacks spent
  int64_t precision_from_ = -1, precision_until_ = -1, precision_level_ = 0;  // the current window
};

}  // namespace gradguard::guard
