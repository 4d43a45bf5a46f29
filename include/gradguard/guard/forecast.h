// Gradient-norm forecasting: what the next step's norm should be, from the trend of the
// recent ones, with a band. A norm outside its band is a `forecast_breach`: an
// observation in metrics.jsonl and the report, measured as a precursor by `bench natural`
// (docs/guard.md has the lead times and false alarms). It is no anomaly: nothing acts
// on it.
//
// The forecaster is Holt's double exponential smoothing (level and trend) of log(norm),
// made robust in the manner of Gelper, Fried & Croux (2010, "Robust forecasting with
// exponential and Holt-Winters smoothing"): each new value enters the level clipped to
// within kClip scale units of its forecast (a Huber step), so one spike moves the level
// by a bounded amount and a lasting shift is followed in a few steps; the scale is an
// EWMA of the squared one-step residuals, also clipped. In log space the band is
// multiplicative:
//   forecast  f = level + trend,   scale s = max(sqrt(EWMA r^2), kScaleFloor)
//   expected  exp(f),   band  [exp(f - z s), exp(f + z s)],   z = guard.forecast_zscore
// The first kWarmup values seed the level, trend and scale (no band before).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::guard {

struct Forecast {
  bool ready = false;  // seeded: the numbers below exist
  double expected = std::numeric_limits<double>::quiet_NaN();
  double low = std::numeric_limits<double>::quiet_NaN(), high = std::numeric_limits<double>::quiet_NaN();
  int breach = 0;      // +1 above the band, -1 below, 0 inside (or not ready)
};

class NormForecaster {
 public:
  static constexpr double kAlpha = 0.3;        // level smoothing
  static constexpr double kBeta = 0.1;         // trend smoothing
  static constexpr double kScaleAlpha = 0.1;   // EWMA weight of the squared residual
  static constexpr double kClip = 2.0;         // Huber clip, in scale units
  static constexpr double kScaleFloor = 0.05;  // a 5% wobble is one scale unit
  static constexpr int64_t kWarmup = 5;        // values before the first band

  explicit NormForecaster(double zscore = 4) : zscore_(zscore) {}

  // The forecast for the next value (ready once kWarmup values were absorbed).
  Forecast predict() const;
  // Where `norm` lies against predict(); does not learn from it.
  Forecast judge(double norm) const;
  // Learns from a finite norm > 0 (others are ignored).
  void absorb(double norm);

  int64_t count() const { return count_; }
  nlohmann::json state_dict() const;
  // Checks every field before changing anything; throws gradguard::Error (bad input)
  // naming `where` and `path`.
  void load_state_dict(const nlohmann::json& state, const std::string& where, const std::string& path);

 private:
  double scale() const;
  double zscore_;
  double level_ = 0, trend_ = 0, var_ = 0;  // log space
  int64_t count_ = 0;
};

}  // namespace gradguard::guard
