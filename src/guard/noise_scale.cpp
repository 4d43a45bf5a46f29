// The two unbiased estimators and their bias-corrected EMAs (the same correction Adam
// applies to its moments, so early estimates are not pulled towards zero).
#include "gradguard/guard/noise_scale.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"

namespace gradguard::guard {

NoiseScaleEstimator::NoiseScaleEstimator(double ema) : ema_(ema) {
  if (!(ema >= 0 && ema < 1)) throw bad_input("guard.noise_scale.ema", "must be in [0, 1), got " + format_number(ema));
}

double NoiseScaleEstimator::update(double small_sq, double b_small, double big_sq, double b_big) {
  if (std::isfinite(small_sq) && std::isfinite(big_sq) && b_small > 0 && b_big > b_small) {
    const double g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
    const double s = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);
    g2_ = ema_ * g2_ + (1 - ema_) * g2;
    s_ = ema_ * s_ + (1 - ema_) * s;
    ++count_;
  }
  return b_simple();
}

double NoiseScaleEstimator::grad_sq() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN() : g2_ / (1 - std::pow(ema_, double(count_)));
}

double NoiseScaleEstimator::trace_cov() const {
  return count_ == 0 ? std::numeric_limits<double>::quiet_NaN() : s_ / (1 - std::pow(ema_, double(count_)));
}

double NoiseScaleEstimator::b_simple() const {
  const double g2 = grad_sq();
  return count_ > 0 && g2 > 0 ? trace_cov() / g2 : std::numeric_limits<double>::quiet_NaN();
}

nlohmann::json NoiseScaleEstimator::state_dict() const { return {{"g2", g2_}, {"s", s_}, {"count", count_}}; }

void NoiseScaleEstimator::load_state_dict(const nlohmann::json& st, const std::string& where) {
  const JsonReader r(st, where, "guard.noise_scale");
  const double g2 = r.number("g2"), s = r.number("s");
  const int64_t count = r.integer("count", 0);
  g2_ = g2, s_ = s, count_ = count;
}

}  // namespace gradguard::guard
