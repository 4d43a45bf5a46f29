// GuardedStep: the guard's whole part of one optimizer step, as one object any training
// loop can hold -- gradguard's own trainer, a plain LibTorch loop (examples/libtorch_loop)
// or a PyTorch loop through the Python module (python/). It owns the loss scaler, the
// fused gradient statistics, the clipper, the anomaly detector, the recovery ladder and
// the gradient-noise-scale estimate, and runs them in the order of docs/design.md:
//
//   backward(loss * loss_scale())              the loop, over its micro-batches
//   outcome = guarded.step(s, inputs)          statistics + side values: ONE host read
//                                              clip, scaler update, verdict, recovery
//                                              decision, snapshot on a critical step,
//                                              optimizer step unless skipped
//   act on outcome.recovery (rollback, halt)   the loop: only it knows its checkpoints
//
// Side values (the loss, per-micro-batch losses, the noise-scale norm, a stop request) travel as named
// tensor fields of StepInputs and come back as named host values in StepOutcome; they
// are packed into the statistics' single copy here and nowhere else. What the step
// cannot know by itself reaches it through hooks set once: how to step and inspect the
// optimizer (a torch::optim::Optimizer in C++, callbacks from Python), whether a
// checkpoint exists to roll back to, and who writes snapshots (forensics/snapshot.h,
// a layer above: the guard decides, the writer gathers the evidence).
//
// Everything here but the one statistics copy is host arithmetic; the step makes no
// other device->host read (tests count them with core/host_read.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "gradguard/amp/loss_scaler.h"
#include "gradguard/amp/precision.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/guard/detector.h"
#include "gradguard/guard/guard_options.h"
#include "gradguard/guard/noise_scale.h"
#include "gradguard/guard/skip_rule.h"
#include "gradguard/guard/recovery.h"
#include "gradguard/optim/optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace gradguard::guard {

struct GuardedStepOptions {
  grad::ClipOptions clip;
  amp::LossScalerOptions scaler;          // mode auto is resolved with amp_dtype
  amp::AmpDtype amp_dtype = amp::AmpDtype::kFp32;
  GuardOptions guard;
  int64_t warmup_steps = 0;               // the schedule's warmup: the detector's warmup when guard.warmup is -1
  double peak_lr = 0;                     // the schedule's peak, for the diagnosis (0 = unknown)
  std::array<double, 2> adam_betas = {0.9, 0.95};  // the optimizer's betas and eps, for the
  double adam_eps = 1e-8;                          // diagnosis's Adam evidence
  void validate() const;                  // throws gradguard::Error (bad input) naming the key
};

// The step's side values, all still on the device (nothing here is read before step()).
struct StepInputs {
  at::Tensor loss;          // 0-dim: mean loss of the global batch (unscaled); required
  at::Tensor micro_losses;  // [micro-batches] mean loss of each; optional (the diagnosis uses it)
  // Gradient-noise-scale sample (guard/noise_scale.h), optional: the squared L2 norm of
  // the gradient right after the first micro-batch's backward as .grad held it (times
  // the loss scale and times that micro-batch's share of the global tokens), the share,
  // and the batch sizes in sequences of that micro-batch and of the global batch.
  at::Tensor noise_sq_norm;
  double noise_share = 0;
  double noise_micro_batch = 0;
  double noise_global_batch = 0;
  // 0-dim, optional: > 0 when a process of the run was asked to stop (SIGTERM/SIGINT);
  // data parallelism sums every rank's flag here, so all ranks learn it in the same read.
  at::Tensor stop_request;
  // 0-dim, optional: an auxiliary loss term to report beside `loss` (the z-loss), read in
  // the same host copy; the detector does not watch it.
  at::Tensor z_loss;
  double lr = std::numeric_limits<double>::quiet_NaN();  // the learning rate of this step (host)
  std::string injected;     // a fault injected on purpose at this step ("" = none), for the diagnosis
};

// What a snapshot writer reports back.
struct SnapshotResult {
  std::string dir;      // the snapshot directory; "" when none was written
  std::string skipped;  // why not, when dir is ""
};

// Everything one step decided and measured, on the host.
struct StepOutcome {
  int64_t step = 0;
  double loss = 0;                   // mean loss of the global batch (may be inf/NaN)
  std::vector<double> micro_losses;  // [micro-batch] when given
  double z_loss = std::numeric_limits<double>::quiet_NaN();  // as given; NaN when not
  double lr = 0;                     // as given
  std::string injected;              // as given
  double loss_scale = 1;             // the scale the gradients carried
  grad::GradStats stats;             // per-tensor, per-layer and global norms, non-finite flag
  grad::ClipResult clip;             // norm before clipping, coefficient, threshold
  amp::ScalerUpdate scaler;
  Verdict verdict;                   // the anomalies found (warnings included)
  std::optional<RecoveryDecision> recovery;  // the ladder's decision on a critical step
  int64_t tensors_reset = 0;         // moments reset by a reset_moments decision
  SnapshotResult snapshot;           // on a critical step
  bool applied = false;              // the update was applied (or, without an optimizer hook, must be)
  SkipDecision skip_rule;            // guard.skip_rule's judgement (skip: the step was not applied)
  double noise_scale = std::numeric_limits<double>::quiet_NaN();  // B_simple (sequences); NaN = not measured
  bool noise_warning = false;        // first time global batch > warn_ratio x B_simple
  bool halt = false;                 // training cannot go on (exit 3): the ladder is spent, or
                                     // the scaler is stuck with the guard off
  std::string halt_message;
  double step_seconds = 0;           // wall time since the previous step() returned (0 for the first)
  bool stop_requested = false;       // inputs.stop_request was > 0: the loop should stop after this step

