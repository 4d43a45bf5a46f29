// The anomaly detector: host-side rules over the numbers the fused gradient statistics
// already brought back (loss, global and per-layer norms, the scaler's decision), so it
// adds no device work and no host sync to a step.
//
// Rules (each a kind of anomaly):
//   nonfinite         the loss or the gradients hold inf/NaN and no dynamic loss scaler
//                     is there to absorb it (with one, an overflow is routine: a skip)
//   loss_scale_stuck  the dynamic scaler keeps overflowing at its floor
//   grad_norm         grad_norm > grad_norm_factor x the clip threshold (the mean of
//                     the recent healthy norms when nothing clips). When clipping bounds
//                     the update, one such step is a warning -- the clipped update is
//                     usually the best way out, and skipping it can leave the model where
//                     it was -- and grad_norm_patience of them in a row are critical;
//                     without a bound it is critical at once
//   loss_spike        z = (loss - expected) / max(std, 1% of the mean) exceeds
//                     loss_zscore, where expected and std come from a linear trend fit
//                     to the last loss_window healthy losses (the loss falls steadily
//                     early on; a plain mean would lag and count the fall as spread)
//   layer_outlier     a layer's log-norm z-score against its own EMA exceeds
//                     layer_zscore (a warning on its own; it names the layers, first
//                     to jump first, in every critical verdict)
//   backoff_storm     backoff_limit loss-scale backoffs within backoff_window steps
//   skip_streak       skip_streak skipped steps in a row
// Beside the rules, each step's global and per-layer norms are judged against their
// forecast (forecast.h): Verdict::forecast and forecast_layers, logged, never acted on.
// The loss and per-layer rules wait for the warmup (the loss falls fastest there) and
// for a seeded window. Statistics only absorb healthy steps (and a layer's EMA not its
// outlying values, until they persist for ten steps and become its new level), so a
// spike cannot raise the bar for the next one. The scaler rules wait for the first applied step, so the
// initial scale search of fp16 training is not an anomaly. A rule that fired clears its
// own counter, so one storm is one anomaly.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/guard/forecast.h"
#include "gradguard/guard/guard_options.h"

namespace gradguard::guard {

// What one step looked like, all on the host already.
struct StepObservation {
  int64_t step = 0;
  double loss = 0;                  // global-batch mean loss (may be inf/NaN)
  double grad_norm = 0;             // unscaled, before clipping (may be inf/NaN)
  double clip_threshold = 0;        // global-norm threshold of the clipping strategy; inf when there is none
  bool update_bounded = false;      // clipping bounds this step's update (global, history, zscore, layerwise, agc)
  std::vector<double> layer_norms;  // [layer group] unscaled L2 norms
  bool scaler_dynamic = false;      // a dynamic loss scaler handles overflows
  bool scaler_backed_off = false;   // the scaler reduced its scale after this step
  bool scaler_stuck = false;        // the scaler overflowed at its floor too often
};

struct Anomaly {
  AnomalyKind kind = AnomalyKind::kNonfinite;
  Severity severity = Severity::kWarning;
  std::string message;   // one line with the numbers that triggered it
  std::vector<std::pair<std::string, double>> numbers;  // the triggering numbers by name
  std::vector<std::string> layers;  // layers involved, the first to jump first
};

struct Verdict {
  std::vector<Anomaly> anomalies;
  // The gradient norm against its forecast (forecast.h), and the layer groups whose norm
  // is above their own band: observations, not anomalies.
  Forecast forecast;
  std::vector<std::string> forecast_layers;
  bool critical() const;                 // some anomaly is critical: recovery must act
  const Anomaly* primary() const;        // the first critical anomaly (else the first); nullptr when none
};

// Anomaly as a metrics.jsonl event line: {"step", "event": "anomaly", "kind", "severity", ...numbers, "layers", "message"}.
nlohmann::ordered_json to_event(int64_t step, const Anomaly& anomaly);

// The detector's memory of recent healthy steps, and the counters its rules keep. One
// struct, so that state_dict() is one table and each rule sees what it reads.
struct DetectorWindows {
  std::deque<double> losses;                  // [last loss_window healthy steps]
  std::deque<double> norms;                   // [last loss_window healthy steps] global norms
  std::vector<double> layer_mean, layer_var;  // [layer group] EMA of log norm and its variance
  std::vector<int64_t> layer_since;           // [layer group] step the layer became an outlier; -1 = normal
  int64_t layer_count = 0;                    // healthy steps absorbed by the layer EMAs
  std::deque<int64_t> backoffs;               // steps of recent scaler backoffs (backoff_storm's)
  int64_t skip_run = 0;                       // skipped steps in a row (skip_streak's)
  int64_t explode_run = 0;                    // steps in a row above the grad-norm limit (grad_norm's)
  bool applied_once = false;                  // some update has been applied
  NormForecaster norm_forecast;               // the global norm's (forecast.h)
  std::vector<NormForecaster> layer_forecasts;  // [layer group]
};

// What every rule is told about the step besides the observation: the per-layer scan,
// which runs first because every critical anomaly names the outlying layers.
struct RuleContext {
  const GuardOptions& options;
  const std::vector<std::string>& layer_names;  // [layer group]
  int64_t warmup = 0;
  std::vector<size_t> outliers;              // layer groups out of their normal range, first to jump first
  std::vector<std::string> outlier_names;    // their names, in that order
  std::vector<size_t> nonfinite_layers;      // layer groups with a non-finite norm
  std::vector<double> layer_z;               // [layer group] log-norm z-score (inf when non-finite)
  size_t found = 0;                          // anomalies the rules before this one found
};

// A rule: judges one step, may update its own counter in the windows (and nothing else),
// returns the anomaly it found. observe() runs kDetectorRules in order; a new rule is one
// more function and one more entry there.
using DetectorRule = std::optional<Anomaly> (*)(const StepObservation& obs, const RuleContext& ctx,
                                                DetectorWindows& w);

class AnomalyDetector {
 public:
  // `layer_names` ([layer group]) label the per-layer norms; `warmup` is the resolved
  // guard.warmup (steps).
  AnomalyDetector(const GuardOptions& options, std::vector<std::string> layer_names, int64_t warmup);

  // Judges one step and updates the statistics with it if it was healthy. Pure host
  // arithmetic.
  Verdict observe(const StepObservation& obs);

  // Tells the detector whether the step's update was applied (for skip streaks and to
  // arm the scaler rules). Call after acting on the verdict.
  void record_outcome(bool applied);

  // Normal level of layer k: exp(EMA of log norm); 0 before any healthy step.
  double layer_typical(size_t k) const;
  double loss_mean() const;  // mean of the loss window (NaN when empty)
  double loss_std() const;   // standard deviation of the loss window (NaN with < 2 entries)
  const std::vector<std::string>& layer_names() const { return layer_names_; }

  nlohmann::json state_dict() const;
  nlohmann::json forecast_state() const;  // the "forecast" entry of state_dict()
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "detector state");

 private:
  RuleContext scan_layers(const StepObservation& obs);  // updates w_.layer_since
  void absorb(const StepObservation& obs);              // a healthy step into the windows

  GuardOptions options_;
  std::vector<std::string> layer_names_;
  int64_t warmup_;
  DetectorWindows w_;
};

}  // namespace gradguard::guard
