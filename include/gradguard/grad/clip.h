// Gradient clipping strategies, applied after the fused statistics with no further host
// sync: every decision is made on the host from GradStats, then the gradients are scaled
// on the device. Strategies (clip.strategy):
//   none      measure only.
//   global    PyTorch's clip_grad_norm_: coef = min(1, max_norm / (norm + 1e-6)), in
//             float32 arithmetic exactly as torch computes it.
//   history   the classic dynamic threshold: min(max_norm, factor x mean of the last W
//             norms), the window holding clipped norms so a spike cannot raise it.
//   layerwise each layer group (see grad_stats.h) clipped to max_norm on its own.
//   agc       adaptive gradient clipping (Brock et al. 2021): every row (output unit) of
//             every matrix except lm_head obeys ||G_i|| <= lambda * max(||W_i||, eps);
//             runs on the device inside the statistics pass, so it is measured in the
//             same single copy.
//   zscore    ZClip-style: EMA mean and variance of the global norm; after a warmup
//             (during which max_norm applies) a norm whose z-score exceeds z is clipped
//             to mean + z * std; the EMA is fed the clipped norm.
// Every step reports the norm, the threshold used and the coefficient applied.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json.hpp>

#include "gradguard/grad/grad_stats.h"

namespace gradguard::grad {

struct ClipOptions {
  std::string strategy = "global";  // none | global | history | layerwise | agc | zscore
  double max_norm = 1.0;            // global/layerwise threshold, history cap, zscore warmup threshold; > 0
  bool error_if_nonfinite = false;  // true: a non-finite gradient halts the run (exit 3) instead of skipping the step
  int64_t history_window = 10;      // history: W, norms averaged; >= 1
  double history_factor = 0.8;      // history: threshold = min(max_norm, factor * mean); > 0
  double agc_lambda = 0.01;         // agc: allowed ||G_row|| / max(||W_row||, eps); > 0
  double agc_eps = 1e-3;            // agc: floor on the weight-row norm; > 0
  double zscore_threshold = 2.5;    // zscore: z above which a norm is clipped; > 0
  double zscore_alpha = 0.97;       // zscore: EMA decay of mean and variance, in (0, 1)
  int64_t zscore_warmup = 25;       // zscore: steps that seed the mean/variance; >= 2
  void validate() const;            // throws gradguard::Error naming clip.<key>
};

struct ClipResult {
  double grad_norm = 0;   // global L2 norm before clipping
  double clip_coef = 1;   // global norm after / before (1 = untouched)
  double threshold = 0;   // threshold used this step (inf for none; agc: lambda)
};

class Clipper {
 public:
  // `params` and `names` are parallel ([tensor]); names pick AGC's matrices and the
  // layer groups.
  Clipper(const ClipOptions& options, std::vector<at::Tensor> params, const std::vector<std::string>& names);

  // The on-device hook to pass to GradStatsComputer::compute (empty unless agc).
  DeviceClipHook device_hook() const;

  // Decides and applies the clip for this step's statistics; no host sync. Non-finite
  // statistics leave the gradients alone (the step is skipped) and the history
  // untouched, or throw gradguard::Error (kHalted) with error_if_nonfinite.
  ClipResult apply(const GradStats& stats);

  nlohmann::json state_dict() const;            // history window / EMA state
  void load_state_dict(const nlohmann::json&);  // throws gradguard::Error (bad input)

 private:
  void scale_all(double coef);

  ClipOptions options_;
  std::vector<at::Tensor> params_;
  LayerGroups groups_;
  std::vector<at::Tensor> agc_params_;  // matrices AGC clips row-wise
  std::deque<double> history_;          // [last W steps] clipped global norms
  int64_t z_count_ = 0;                 // zscore: finite steps seen
  std::vector<double> z_seed_;          // zscore: warmup norms
  double z_mean_ = 0, z_var_ = 0;       // zscore: EMA state
};

// PyTorch's clip coefficient in float32 arithmetic: min(1, fl(fl(1 / fl(norm + 1e-6)) * max_norm)).
double torch_clip_coef(double norm, double max_norm);

}  // namespace gradguard::grad
