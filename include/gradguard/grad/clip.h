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
//   adagc     AdaGC (Wang et al. 2025, arXiv 2502.11034): per tensor i, after a warmup
//             of global clipping at max_norm during which gamma_i takes the running
//             minimum of the clipped norms, h_i = min(1, lambda gamma_i / ||g_i||),
//             g_i <- h_i g_i, gamma_i <- beta gamma_i + (1 - beta) ||h_i g_i||: each
//             tensor bounded by an EMA of its own past (clipped) norms.
// Every step reports the norm, the threshold used and the coefficient applied.
#pragma once

#include <array>
#include <deque>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/choice.h"
#include "gradguard/grad/grad_stats.h"

namespace gradguard::grad {

enum class ClipStrategy { kNone, kGlobal, kHistory, kLayerwise, kAgc, kZscore, kAdagc };
constexpr std::array<Choice<ClipStrategy>, 7> choices(ClipStrategy) {
  return {{{ClipStrategy::kNone, "none"},
           {ClipStrategy::kGlobal, "global"},
           {ClipStrategy::kHistory, "history"},
           {ClipStrategy::kLayerwise, "layerwise"},
           {ClipStrategy::kAgc, "agc"},
           {ClipStrategy::kZscore, "zscore"},
           {ClipStrategy::kAdagc, "adagc"}}};
}

struct ClipOptions {
  ClipStrategy strategy = ClipStrategy::kGlobal;
  double max_norm = 1.0;
  bool error_if_nonfinite = false;
  int64_t history_window = 10;
  double history_factor = 0.8;
  double agc_lambda = 0.01;
  double agc_eps = 1e-3;
  double zscore_threshold = 2.5;
  double zscore_alpha = 0.97;
  int64_t zscore_warmup = 25;
  double adagc_lambda = 1.05;
  double adagc_beta = 0.98;
  int64_t adagc_warmup = 100;
  void validate() const;  // throws gradguard::Error naming clip.<key>

  template <class Field>
  void fields(Field&& field) {
    field("strategy", strategy,
          "how the update is bounded: none (measure only) | global (clip_grad_norm_) | history (factor x recent "
          "mean) | layerwise (each layer to max_norm) | agc (each weight row to agc_lambda x its norm) | zscore "
          "(norms far above their EMA) | adagc (each tensor to adagc_lambda x an EMA of its own clipped norms)");
    field("max_norm", max_norm,
          "L2 threshold of global and layerwise, cap of history, threshold of zscore during its warmup; > 0");
    field("error_if_nonfinite", error_if_nonfinite,
          "true: inf/NaN gradients halt the run (exit 3); false: the step is skipped");
    field("history_window", history_window, "history: W, the recent clipped norms averaged (steps); >= 1");
    field("history_factor", history_factor, "history: threshold = min(max_norm, factor x mean of the window); > 0");
    field("agc_lambda", agc_lambda,
          "agc: every row of every matrix but lm_head keeps ||G_row|| <= lambda x max(||W_row||, agc_eps); > 0");
    field("agc_eps", agc_eps, "agc: floor of the weight-row norm, so zero-initialised rows can move; > 0");
    field("zscore_threshold", zscore_threshold,
          "zscore: a norm more than this many standard deviations above the EMA mean is clipped to mean + z x std; > 0");
    field("zscore_alpha", zscore_alpha, "zscore: EMA decay of the norm's mean and variance; in (0, 1)");
    field("zscore_warmup", zscore_warmup, "zscore: steps that seed the mean and variance (max_norm applies); >= 2");
    field("adagc_lambda", adagc_lambda,
          "adagc: a tensor's gradient norm is held to lambda x the EMA of its past clipped norms; >= 1");
    field("adagc_beta", adagc_beta, "adagc: EMA decay of each tensor's clipped norm; in [0, 1)");
    field("adagc_warmup", adagc_warmup,
          "adagc: first steps clipped globally at max_norm while each tensor's EMA starts at the smallest clipped "
          "norm seen; >= 0");
  }
};

struct ClipResult {
  double grad_norm = 0;   // global L2 norm before clipping
  double clip_coef = 1;   // global norm after / before (1 = untouched)
  double threshold = 0;   // threshold used this step (inf for none; agc: lambda, a ratio)
  // `threshold` bounds the global norm (global, history, zscore), so a norm far above it
  // is an explosion; agc's ratio and layerwise's per-layer bound are not.
  bool threshold_is_global = false;
  bool update_bounded = false;  // clipping bounds this step's update (every strategy but none)
};

class Clipper {
 public:
  // `params` and `names` are parallel ([tensor]); names pick AGC's matrices and the
  // layer groups.
  Clipper(const ClipOptions& options, std::vector<at::Tensor> params, const std::vector<std::string>& names);

  // Scale `grads` [tensor] from now on instead of the parameters' .grad: each rank's part
  // of a sharded gradient (grad_stats.h's ShardedGradients).
  void use_gradients(std::vector<at::Tensor> grads);

  // The on-device hook to pass to GradStatsComputer::compute (empty unless agc).
  DeviceClipHook device_hook() const;
  // The same rule for sharded gradients (null unless agc).
  const RowClipRule* row_clip() const { return options_.strategy == ClipStrategy::kAgc ? &row_rule_ : nullptr; }

  // Decides and applies the clip for this step's statistics; no host sync. Non-finite
  // statistics leave the gradients alone (the step is skipped) and the history
  // untouched, or throw gradguard::Error (kHalted) with error_if_nonfinite.
  ClipResult apply(const GradStats& stats);
  const std::vector<double>& adagc_gamma() const { return ada_gamma_; }

  nlohmann::json state_dict() const;            // history window / EMA state
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "clipper state");

 private:
  at::Tensor grad_of(size_t i) const { return grads_.empty() ? params_[i].grad() : grads_[i]; }
  void scale_all(double coef);
  void scale_each(const std::vector<double>& coef);  // [tensor] factors; those < 1 applied
  void apply_adagc(const GradStats& stats, ClipResult* r);

  ClipOptions options_;
  std::vector<at::Tensor> params_;
  LayerGroups groups_;
  std::vector<at::Tensor> grads_;       // [tensor] sharded parts replacing .grad (empty: .grad)
  std::vector<at::Tensor> agc_params_;  // matrices AGC clips row-wise
  RowClipRule row_rule_;                // the same, for sharded gradients
  std::deque<double> history_;          // [last W steps] clipped global norms
  int64_t z_count_ = 0;                 // zscore: finite steps seen
  std::vector<double> z_seed_;          // zscore: warmup norms
  double z_mean_ = 0, z_var_ = 0;       // zscore: EMA state
  int64_t ada_count_ = 0;               // adagc: finite steps seen
  std::vector<double> ada_gamma_;       // adagc: [tensor] EMA of the clipped norm; NaN = none seen yet
};

// PyTorch's clip coefficient in float32 arithmetic: min(1, fl(fl(1 / fl(norm + 1e-6)) * max_norm)).
double torch_clip_coef(double norm, double max_norm);

}  // namespace gradguard::grad
