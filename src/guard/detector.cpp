// The detector's rules, each a function of one signature (DetectorRule) listed in
// kDetectorRules in the order they are checked; observe() scans the layers, runs the list
// and absorbs a healthy step into the windows. Everything here is host arithmetic on
// numbers the step already copied back.
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

namespace {

double typical(const DetectorWindows& w, size_t k) { return w.layer_count == 0 ? 0.0 : std::exp(w.layer_mean.at(k)); }

Anomaly critical(const RuleContext& ctx, AnomalyKind kind, std::string message,
                 std::vector<std::pair<std::string, double>> numbers) {
  return {kind, Severity::kCritical, std::move(message), std::move(numbers), ctx.outlier_names};
}

// nonfinite: inf/NaN in the loss, or in the gradients with no dynamic scaler to absorb it.
std::optional<Anomaly> nonfinite(const StepObservation& obs, const RuleContext& ctx, DetectorWindows&) {
  const bool loss_finite = std::isfinite(obs.loss), grads_finite = std::isfinite(obs.grad_norm);
  if (loss_finite && (grads_finite || obs.scaler_dynamic)) return std::nullopt;
  std::vector<std::string> where;
  for (size_t k : ctx.nonfinite_layers) where.push_back(ctx.layer_names[k]);
  auto a = critical(ctx, AnomalyKind::kNonfinite,
                    std::string(loss_finite ? "" : "loss is " + fmt(obs.loss) + "; ") +
                        (grads_finite ? "gradients finite"
                                      : "gradients non-finite" +
                                            (where.empty() ? "" : " in " + where.front() +
                                                                      (where.size() > 1 ? " and " +
                                                                       std::to_string(where.size() - 1) +
                                                                       " more layers" : ""))),
                    {{"loss", obs.loss}, {"grad_norm", obs.grad_norm}});
  if (!where.empty()) a.layers = where;
  return a;
}

// loss_scale_stuck: the scaler overflowed at its floor too often.
std::optional<Anomaly> loss_scale_stuck(const StepObservation& obs, const RuleContext& ctx, DetectorWindows&) {
  if (!obs.scaler_stuck) return std::nullopt;
  return critical(ctx, AnomalyKind::kLossScaleStuck, "gradients overflow even at the minimum loss scale", {});
}

// grad_norm: above grad_norm_factor x the clip threshold (the recent mean when nothing
// clips); a warning while clipping bounds the update, critical after grad_norm_patience
// such steps in a row (counted in w.explode_run) or at once without a bound.
std::optional<Anomaly> grad_norm(const StepObservation& obs, const RuleContext& ctx, DetectorWindows& w) {
  const auto& o = ctx.options;
  if (!std::isfinite(obs.grad_norm) || o.grad_norm_factor <= 0) return std::nullopt;
  const bool clips = std::isfinite(obs.clip_threshold) && obs.clip_threshold > 0;
  const double ref = clips ? obs.clip_threshold
                           : (static_cast<int64_t>(w.norms.size()) >= kSeed ? mean_of(w.norms)
                                                                            : std::numeric_limits<double>::quiet_NaN());
  if (!std::isfinite(ref) || obs.grad_norm <= o.grad_norm_factor * ref) {
    w.explode_run = 0;
    return std::nullopt;
  }
  ++w.explode_run;
  const bool is_critical = !obs.update_bounded || w.explode_run >= o.grad_norm_patience;
  Anomaly a{AnomalyKind::kGradNorm, is_critical ? Severity::kCritical : Severity::kWarning,
            "gradient norm " + fmt(obs.grad_norm) + " is " + fmt(obs.grad_norm / ref) + "x the " +
                (clips ? "clip threshold " : "recent mean ") + fmt(ref) + " (limit " + fmt(o.grad_norm_factor) + "x" +
                (obs.update_bounded ? ", " + std::to_string(w.explode_run) + " step(s) in a row, clipped" : "") + ")",
            {{"grad_norm", obs.grad_norm}, {"reference", ref}, {"ratio", obs.grad_norm / ref},
             {"steps_in_a_row", static_cast<double>(w.explode_run)}},
            ctx.outlier_names};
  if (is_critical) w.explode_run = 0;
  return a;
}

// loss_spike: the loss's z-score against the linear trend of the healthy window.
std::optional<Anomaly> loss_spike(const StepObservation& obs, const RuleContext& ctx, DetectorWindows& w) {
  const auto& o = ctx.options;
  const int64_t loss_seed = std::min<int64_t>(kSeed, o.loss_window);
  if (!std::isfinite(obs.loss) || o.loss_zscore <= 0 || obs.step < ctx.warmup ||
      static_cast<int64_t>(w.losses.size()) < loss_seed)
    return std::nullopt;
  // The window's linear trend, extrapolated one step, is the expected loss: early in
  // training the loss falls steadily, and a plain mean would both lag behind it and
  // count the fall itself as spread.
  const auto& losses = w.losses;
  const double n = static_cast<double>(losses.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    const double x = static_cast<double>(i), y = losses[i];
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double denom = n * sxx - sx * sx;
  const double slope = denom > 0 ? (n * sxy - sx * sy) / denom : 0.0;
  const double intercept = (sy - slope * sx) / n;
  double ss = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    const double r = losses[i] - (intercept + slope * static_cast<double>(i));
    ss += r * r;
  }
  const double sd = n > 2 ? std::sqrt(ss / (n - 2)) : 0.0;
  const double expected = intercept + slope * n;
  const double z = (obs.loss - expected) / std::max(sd, kLossStdFloor * std::abs(sy / n));
  if (!(z > o.loss_zscore)) return std::nullopt;  // a NaN z (a flat window of zeros) is no spike
  return critical(ctx, AnomalyKind::kLossSpike,
                  "loss " + fmt(obs.loss) + " against an expected " + fmt(expected) + " from the last " +
                      std::to_string(losses.size()) + " healthy steps (z-score " + fmt(z) + ", limit " +
                      fmt(o.loss_zscore) + ")",
                  {{"loss", obs.loss}, {"expected", expected}, {"std", sd}, {"zscore", z}});
}

// backoff_storm: backoff_limit loss-scale backoffs within backoff_window steps (after the
// first applied update: fp16's initial scale search is not a storm). One storm is one anomaly.
std::optional<Anomaly> backoff_storm(const StepObservation& obs, const RuleContext& ctx, DetectorWindows& w) {
  const auto& o = ctx.options;
  if (obs.scaler_backed_off && w.applied_once) w.backoffs.push_back(obs.step);
  while (!w.backoffs.empty() && obs.step - w.backoffs.front() >= o.backoff_window) w.backoffs.pop_front();
  if (o.backoff_limit <= 0 || static_cast<int64_t>(w.backoffs.size()) < o.backoff_limit) return std::nullopt;
  auto a = critical(ctx, AnomalyKind::kBackoffStorm,
                    std::to_string(w.backoffs.size()) + " loss-scale backoffs within " +
                        std::to_string(o.backoff_window) + " steps",
                    {{"backoffs", static_cast<double>(w.backoffs.size())}, {"window", double(o.backoff_window)}});
  w.backoffs.clear();
  return a;
}

// skip_streak: this step will be skipped and makes skip_streak in a row.
std::optional<Anomaly> skip_streak(const StepObservation& obs, const RuleContext& ctx, DetectorWindows& w) {
  const bool will_skip = !std::isfinite(obs.grad_norm) || !std::isfinite(obs.loss);
  if (ctx.options.skip_streak <= 0 || !w.applied_once || !will_skip || w.skip_run + 1 < ctx.options.skip_streak)
    return std::nullopt;
  auto a = critical(ctx, AnomalyKind::kSkipStreak, std::to_string(w.skip_run + 1) + " steps in a row skipped",
                    {{"streak", static_cast<double>(w.skip_run + 1)}});
  w.skip_run = -1;  // record_outcome() of this step brings it to 0
  return a;
}

// layer_outlier: a warning naming the first layer to jump, when no other rule spoke (the
// others carry the outlying layers already).
std::optional<Anomaly> layer_outlier(const StepObservation& obs, const RuleContext& ctx, DetectorWindows& w) {
  if (ctx.outliers.empty() || ctx.found > 0) return std::nullopt;
  const size_t k = ctx.outliers.front();
  return Anomaly{AnomalyKind::kLayerOutlier, Severity::kWarning,
                 ctx.layer_names[k] + " gradient norm " + fmt(obs.layer_norms[k]) + " against a typical " +
                     fmt(typical(w, k)) + " (log z-score " + fmt(ctx.layer_z[k]) + ")",
                 {{"layer_norm", obs.layer_norms[k]}, {"typical", typical(w, k)}, {"zscore", ctx.layer_z[k]}},
                 ctx.outlier_names};
}

// The rules in the order they are checked (and their anomalies listed).
constexpr DetectorRule kDetectorRules[] = {nonfinite,     loss_scale_stuck, grad_norm,    loss_spike,
                                           backoff_storm, skip_streak,      layer_outlier};

}  // namespace