  bool skipped() const { return !applied; }
  bool rollback() const { return recovery && recovery->action == RecoveryAction::kRollback; }
};

class GuardedStep;

// How the step reaches what it guards; each hook may be empty.
struct StepHooks {
  std::function<void()> optimizer_step;                    // apply the update (empty: the loop does)
  std::function<optim::ParamMoments(size_t tensor)> moments;  // optimizer state of params[tensor], read only
  std::function<bool(size_t tensor)> reset_moments;        // forget it; false when there was none
  std::function<bool()> rollback_available;                // a checkpoint exists (empty: never)
  // Writes the snapshot of a critical step (`force`: a halt, which ignores rate limits).
  std::function<SnapshotResult(const GuardedStep&, const StepOutcome&, bool force)> snapshot;
};

// The hooks for a LibTorch optimizer over `params` (the same list, same order, as the
// GuardedStep's).
StepHooks optimizer_hooks(torch::optim::Optimizer& optimizer, std::vector<at::Tensor> params);

// Which state load_state_dict restores: kResume everything, kRollback only what
// describes the weights (scaler, clipper, detector windows) and not the budgets spent.
enum class RestoreScope { kResume, kRollback };

class GuardedStep {
 public:
  // `params` and `names` are parallel ([tensor]); names give the layer groups
  // (grad/grad_stats.h). Validates `options`.
  GuardedStep(const GuardedStepOptions& options, std::vector<at::Tensor> params, std::vector<std::string> names,
              StepHooks hooks = {});

  // The loss multiplier for backward (1 unless loss scaling is on).
  double loss_scale() const { return scaler_.scale(); }
  // The recovery ladder's learning-rate factor at `step` (cooldown_factor in a cool-down).
  double lr_factor(int64_t step) const { return ladder_.lr_factor(step); }
  // The dtype forward and backward of `step` compute in: `configured` (amp.dtype) made
  // wider by the ladder's precision fallback, fp16 -> bf16 -> fp32, while one lasts.
  amp::AmpDtype compute_dtype(int64_t step, amp::AmpDtype configured) const;

  // Runs the guard on the gradients in .grad (scaled by loss_scale()). Unscales and
  // clips them in place, and steps the optimizer through the hook when the update is
  // applied. One device->host read. Throws gradguard::Error (kHalted) only for
  // clip.error_if_nonfinite; every other event is in the outcome.
  StepOutcome step(int64_t step, const StepInputs& inputs);

  void set_hooks(StepHooks hooks) { hooks_ = std::move(hooks); }
  // ZeRO stage 2: measure and clip this rank's parts of the summed gradient instead of
  // .grad, the statistics combined over the ranks by `sharded.sum_over_ranks` (one
  // collective before the one host read; AGC within it, grad/grad_stats.h).
  void use_sharded_gradients(grad::ShardedGradients sharded);

  // Read access for writers of snapshots and metrics.
  const GuardedStepOptions& options() const { return options_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  const grad::LayerGroups& groups() const { return stats_.groups(); }
  const AnomalyDetector& detector() const { return detector_; }
  const amp::LossScaler& scaler() const { return scaler_; }
  const StepHooks& hooks() const { return hooks_; }
  int64_t last_scale_growth() const { return last_scale_growth_; }  // step the scale last grew; -1 = never
  const std::deque<double>& recent_grad_norms() const { return recent_norms_; }   // [last 50 steps]
  const std::deque<double>& recent_step_seconds() const { return recent_seconds_; }  // [last 50 steps]

  // {"scaler", "clipper", "last_scale_growth", "guard": {"detector", "recovery",
  // "noise_scale"}}: what trainer_state.json has always held under these keys.
  nlohmann::json state_dict() const;
  // Throws gradguard::Error (bad input) naming `where` and the field for a malformed
  // state; every field is checked before any is applied.
  void load_state_dict(const nlohmann::json& state, RestoreScope scope, const std::string& where);

 private:
  void apply_state(const nlohmann::json& state, RestoreScope scope, const std::string& where);

  GuardedStepOptions options_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  StepHooks hooks_;
  amp::LossScaler scaler_;
  grad::GradStatsComputer stats_;
  grad::Clipper clipper_;
  AnomalyDetector detector_;
  RecoveryLadder ladder_;
  NoiseScaleEstimator noise_;
  SkipRule skip_rule_;
  bool noise_warned_ = false;
  int64_t last_scale_growth_ = -1;
  std::deque<double> recent_norms_, recent_seconds_;  // [last 50 steps] for the diagnosis
  std::optional<std::chrono::steady_clock::time_point> last_end_;
};

}  // namespace gradguard::guard
