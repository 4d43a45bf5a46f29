// See guarded_step.h.
#include "gradguard/train/guarded_step.h"

#include <torch/optim/optimizer.h>

namespace gradguard::train {

GuardedUpdate guarded_update(int64_t step, double loss_scale, const std::vector<at::Tensor>& extras,
                             grad::GradStatsComputer& stats, grad::Clipper& clipper, amp::LossScaler& scaler,
                             guard::AnomalyDetector& detector, torch::optim::Optimizer& optimizer) {
  GuardedUpdate out;
  out.stats = stats.compute(1.0 / loss_scale, extras, clipper.device_hook());  // the one host sync
  out.clip = clipper.apply(out.stats);
  out.scaler = scaler.update(out.stats.nonfinite);
  guard::StepObservation obs;
  obs.step = step;
  obs.loss = out.stats.extras.at(0);
  obs.grad_norm = out.clip.grad_norm;
  obs.clip_threshold = out.clip.threshold;
  obs.update_bounded = true;
  obs.layer_norms = out.stats.layer_norms;
  obs.scaler_dynamic = scaler.mode() == "dynamic";
  obs.scaler_backed_off = out.scaler.backed_off;
  out.verdict = detector.observe(obs);
  out.applied = !out.scaler.skipped && !out.verdict.critical();
  if (out.applied) optimizer.step();
  detector.record_outcome(out.applied);
  return out;
}

}  // namespace gradguard::train
