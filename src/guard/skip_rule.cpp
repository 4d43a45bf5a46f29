#include "gradguard/guard/skip_rule.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"

namespace gradguard::guard {
namespace {

// m + sigma s over the values, s with n - 1 in the denominator (n >= 2).
double limit(const std::deque<double>& v, double sigma) {
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return mean + sigma * std::sqrt(ss / static_cast<double>(v.size() - 1));
}

}  // namespace

SkipRule::SkipRule(double sigma, int64_t window) : sigma_(sigma), window_(static_cast<size_t>(std::max<int64_t>(window, 2))) {}

SkipDecision SkipRule::observe(double loss, double grad_norm) {
  SkipDecision d;
  if (!enabled()) return d;
  d.armed = losses_.size() >= std::max<size_t>(2, window_ / 2);
  if (d.armed) {
    d.loss_limit = limit(losses_, sigma_);
    d.grad_norm_limit = limit(norms_, sigma_);
    // A non-finite value is not judged here: the scaler skips such a step already.
    d.skip = loss > d.loss_limit || grad_norm > d.grad_norm_limit;
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) d.skip = false;
  }
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    losses_.push_back(loss);
    norms_.push_back(grad_norm);
    while (losses_.size() > window_) losses_.pop_front(), norms_.pop_front();
  }
  return d;
}

nlohmann::json SkipRule::state_dict() const {
  return {{"losses", std::vector<double>(losses_.begin(), losses_.end())},
          {"grad_norms", std::vector<double>(norms_.begin(), norms_.end())}};
}

void SkipRule::load_state_dict(const nlohmann::json& state, const std::string& where) {
  const JsonReader r(state, where, "guard.skip_rule");
  const auto losses = r.numbers("losses"), norms = r.numbers("grad_norms");
  if (losses.size() != norms.size()) r.fail("grad_norms", "must have as many values as losses");
  // A run resumed with a smaller window keeps the newest values.
  const size_t drop = losses.size() > window_ ? losses.size() - window_ : 0;
  losses_.assign(losses.begin() + static_cast<std::ptrdiff_t>(drop), losses.end());
  norms_.assign(norms.begin() + static_cast<std::ptrdiff_t>(drop), norms.end());
}

}  // namespace gradguard::guard
