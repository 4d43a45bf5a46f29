// The detector's rules, in the order they are checked. Everything here is host
// arithmetic on numbers the step already copied back.
#include "gradguard/guard/detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/json_number.h"

namespace gradguard::guard {
namespace {

constexpr int64_t kSeed = 10;          // healthy steps that seed a window before its rule arms
constexpr double kLayerAlpha = 0.1;    // EMA weight of the per-layer log norms once seeded
constexpr double kLogStdFloor = 0.1;   // log-norm std floor: a 10% wobble is one standard deviation
constexpr double kLossStdFloor = 0.01; // loss std floor relative to the mean loss

double mean_of(const std::deque<double>& d) {
  return d.empty() ? std::numeric_limits<double>::quiet_NaN()
                   : std::accumulate(d.begin(), d.end(), 0.0) / static_cast<double>(d.size());
}

std::string fmt(double v) { return format_number(v); }

}  // namespace

bool Verdict::critical() const {
  return std::any_of(anomalies.begin(), anomalies.end(), [](const Anomaly& a) { return a.severity == Severity::kCritical; });
}

const Anomaly* Verdict::primary() const {
  for (const auto& a : anomalies)
    if (a.severity == Severity::kCritical) return &a;
  return anomalies.empty() ? nullptr : &anomalies.front();
}

nlohmann::ordered_json to_event(int64_t step, const Anomaly& a) {
  nlohmann::ordered_json j = {{"step", step}, {"event", "anomaly"}, {"kind", name_of(a.kind)}, {"severity", name_of(a.severity)}};
  for (const auto& [name, value] : a.numbers) j[name] = json_number(value);
  j["layers"] = a.layers;
  j["message"] = a.message;
  return j;
}

AnomalyDetector::AnomalyDetector(const GuardOptions& options, std::vector<std::string> layer_names, int64_t warmup)
    : options_(options), layer_names_(std::move(layer_names)), warmup_(warmup) {
  options_.validate();
  layer_mean_.assign(layer_names_.size(), 0.0);
  layer_var_.assign(layer_names_.size(), 0.0);
  layer_since_.assign(layer_names_.size(), -1);
}

double AnomalyDetector::loss_mean() const { return mean_of(losses_); }

double AnomalyDetector::loss_std() const {
  if (losses_.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double m = mean_of(losses_);
  double ss = 0;
  for (double x : losses_) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(losses_.size() - 1));
}

double AnomalyDetector::layer_typical(size_t k) const {
  return layer_count_ == 0 ? 0.0 : std::exp(layer_mean_.at(k));
}

Verdict AnomalyDetector::observe(const StepObservation& obs) {
  TORCH_INTERNAL_ASSERT(obs.layer_norms.size() == layer_names_.size());
  Verdict v;
  const int64_t step = obs.step;
  const bool loss_finite = std::isfinite(obs.loss);
  const bool grads_finite = std::isfinite(obs.grad_norm);

  // Per-layer outliers first: every critical verdict names them.
  const bool layers_armed = options_.layer_zscore > 0 && layer_count_ >= kSeed && step >= warmup_;
  std::vector<size_t> outliers, nonfinite_layers;
  std::vector<double> layer_z(layer_names_.size(), 0.0);
  for (size_t k = 0; k < layer_names_.size(); ++k) {
    const double n = obs.layer_norms[k];
    bool out = false;
    if (!std::isfinite(n)) {
      out = true;
      nonfinite_layers.push_back(k);
      layer_z[k] = std::numeric_limits<double>::infinity();
    } else if (layers_armed) {
      layer_z[k] = (std::log(std::max(n, 1e-30)) - layer_mean_[k]) / std::max(std::sqrt(layer_var_[k]), kLogStdFloor);
      out = layer_z[k] > options_.layer_zscore;
    }
    if (out) {
      if (layer_since_[k] < 0) layer_since_[k] = step;
      outliers.push_back(k);
    } else {
      layer_since_[k] = -1;
    }
  }
  std::stable_sort(outliers.begin(), outliers.end(),
                   [&](size_t a, size_t b) { return layer_since_[a] < layer_since_[b]; });
  std::vector<std::string> outlier_names;
  for (size_t k : outliers) outlier_names.push_back(layer_names_[k]);

  auto critical = [&](AnomalyKind kind, std::string message, std::vector<std::pair<std::string, double>> numbers) {
    v.anomalies.push_back({kind, Severity::kCritical, std::move(message), std::move(numbers), outlier_names});
  };

  if (!loss_finite || (!grads_finite && !obs.scaler_dynamic)) {
    std::vector<std::string> where;
    for (size_t k : nonfinite_layers) where.push_back(layer_names_[k]);
    critical(AnomalyKind::kNonfinite,
             std::string(loss_finite ? "" : "loss is " + fmt(obs.loss) + "; ") +
                 (grads_finite ? "gradients finite" : "gradients non-finite" +
                                                          (where.empty() ? "" : " in " + where.front() +
                                                                                    (where.size() > 1 ? " and " +
                                                                                     std::to_string(where.size() - 1) +
                                                                                     " more layers" : ""))),
             {{"loss", obs.loss}, {"grad_norm", obs.grad_norm}});
    if (!where.empty()) v.anomalies.back().layers = where;
  }
  if (obs.scaler_stuck)
    critical(AnomalyKind::kLossScaleStuck, "gradients overflow even at the minimum loss scale", {});

  if (grads_finite && options_.grad_norm_factor > 0) {
    const bool clips = std::isfinite(obs.clip_threshold) && obs.clip_threshold > 0;
    const double ref = clips ? obs.clip_threshold
                             : (static_cast<int64_t>(norms_.size()) >= kSeed ? mean_of(norms_)
                                                                             : std::numeric_limits<double>::quiet_NaN());
    if (std::isfinite(ref) && obs.grad_norm > options_.grad_norm_factor * ref) {
      ++explode_run_;
      const bool is_critical = !obs.update_bounded || explode_run_ >= options_.grad_norm_patience;
      Anomaly a{AnomalyKind::kGradNorm, is_critical ? Severity::kCritical : Severity::kWarning,
                "gradient norm " + fmt(obs.grad_norm) + " is " + fmt(obs.grad_norm / ref) + "x the " +
                    (clips ? "clip threshold " : "recent mean ") + fmt(ref) + " (limit " +
                    fmt(options_.grad_norm_factor) + "x" +
                    (obs.update_bounded ? ", " + std::to_string(explode_run_) + " step(s) in a row, clipped" : "") + ")",
                {{"grad_norm", obs.grad_norm}, {"reference", ref}, {"ratio", obs.grad_norm / ref},
                 {"steps_in_a_row", static_cast<double>(explode_run_)}},
                outlier_names};
      v.anomalies.push_back(std::move(a));
      if (is_critical) explode_run_ = 0;
    } else {
      explode_run_ = 0;
    }
  }

  const int64_t loss_seed = std::min<int64_t>(kSeed, options_.loss_window);
  if (loss_finite && options_.loss_zscore > 0 && step >= warmup_ &&
      static_cast<int64_t>(losses_.size()) >= loss_seed) {
    // The window's linear trend, extrapolated one step, is the expected loss: early in
    // training the loss falls steadily, and a plain mean would both lag behind it and
    // count the fall itself as spread.
    const double n = static_cast<double>(losses_.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < losses_.size(); ++i) {
      const double x = static_cast<double>(i), y = losses_[i];
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double denom = n * sxx - sx * sx;
    const double slope = denom > 0 ? (n * sxy - sx * sy) / denom : 0.0;
    const double intercept = (sy - slope * sx) / n;
    double ss = 0;
    for (size_t i = 0; i < losses_.size(); ++i) {
      const double r = losses_[i] - (intercept + slope * static_cast<double>(i));
      ss += r * r;
    }
    const double sd = n > 2 ? std::sqrt(ss / (n - 2)) : 0.0;
    const double expected = intercept + slope * n;
    const double z = (obs.loss - expected) / std::max(sd, kLossStdFloor * std::abs(sy / n));
    if (z > options_.loss_zscore)
      critical(AnomalyKind::kLossSpike,
               "loss " + fmt(obs.loss) + " against an expected " + fmt(expected) + " from the last " +
                   std::to_string(losses_.size()) + " healthy steps (z-score " + fmt(z) + ", limit " +
                   fmt(options_.loss_zscore) + ")",
               {{"loss", obs.loss}, {"expected", expected}, {"std", sd}, {"zscore", z}});
  }

  if (obs.scaler_backed_off && applied_once_) backoffs_.push_back(step);
  while (!backoffs_.empty() && step - backoffs_.front() >= options_.backoff_window) backoffs_.pop_front();
  if (options_.backoff_limit > 0 && static_cast<int64_t>(backoffs_.size()) >= options_.backoff_limit) {
    critical(AnomalyKind::kBackoffStorm,
             std::to_string(backoffs_.size()) + " loss-scale backoffs within " +
                 std::to_string(options_.backoff_window) + " steps",
             {{"backoffs", static_cast<double>(backoffs_.size())}, {"window", double(options_.backoff_window)}});
    backoffs_.clear();
  }

  const bool will_skip = !grads_finite || !loss_finite;
  if (options_.skip_streak > 0 && applied_once_ && will_skip && skip_run_ + 1 >= options_.skip_streak) {
    critical(AnomalyKind::kSkipStreak, std::to_string(skip_run_ + 1) + " steps in a row skipped",
             {{"streak", static_cast<double>(skip_run_ + 1)}});
    skip_run_ = -1;  // record_outcome() of this step brings it to 0
  }

  if (!outliers.empty() && v.anomalies.empty()) {
    std::vector<std::pair<std::string, double>> numbers;
    const size_t k = outliers.front();
    numbers = {{"layer_norm", obs.layer_norms[k]}, {"typical", layer_typical(k)}, {"zscore", layer_z[k]}};
    v.anomalies.push_back({AnomalyKind::kLayerOutlier, Severity::kWarning,
                           layer_names_[k] + " gradient norm " + fmt(obs.layer_norms[k]) + " against a typical " +
                               fmt(layer_typical(k)) + " (log z-score " + fmt(layer_z[k]) + ")",
                           numbers, outlier_names});
  }

  // Only healthy steps move the statistics.
  if (!v.critical() && loss_finite && grads_finite) {
    losses_.push_back(obs.loss);
    norms_.push_back(obs.grad_norm);
    while (static_cast<int64_t>(losses_.size()) > options_.loss_window) losses_.pop_front();
    while (static_cast<int64_t>(norms_.size()) > options_.loss_window) norms_.pop_front();
    const double a = std::max(kLayerAlpha, 1.0 / static_cast<double>(layer_count_ + 1));
    for (size_t k = 0; k < layer_names_.size(); ++k) {
      // An outlier layer stays out of its own EMA, unless it has been out for kSeed
      // steps: then its new level is the normal one.
      if (layer_since_[k] >= 0 && step - layer_since_[k] < kSeed) continue;
      const double x = std::log(std::max(obs.layer_norms[k], 1e-30));
      const double d = x - layer_mean_[k];
      layer_mean_[k] += a * d;
      layer_var_[k] = (1 - a) * (layer_var_[k] + a * d * d);
    }
    ++layer_count_;
  }
  return v;
}

void AnomalyDetector::record_outcome(bool applied) {
  if (applied) {
    skip_run_ = 0;
    applied_once_ = true;
  } else {
    ++skip_run_;
  }
}

nlohmann::json AnomalyDetector::state_dict() const {
  return {{"losses", losses_},           {"norms", norms_},           {"layer_mean", layer_mean_},
          {"layer_var", layer_var_},     {"layer_since", layer_since_}, {"layer_count", layer_count_},
          {"backoffs", backoffs_},       {"skip_run", skip_run_},     {"applied_once", applied_once_},
          {"explode_run", explode_run_}};
}

void AnomalyDetector::load_state_dict(const nlohmann::json& s, const std::string& where) {
  const JsonReader r(s, where, "guard.detector");
  const size_t layers = layer_names_.size();
  auto layer_mean = r.numbers("layer_mean"), layer_var = r.numbers("layer_var");
  auto layer_since = r.integers("layer_since", -1);
  if (layer_mean.size() != layers || layer_var.size() != layers || layer_since.size() != layers)
    r.fail("layer_mean", "describes " + std::to_string(layer_mean.size()) + " layers, the model has " +
                             std::to_string(layers));
  for (double v : layer_var)
    if (v < 0) r.fail("layer_var", "must hold variances >= 0, got " + format_number(v));
  const auto losses = r.numbers("losses"), norms = r.numbers("norms");
  for (double n : norms)
    if (n < 0) r.fail("norms", "must hold norms >= 0, got " + format_number(n));
  const int64_t layer_count = r.integer("layer_count", 0);
  const auto backoffs = r.integers("backoffs", 0);
  const int64_t skip_run = r.integer("skip_run", 0), explode_run = r.integer("explode_run", 0);
  const bool applied_once = r.boolean("applied_once");
  // Everything checked: now apply it.
  losses_.assign(losses.begin(), losses.end());
  norms_.assign(norms.begin(), norms.end());
  layer_mean_ = std::move(layer_mean);
  layer_var_ = std::move(layer_var);
  layer_since_ = std::move(layer_since);
  layer_count_ = layer_count;
  backoffs_.assign(backoffs.begin(), backoffs.end());
  skip_run_ = skip_run;
  applied_once_ = applied_once;
  explode_run_ = explode_run;
}

}  // namespace gradguard::guard