AnomalyDetector::AnomalyDetector(const GuardOptions& options, std::vector<std::string> layer_names, int64_t warmup)
    : options_(options), layer_names_(std::move(layer_names)), warmup_(warmup) {
  options_.validate();
  w_.layer_mean.assign(layer_names_.size(), 0.0);
  w_.layer_var.assign(layer_names_.size(), 0.0);
  w_.layer_since.assign(layer_names_.size(), -1);
  w_.norm_forecast = NormForecaster(options_.forecast_zscore);
  w_.layer_forecasts.assign(layer_names_.size(), NormForecaster(options_.forecast_zscore));
}

double AnomalyDetector::loss_mean() const { return mean_of(w_.losses); }

double AnomalyDetector::loss_std() const {
  if (w_.losses.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double m = mean_of(w_.losses);
  double ss = 0;
  for (double x : w_.losses) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(w_.losses.size() - 1));
}

double AnomalyDetector::layer_typical(size_t k) const { return typical(w_, k); }

RuleContext AnomalyDetector::scan_layers(const StepObservation& obs) {
  RuleContext ctx{options_, layer_names_, warmup_, {}, {}, {}, std::vector<double>(layer_names_.size(), 0.0), 0};
  const bool armed = options_.layer_zscore > 0 && w_.layer_count >= kSeed && obs.step >= warmup_;
  for (size_t k = 0; k < layer_names_.size(); ++k) {
    const double n = obs.layer_norms[k];
    bool out = false;
    if (!std::isfinite(n)) {
      out = true;
      ctx.nonfinite_layers.push_back(k);
      ctx.layer_z[k] = std::numeric_limits<double>::infinity();
    } else if (armed) {
      ctx.layer_z[k] =
          (std::log(std::max(n, 1e-30)) - w_.layer_mean[k]) / std::max(std::sqrt(w_.layer_var[k]), kLogStdFloor);
      out = ctx.layer_z[k] > options_.layer_zscore;
    }
    if (out) {
      if (w_.layer_since[k] < 0) w_.layer_since[k] = obs.step;
      ctx.outliers.push_back(k);
    } else {
      w_.layer_since[k] = -1;
    }
  }
  std::stable_sort(ctx.outliers.begin(), ctx.outliers.end(),
                   [&](size_t a, size_t b) { return w_.layer_since[a] < w_.layer_since[b]; });
  for (size_t k : ctx.outliers) ctx.outlier_names.push_back(layer_names_[k]);
  return ctx;
}

