// The guarded step top to bottom: pack the side values behind the gradients' norms, read
// everything back in one copy, then host decisions in a fixed order -- clip, scaler,
// noise scale, verdict, recovery, optimizer -- so every loop built on it behaves alike.
#include "gradguard/guard/guarded_step.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/guard/side_layout.h"

namespace gradguard::guard {
namespace {

constexpr size_t kRecent = 50;  // steps of norms and times a diagnosis looks back on

int64_t resolved_warmup(const GuardedStepOptions& o) { return o.guard.warmup >= 0 ? o.guard.warmup : o.warmup_steps; }

}  // namespace

void GuardedStepOptions::validate() const {
  clip.validate();
  scaler.validate();
  guard.validate();
  if (warmup_steps < 0) throw bad_input("schedule.warmup_steps", "must be >= 0, got " + std::to_string(warmup_steps));
  if (!(peak_lr >= 0) || !std::isfinite(peak_lr))
    throw bad_input("optim.lr", "the peak learning rate must be a finite number >= 0, got " + format_number(peak_lr));
}

StepHooks optimizer_hooks(torch::optim::Optimizer& optimizer, std::vector<at::Tensor> params) {
  auto shared = std::make_shared<std::vector<at::Tensor>>(std::move(params));
  StepHooks h;
  h.optimizer_step = [&optimizer] { optimizer.step(); };
  h.moments = [&optimizer, shared](size_t i) { return optim::moments_of(optimizer, shared->at(i)); };
  h.reset_moments = [&optimizer, shared](size_t i) { return optim::reset_moments(optimizer, shared->at(i)); };
  return h;
}

GuardedStep::GuardedStep(const GuardedStepOptions& options, std::vector<at::Tensor> params,
                         std::vector<std::string> names, StepHooks hooks)
    : options_((options.validate(), options)),
      params_(std::move(params)),
      names_(std::move(names)),
      hooks_(std::move(hooks)),
      scaler_(options_.scaler, amp::resolve_scaler_mode(options_.scaler, options_.amp_dtype)),
      stats_(params_, names_),
      clipper_(options_.clip, params_, names_),
      detector_(options_.guard, stats_.groups().names, resolved_warmup(options_)),
      ladder_(options_.guard.recovery),
      noise_(options_.guard.noise_scale.ema),
      skip_rule_(options_.guard.skip_rule.sigma, options_.guard.skip_rule.window) {}

void GuardedStep::use_sharded_gradients(grad::ShardedGradients sharded) {
  clipper_.use_gradients(sharded.parts);
  stats_.use_sharded(std::move(sharded));
}

StepOutcome GuardedStep::step(int64_t step, const StepInputs& in) {
  TORCH_CHECK(in.loss.defined(), "GuardedStep::step: inputs.loss is required");
  StepOutcome out;
  out.step = step;
  out.lr = in.lr;
  out.injected = in.injected;
  out.loss_scale = scaler_.scale();

  // The side values in one float tensor (side_layout.h), each slot present when given,
  // read back with the gradient norms.
  using Slot = SideLayout::Slot;
  const bool noise_sample = in.noise_sq_norm.defined() && options_.guard.noise_scale.every > 0;
  SideLayout layout;
  layout.set(Slot::kLoss, 1)
      .set(Slot::kMicroLosses, in.micro_losses.defined() ? in.micro_losses.numel() : 0)
      .set(Slot::kNoiseSqNorm, noise_sample ? 1 : 0)
      .set(Slot::kStopRequest, in.stop_request.defined() ? 1 : 0)
      .set(Slot::kZLoss, in.z_loss.defined() ? 1 : 0);
  at::Tensor side;
  {
    torch::NoGradGuard no_grad;
    side = layout.zeros(in.loss.device());
    auto put = [&](Slot slot, const at::Tensor& t) {
      if (layout.has(slot)) layout.of(side, slot).copy_(t.detach().reshape({-1}));
    };
    put(Slot::kLoss, in.loss);
    put(Slot::kMicroLosses, in.micro_losses);
    put(Slot::kNoiseSqNorm, in.noise_sq_norm);
    put(Slot::kStopRequest, in.stop_request);
    put(Slot::kZLoss, in.z_loss);
  }
  out.stats = stats_.sharded()  // the one host read (with sharded gradients after their one collective)
                  ? stats_.compute(scaler_.inv_scale(), side, {}, clipper_.row_clip())
                  : stats_.compute(scaler_.inv_scale(), side, clipper_.device_hook());
  const auto& values = out.stats.side;
  out.loss = layout.value(values, Slot::kLoss);
  out.micro_losses = layout.values(values, Slot::kMicroLosses);
  if (layout.has(Slot::kStopRequest)) out.stop_requested = layout.value(values, Slot::kStopRequest) > 0;
  if (layout.has(Slot::kZLoss)) out.z_loss = layout.value(values, Slot::kZLoss);

  out.clip = clipper_.apply(out.stats);
  out.scaler = scaler_.update(out.stats.nonfinite);
  if (out.scaler.grew) last_scale_growth_ = step;

  if (noise_sample && !out.stats.nonfinite && in.noise_share > 0) {
    // The sampled gradient is that micro-batch's mean gradient times its token share and
    // the loss scale: undo both.
    const double unscale = 1.0 / (in.noise_share * out.loss_scale);
    const double small_sq = layout.value(values, Slot::kNoiseSqNorm) * unscale * unscale;
    out.noise_scale = noise_.update(small_sq, in.noise_micro_batch, out.clip.grad_norm * out.clip.grad_norm,
                                    in.noise_global_batch);
    const auto& ns = options_.guard.noise_scale;
    if (!noise_warned_ && ns.warn_ratio > 0 && noise_.count() >= ns.warn_after && out.noise_scale > 0 &&
        in.noise_global_batch > ns.warn_ratio * out.noise_scale) {
      noise_warned_ = true;
      out.noise_warning = true;
    }
  }

  if (options_.guard.enabled) {
    StepObservation obs;
    obs.step = step;
    obs.loss = out.loss;
    obs.grad_norm = out.clip.grad_norm;
    // The explosion rule compares the global norm with a global-norm threshold; AGC's
    // (a ratio) and the per-layer one are not, so those runs use the recent mean.
    obs.clip_threshold = out.clip.threshold_is_global ? out.clip.threshold : std::numeric_limits<double>::infinity();
    obs.update_bounded = out.clip.update_bounded;
    obs.layer_norms = out.stats.layer_norms;
    obs.scaler_dynamic = scaler_.mode() == amp::ScalerMode::kDynamic;
    obs.scaler_backed_off = out.scaler.backed_off;
    obs.scaler_stuck = out.scaler.stuck;
    out.verdict = detector_.observe(obs);
  } else if (out.scaler.stuck) {
    out.halt = true;
    out.halt_message = "step " + std::to_string(step) + ": gradients overflow even at the minimum loss scale " +
                       format_number(options_.scaler.min_scale) + "; training cannot make progress";
  }

  const auto now = std::chrono::steady_clock::now();
  out.step_seconds = last_end_ ? std::chrono::duration<double>(now - *last_end_).count() : 0.0;
  recent_norms_.push_back(out.clip.grad_norm);
  recent_seconds_.push_back(out.step_seconds);
  while (recent_norms_.size() > kRecent) recent_norms_.pop_front(), recent_seconds_.pop_front();

  if (out.verdict.critical()) {
    const Anomaly* primary = out.verdict.primary();
    const bool can_roll_back = hooks_.rollback_available && hooks_.rollback_available();
    out.recovery = ladder_.decide(step, primary->kind, can_roll_back);
    const RecoveryAction action = out.recovery->action;
    if (hooks_.snapshot) out.snapshot = hooks_.snapshot(*this, out, action == RecoveryAction::kHalt);
    else out.snapshot.skipped = "no snapshot writer";
    if (action == RecoveryAction::kResetMoments && hooks_.reset_moments) {
      // The tensors of the layers the anomaly names; all of them when it names none.
      const auto& groups = stats_.groups();
      for (size_t i = 0; i < params_.size(); ++i) {
        const auto& layer = groups.names[groups.group_of[i]];
        if (!primary->layers.empty() &&
            std::find(primary->layers.begin(), primary->layers.end(), layer) == primary->layers.end())
          continue;
        out.tensors_reset += hooks_.reset_moments(i) ? 1 : 0;
      }
    }
    if (action == RecoveryAction::kHalt) {
      out.halt = true;
      out.halt_message = "step " + std::to_string(step) + ": " + name_of(primary->kind) + " (" + primary->message +
                         "); the recovery ladder is spent" +
                         (out.recovery->note.empty() ? "" : " (" + out.recovery->note + ")") + ". Snapshot: " +
                         (out.snapshot.dir.empty() ? "none (" + out.snapshot.skipped + ")" : out.snapshot.dir);
    }
  }

  // The skip rule judges every step on the values already on the host (no sync), apart
  // from the detector and the ladder: it drops an outlier step and nothing more.
  out.skip_rule = skip_rule_.observe(out.loss, out.clip.grad_norm);
  out.applied = !out.scaler.skipped && !out.verdict.critical() && !out.halt && !out.skip_rule.skip;
  if (out.applied && hooks_.optimizer_step) hooks_.optimizer_step();
  detector_.record_outcome(out.applied);
  last_end_ = std::chrono::steady_clock::now();
  return out;
}

amp::AmpDtype GuardedStep::compute_dtype(int64_t step, amp::AmpDtype configured) const {
  amp::AmpDtype d = configured;
  for (int64_t level = ladder_.precision_level(step); level > 0; --level)
    d = d == amp::AmpDtype::kFp16 ? amp::AmpDtype::kBf16 : amp::AmpDtype::kFp32;
  return d;
}

nlohmann::json GuardedStep::state_dict() const {
  return {{"scaler", scaler_.state_dict()},
          {"clipper", clipper_.state_dict()},
          {"last_scale_growth", last_scale_growth_},
          {"guard",
           {{"detector", detector_.state_dict()},
            {"recovery", ladder_.state_dict()},
            {"noise_scale", noise_.state_dict()},
            {"skip_rule", skip_rule_.state_dict()}}}};
}

void GuardedStep::load_state_dict(const nlohmann::json& state, RestoreScope scope, const std::string& where) {
  // The whole state is checked on a scratch copy first, so a bad field anywhere leaves
  // this step exactly as it was.
  GuardedStep scratch(options_, params_, names_);
  scratch.apply_state(state, scope, where);
  apply_state(state, scope, where);
}

void GuardedStep::apply_state(const nlohmann::json& state, RestoreScope scope, const std::string& where) {
  const JsonReader r(state, where);
  scaler_.load_state_dict(r.raw("scaler"), where + " (scaler)");
  clipper_.load_state_dict(r.raw("clipper"), where);
  // The detector's windows describe the weights, so they go back with them on a
  // rollback too; the budgets spent, the noise estimate and the scale's history only on
  // a resume. A state from before the guard existed has no "guard": start it fresh.
  if (!r.has("guard")) return;
  const JsonReader g = r.object("guard");
  detector_.load_state_dict(g.raw("detector"), where);
  if (g.has("skip_rule")) skip_rule_.load_state_dict(g.raw("skip_rule"), where);  // absent before the rule existed
  if (scope != RestoreScope::kResume) return;
  ladder_.load_state_dict(g.raw("recovery"), where);
  noise_.load_state_dict(g.raw("noise_scale"), where);
  last_scale_growth_ = r.has("last_scale_growth") ? r.integer("last_scale_growth", -1) : -1;
}

}  // namespace gradguard::guard
