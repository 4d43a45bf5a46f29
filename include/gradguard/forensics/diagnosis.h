// The diagnosis written into every snapshot: what happened at the anomalous step and a
// ranked list of likely causes, each with the evidence behind it. Causes considered:
//   injected        the step carried a fault injected on purpose (guard.inject)
//   data            one micro-batch's loss stands far above the others', or the loss
//                   spiked without a gradient explosion: the batch itself is unusual
//   adam_epsilon    the layers involved have tiny Adam second moments (sqrt(v_hat) near
//                   eps), so this gradient would produce an update many times the usual
//                   size: the classic epsilon-driven blow-up
//   loss_scale      the dynamic loss scale grew shortly before an overflow, or overflows
//                   persist at its floor (fp16's range is exceeded)
//   numerics        non-finite values appeared inside particular layers
//   learning_rate   the learning rate is at or near its peak and the gradient norm has
//                   been climbing for several steps
//   hardware        the telemetry shows heat, throttling, a clock drop or a stalled step
// Scores are heuristics in [0, 1] ordering the list, not probabilities; the evidence is
// the part to read. Replay (replay.h) separates data/numerics from non-determinism.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "gradguard/amp/loss_scaler.h"
#include "gradguard/guard/detector.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/telemetry/telemetry.h"

namespace gradguard::forensics {

// Adam-family evidence for one layer (NaN fields when the optimizer keeps no second
// moments, e.g. LARS, or before the first update).
struct LayerEvidence {
  std::string layer;
  double norm = 0;               // this step's gradient norm of the layer
  double typical = 0;            // its normal level (detector EMA)
  double sqrt_v_rms = 0;         // RMS of sqrt(v_hat), the bias-corrected second moment
  double tiny_v_fraction = 0;    // share of elements with sqrt(v_hat) < 10 eps
  double update_rms = 0;         // RMS of the Adam update this gradient would produce (in lr units)
  double previous_update_rms = 0;// RMS of m_hat / (sqrt(v_hat) + eps) before this gradient
};

// Computes LayerEvidence for the tensors of `layer` (indices into params/grads) from the
// optimizer's live state, read through `moments` (tensor index -> its state; empty: no
// state); reads the gradients as they are now. Syncs (diagnosis only).
LayerEvidence layer_evidence(const std::function<optim::ParamMoments(size_t)>& moments, const std::string& layer,
                             const std::vector<at::Tensor>& params, const std::vector<size_t>& tensors,
                             double beta1, double beta2, double eps, double norm, double typical);

struct DiagnosisInput {
  int64_t step = 0;
  double unix_time = std::numeric_limits<double>::quiet_NaN();  // wall-clock time of the step (s since 1970)
  std::vector<guard::Anomaly> anomalies;
  std::string injected;              // fault injected at this step ("" = none)
  double loss = 0, loss_mean = 0, loss_std = 0;
  double grad_norm = 0, clip_threshold = 0, grad_norm_factor = 10;
  double lr = 0, peak_lr = 0;
  int64_t warmup_steps = 0;
  std::vector<double> micro_losses;  // [micro-batch] mean token loss of each
  std::vector<LayerEvidence> layers; // the layers involved
  amp::ScalerMode scaler_mode = amp::ScalerMode::kOff;
  double loss_scale = 1;
  int64_t last_scale_growth = -1;    // step the loss scale last grew; -1 = never
  std::vector<double> recent_grad_norms;    // [recent steps, oldest first]
  std::vector<double> recent_step_seconds;  // [recent steps, oldest first], this step last
  std::vector<telemetry::Sample> telemetry; // the sampler's window
};

struct Cause {
  std::string id;      // injected | data | adam_epsilon | loss_scale | numerics | learning_rate | hardware | unknown
  std::string title;   // one line
  double score = 0;    // ordering heuristic in [0, 1]
  std::vector<std::string> evidence;
  std::string suggestion;
};

struct Diagnosis {
  std::vector<Cause> causes;  // most likely first
  nlohmann::ordered_json to_json(const DiagnosisInput& input) const;
  std::string to_markdown(const DiagnosisInput& input, const std::string& title) const;
};

Diagnosis diagnose(const DiagnosisInput& input);

}  // namespace gradguard::forensics
