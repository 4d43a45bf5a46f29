// The gradient-norm forecaster (guard/forecast.h) against its definition: Holt's
// smoothing of log(norm) with clipped updates, computed here independently in float64
// for a whole series; and its place in the detector (observations, never anomalies).
#include "gradguard/guard/forecast.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/guard/detector.h"

namespace gradguard::guard {
namespace {

using F = NormForecaster;

// The definition in forecast.h, step by step: returns the forecast band (low, high) made
// before each value; NaN before the first kWarmup values.
std::vector<std::pair<double, double>> reference_bands(const std::vector<double>& norms, double z) {
  std::vector<std::pair<double, double>> bands;
  double level = 0, trend = 0, var = 0;
  for (size_t t = 0; t < norms.size(); ++t) {
    const double s = std::max(std::sqrt(var), F::kScaleFloor);
    if (static_cast<int64_t>(t) >= F::kWarmup)
      bands.emplace_back(std::exp(level + trend - z * s), std::exp(level + trend + z * s));
    else
      bands.emplace_back(std::nan(""), std::nan(""));
    const double y = std::log(norms[t]);
    if (t == 0) {
      level = y;
    } else if (t == 1) {
      trend = y - level;
      level = y;
    } else {
      const double f = level + trend, r = y - f;
      const bool seeded = static_cast<int64_t>(t) >= F::kWarmup;
      const double kept = seeded ? std::clamp(r, -F::kClip * s, F::kClip * s) : r;
      const double a = std::max(F::kScaleAlpha, 1.0 / static_cast<double>(t - 1));
      var = (1 - a) * var + a * (seeded ? std::min(r * r, F::kClip * s * F::kClip * s) : r * r);
      const double next = f + F::kAlpha * kept;
      trend = F::kBeta * (next - level) + (1 - F::kBeta) * trend;
      level = next;
    }
  }
  return bands;
}

std::vector<double> wobbly(int n, double base, double growth) {
  std::vector<double> v;
  for (int t = 0; t < n; ++t) v.push_back(base * std::pow(growth, t) * (1 + 0.1 * std::sin(1.7 * t)));
  return v;
}

TEST(Forecast, FollowsItsDefinitionOverASeriesWithASpike) {
  std::vector<double> norms = wobbly(60, 0.8, 1.01);
  norms[30] *= 20;  // one spike
  for (int t = 45; t < 60; ++t) norms[static_cast<size_t>(t)] *= 3;  // a lasting shift
  const auto bands = reference_bands(norms, 4);
  F f(4);
  for (size_t t = 0; t < norms.size(); ++t) {
    const Forecast got = f.judge(norms[t]);
    if (static_cast<int64_t>(t) < F::kWarmup) {
      EXPECT_FALSE(got.ready) << t;
      EXPECT_EQ(got.breach, 0);
    } else {
      ASSERT_TRUE(got.ready) << t;
      EXPECT_NEAR(got.low, bands[t].first, 1e-12 * bands[t].first) << t;
      EXPECT_NEAR(got.high, bands[t].second, 1e-12 * bands[t].second) << t;
      EXPECT_EQ(got.breach, norms[t] > bands[t].second ? 1 : (norms[t] < bands[t].first ? -1 : 0)) << t;
    }
    f.absorb(norms[t]);
  }
}

TEST(Forecast, ASpikeBreachesAndBarelyMovesTheBand) {
  F f(4);
  const auto norms = wobbly(40, 1.0, 1.0);
  for (double n : norms) {
    EXPECT_EQ(f.judge(n).breach, 0) << "a 10% wobble stays inside the band";
    f.absorb(n);
  }
  const Forecast before = f.predict();
  EXPECT_NEAR(before.expected, 1.0, 0.15);
  EXPECT_EQ(f.judge(30.0).breach, 1);
  EXPECT_EQ(f.judge(0.01).breach, -1);
  f.absorb(30.0);
  // The level moved by at most alpha x clip scale units (a Huber step), not toward 30.
  EXPECT_LT(std::log(f.predict().expected / before.expected), F::kAlpha * F::kClip * 0.2 + 0.05);
}

TEST(Forecast, AGeometricTrendIsForecastExactly) {
  F f(4);
  double n = 0.5;
  for (int t = 0; t < 30; ++t, n *= 1.05) f.absorb(n);
  EXPECT_NEAR(f.predict().expected, n, 1e-9 * n);  // the next value of the trend
  EXPECT_EQ(f.judge(n).breach, 0);
}

TEST(Forecast, NonFiniteAndZeroNormsAreNotLearnt) {
  F f(4);
  for (int t = 0; t < 10; ++t) f.absorb(1.0);
  const auto state = f.state_dict();
  f.absorb(std::numeric_limits<double>::infinity());
  f.absorb(std::nan(""));
  f.absorb(0.0);
  EXPECT_EQ(f.state_dict(), state);
  EXPECT_EQ(f.judge(std::nan("")).breach, 0);
  EXPECT_EQ(f.judge(std::numeric_limits<double>::infinity()).breach, 1);
  EXPECT_FALSE(F(0).judge(1.0).ready) << "z-score 0 turns the band off";
}

TEST(Forecast, StateRoundTripsAndRefusesAnImpossibleOne) {
  F a(4), b(4);
  for (double n : wobbly(20, 2.0, 1.02)) a.absorb(n);
  b.load_state_dict(a.state_dict(), "state.json", "guard.detector.forecast.global");
  EXPECT_EQ(a.predict().high, b.predict().high);
  auto bad = a.state_dict();
  bad["var"] = -1.0;
  try {
    b.load_state_dict(bad, "state.json", "guard.detector.forecast.global");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(std::string(e.where()) + e.what(), ::testing::HasSubstr("var"));
  }
}

StepObservation observation(int64_t step, double norm, std::vector<double> layers) {
  StepObservation o;
  o.step = step;
  o.loss = 2.0;
  o.grad_norm = norm;
  o.clip_threshold = 100;
  o.layer_norms = std::move(layers);
  return o;
}

TEST(Forecast, TheDetectorReportsBreachesButNoAnomaly) {
  GuardOptions options;
  options.layer_zscore = 0;  // the layer rule would warn about b: this test is about the forecast alone
  AnomalyDetector d(options, {"a", "b"}, 0);
  for (int t = 0; t < 20; ++t) {
    const Verdict v = d.observe(observation(t, 1.0, {0.5, 0.5}));
    EXPECT_EQ(v.forecast.ready, t >= F::kWarmup) << t;
    d.record_outcome(true);
  }
  // The global norm triples (under the grad_norm rule's limit) and layer b with it.
  const Verdict v = d.observe(observation(20, 3.0, {0.5, 2.5}));
  EXPECT_TRUE(v.anomalies.empty());
  EXPECT_EQ(v.forecast.breach, 1);
  EXPECT_NEAR(v.forecast.expected, 1.0, 1e-9);
  EXPECT_EQ(v.forecast_layers, std::vector<std::string>{"b"});
  // Its state travels with the detector's; a state without it (written before it
  // existed) starts the forecasters afresh.
  AnomalyDetector e(options, {"a", "b"}, 0);
  e.load_state_dict(d.state_dict());
  EXPECT_EQ(e.state_dict(), d.state_dict());
  auto old = d.state_dict();
  old.erase("forecast");
  e.load_state_dict(old);
  EXPECT_FALSE(e.observe(observation(21, 1.0, {0.5, 0.5})).forecast.ready);
  auto wrong = d.state_dict();
  wrong["forecast"]["layers"] = nlohmann::json::array();
  EXPECT_THROW(e.load_state_dict(wrong), Error);
}

}  // namespace
}  // namespace gradguard::guard