void AnomalyDetector::absorb(const StepObservation& obs) {
  w_.losses.push_back(obs.loss);
  w_.norms.push_back(obs.grad_norm);
  while (static_cast<int64_t>(w_.losses.size()) > options_.loss_window) w_.losses.pop_front();
  while (static_cast<int64_t>(w_.norms.size()) > options_.loss_window) w_.norms.pop_front();
  const double a = std::max(kLayerAlpha, 1.0 / static_cast<double>(w_.layer_count + 1));
  for (size_t k = 0; k < layer_names_.size(); ++k) {
    // An outlier layer stays out of its own EMA, unless it has been out for kSeed
    // steps: then its new level is the normal one.
    if (w_.layer_since[k] >= 0 && obs.step - w_.layer_since[k] < kSeed) continue;
    const double x = std::log(std::max(obs.layer_norms[k], 1e-30));
    const double d = x - w_.layer_mean[k];
    w_.layer_mean[k] += a * d;
    w_.layer_var[k] = (1 - a) * (w_.layer_var[k] + a * d * d);
  }
  ++w_.layer_count;
  w_.norm_forecast.absorb(obs.grad_norm);
  for (size_t k = 0; k < layer_names_.size(); ++k) w_.layer_forecasts[k].absorb(obs.layer_norms[k]);
}

