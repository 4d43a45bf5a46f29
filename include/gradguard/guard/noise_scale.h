// Online estimate of the gradient noise scale, the batch size past which larger batches
// stop buying proportionally faster progress (McCandlish et al. 2018, "An Empirical
// Model of Large-Batch Training", appendix A.1). With the squared norms of a gradient
// averaged over a small batch (B_small samples) and over the big batch (B_big) of the
// same step, unbiased estimates of the true gradient's squared norm and of the trace of
// the per-sample covariance are
//   |G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//   tr(S) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
// and B_simple = tr(S) / |G|^2. Each estimate is noisy, so both are smoothed with an
// EMA and the ratio is taken of the smoothed values (the paper's recommendation). The
// training loop already has both norms: the accumulated gradient after the first
// micro-batch (B_small = micro_batch) and after the whole window (B_big = global batch).
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::guard {

class NoiseScaleEstimator {
 public:
  explicit NoiseScaleEstimator(double ema = 0.95);

  // One measurement: squared L2 norms of the mean gradient over b_small and b_big
  // samples (b_small < b_big). Non-finite inputs are ignored. Returns the current
  // B_simple (NaN until the smoothed |G|^2 is positive).
  double update(double small_sq_norm, double b_small, double big_sq_norm, double b_big);

  double b_simple() const;       // smoothed tr(S) / smoothed |G|^2, in samples; NaN if unknown
  double grad_sq() const;        // smoothed |G|^2 estimate (bias-corrected EMA)
  double trace_cov() const;      // smoothed tr(S) estimate (bias-corrected EMA)
  int64_t count() const { return count_; }

  nlohmann::json state_dict() const;
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "noise-scale state");

 private:
  double ema_;
  double g2_ = 0, s_ = 0;  // EMA accumulators (debiased by 1 - ema^count)
  int64_t count_ = 0;
};

}  // namespace gradguard::guard
