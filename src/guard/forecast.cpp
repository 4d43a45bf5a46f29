// Holt's smoothing of log(norm) with clipped updates (forecast.h).
#include "gradguard/guard/forecast.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "gradguard/core/json_read.h"

namespace gradguard::guard {

double NormForecaster::scale() const { return std::max(std::sqrt(var_), kScaleFloor); }

Forecast NormForecaster::predict() const {
  Forecast f;
  if (count_ < kWarmup || !(zscore_ > 0)) return f;
  const double center = level_ + trend_, width = zscore_ * scale();
  f.ready = true;
  f.expected = std::exp(center);
  f.low = std::exp(center - width);
  f.high = std::exp(center + width);
  return f;
}

Forecast NormForecaster::judge(double norm) const {
  Forecast f = predict();
  if (!f.ready || std::isnan(norm)) return f;
  f.breach = norm > f.high ? 1 : (norm < f.low ? -1 : 0);
  return f;
}

void NormForecaster::absorb(double norm) {
  if (!std::isfinite(norm) || !(norm > 0)) return;
  const double y = std::log(norm);
  if (count_ == 0) {
    level_ = y;
  } else if (count_ == 1) {
    trend_ = y - level_;
    level_ = y;
  } else {
    // Seeding: the scale is the plain mean of the residuals so far, then an EWMA; the
    // value is clipped only once the scale has something to go on.
    const double forecast = level_ + trend_, r = y - forecast;
    const bool seeded = count_ >= kWarmup;
    const double bound = kClip * scale();
    const double kept = seeded ? std::clamp(r, -bound, bound) : r;
    const double a = std::max(kScaleAlpha, 1.0 / static_cast<double>(count_ - 1));
    var_ = (1 - a) * var_ + a * (seeded ? std::min(r * r, bound * bound) : r * r);
    const double level = kAlpha * (forecast + kept) + (1 - kAlpha) * forecast;
    trend_ = kBeta * (level - level_) + (1 - kBeta) * trend_;
    level_ = level;
  }
  ++count_;
}

nlohmann::json NormForecaster::state_dict() const {
  return {{"level", level_}, {"trend", trend_}, {"var", var_}, {"count", count_}};
}

void NormForecaster::load_state_dict(const nlohmann::json& state, const std::string& where, const std::string& path) {
  const JsonReader r(state, where, path);
  const double level = r.number("level"), trend = r.number("trend"), var = r.number("var");
  const int64_t count = r.integer("count", 0);
  if (var < 0) r.fail("var", "must be a variance >= 0, got " + std::to_string(var));
  level_ = level, trend_ = trend, var_ = var, count_ = count;
}

}  // namespace gradguard::guard