Verdict AnomalyDetector::observe(const StepObservation& obs) {
  TORCH_INTERNAL_ASSERT(obs.layer_norms.size() == layer_names_.size());
  RuleContext ctx = scan_layers(obs);  // first: every critical verdict names the outlying layers
  Verdict v;
  v.forecast = w_.norm_forecast.judge(obs.grad_norm);
  for (size_t k = 0; k < layer_names_.size(); ++k)
    if (w_.layer_forecasts[k].judge(obs.layer_norms[k]).breach > 0) v.forecast_layers.push_back(layer_names_[k]);
  for (const DetectorRule rule : kDetectorRules) {
    ctx.found = v.anomalies.size();
    if (auto a = rule(obs, ctx, w_)) v.anomalies.push_back(std::move(*a));
  }
  // Only healthy steps move the statistics.
  if (!v.critical() && std::isfinite(obs.loss) && std::isfinite(obs.grad_norm)) absorb(obs);
  return v;
}

void AnomalyDetector::record_outcome(bool applied) {
  if (applied) {
    w_.skip_run = 0;
    w_.applied_once = true;
  } else {
    ++w_.skip_run;
  }
}

nlohmann::json AnomalyDetector::state_dict() const {
  return {{"losses", w_.losses},           {"norms", w_.norms},             {"layer_mean", w_.layer_mean},
          {"layer_var", w_.layer_var},     {"layer_since", w_.layer_since}, {"layer_count", w_.layer_count},
          {"backoffs", w_.backoffs},       {"skip_run", w_.skip_run},       {"applied_once", w_.applied_once},
          {"explode_run", w_.explode_run}, {"forecast", forecast_state()}};
}

nlohmann::json AnomalyDetector::forecast_state() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& f : w_.layer_forecasts) layers.push_back(f.state_dict());
  return {{"global", w_.norm_forecast.state_dict()}, {"layers", layers}};
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
  // The forecasters (absent from states written before they existed: they start afresh).
  NormForecaster norm_forecast(options_.forecast_zscore);
  std::vector<NormForecaster> layer_forecasts(layers, NormForecaster(options_.forecast_zscore));
  if (r.has("forecast")) {
    const std::string path = "guard.detector.forecast";
    const JsonReader f = r.object("forecast");
    norm_forecast.load_state_dict(f.raw("global"), where, path + ".global");
    const nlohmann::json& list = f.raw("layers");
    if (!list.is_array() || list.size() != layers)
      f.fail("layers", "must describe the model's " + std::to_string(layers) + " layer groups, got " + describe(list));
    for (size_t k = 0; k < layers; ++k)
      layer_forecasts[k].load_state_dict(list[k], where, path + ".layers[" + std::to_string(k) + "]");
  }
  // Everything checked: now apply it.
  w_.losses.assign(losses.begin(), losses.end());
  w_.norms.assign(norms.begin(), norms.end());
  w_.layer_mean = std::move(layer_mean);
  w_.layer_var = std::move(layer_var);
  w_.layer_since = std::move(layer_since);
  w_.layer_count = layer_count;
  w_.backoffs.assign(backoffs.begin(), backoffs.end());
  w_.skip_run = skip_run;
  w_.applied_once = applied_once;
  w_.explode_run = explode_run;
  w_.norm_forecast = norm_forecast;
  w_.layer_forecasts = std::move(layer_forecasts);
}

}  // namespace gradguard::guard
