// Each detector rule fires on the case it is for and stays quiet on the healthy case
// next to it. Thresholds are the documented defaults unless a test says otherwise.
#include "gradguard/guard/detector.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/choice.h"
#include "gradguard/core/error.h"

namespace gradguard::guard {
namespace {

using ::testing::ElementsAre;

const std::vector<std::string> kLayers = {"embed_tokens", "layers.0", "layers.1", "lm_head"};

StepObservation healthy(int64_t step, double loss = 2.0, double norm = 0.5) {
  StepObservation o;
  o.step = step;
  // A little deterministic wobble so the windows have a spread.
  const double w = 1 + 0.02 * std::sin(static_cast<double>(step));
  o.loss = loss * w;
  o.grad_norm = norm * w;
  o.clip_threshold = 1.0;
  o.layer_norms = {0.1 * w, 0.2 * w, 0.3 * w, 0.4 * w};
  return o;
}

// Feeds `n` healthy steps starting at 0 and records them as applied.
void warm(AnomalyDetector& d, int64_t n) {
  for (int64_t s = 0; s < n; ++s) {
    ASSERT_TRUE(d.observe(healthy(s)).anomalies.empty()) << "step " << s;
    d.record_outcome(true);
  }
}

// The kinds of the verdict's anomalies by name, in order.
std::vector<std::string> kinds(const Verdict& v) {
  std::vector<std::string> k;
  for (const auto& a : v.anomalies) k.push_back(name_of(a.kind));
  return k;
}

TEST(Detector, HealthyRunHasNoAnomalies) {
  AnomalyDetector d(GuardOptions{}, kLayers, 5);
  warm(d, 200);
  EXPECT_NEAR(d.loss_mean(), 2.0, 0.05);
}

TEST(Detector, NonFiniteLossOrGradientsWithoutADynamicScaler) {
  AnomalyDetector d(GuardOptions{}, kLayers, 5);
  warm(d, 3);
  auto o = healthy(3);
  o.grad_norm = std::numeric_limits<double>::infinity();
  o.layer_norms[2] = std::numeric_limits<double>::quiet_NaN();
  auto v = d.observe(o);
  ASSERT_TRUE(v.critical());
  EXPECT_EQ(v.primary()->kind, AnomalyKind::kNonfinite);
  EXPECT_THAT(v.primary()->layers, ElementsAre("layers.1"));  // where the NaN is
  EXPECT_THAT(v.primary()->message, ::testing::HasSubstr("layers.1"));

  // The same overflow under a dynamic loss scaler is routine: no anomaly.
  o.scaler_dynamic = true;
  EXPECT_FALSE(d.observe(o).critical());
  // But a non-finite loss is one even then.
  o.loss = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(kinds(d.observe(o)), ::testing::Contains("nonfinite"));
}

TEST(Detector, LossScaleStuck) {
  AnomalyDetector d(GuardOptions{}, kLayers, 5);
  auto o = healthy(0);
  o.scaler_dynamic = true;
  o.scaler_stuck = true;
  EXPECT_THAT(kinds(d.observe(o)), ::testing::Contains("loss_scale_stuck"));
}

TEST(Detector, GradNormAboveFactorTimesClipThreshold) {
  AnomalyDetector d(GuardOptions{}, kLayers, 5);
  auto o = healthy(0);
  o.grad_norm = 9.9;  // < 10 x 1.0
  EXPECT_FALSE(d.observe(o).critical());
  o.grad_norm = 10.5;
  auto v = d.observe(o);
  ASSERT_TRUE(v.critical());
  EXPECT_EQ(v.primary()->kind, AnomalyKind::kGradNorm);
  EXPECT_EQ(v.primary()->numbers[1].first, "reference");
  EXPECT_DOUBLE_EQ(v.primary()->numbers[1].second, 1.0);
}

TEST(Detector, ClippedExplosionIsCriticalOnlyWhenItPersists) {
  GuardOptions opt;  // patience 3
  AnomalyDetector d(opt, kLayers, 5);
  std::vector<std::string> severities;
  for (int64_t s = 0; s < 7; ++s) {
    auto o = healthy(s);
    o.update_bounded = true;         // global clipping at 1.0 bounds the update
    o.grad_norm = s == 4 ? 0.5 : 45;  // step 4 is normal again
    auto v = d.observe(o);
    severities.push_back(v.anomalies.empty() ? "none" : name_of(v.anomalies[0].severity));
    d.record_outcome(!v.critical());
  }
  EXPECT_THAT(severities, ElementsAre("warning", "warning", "critical", "warning", "none", "warning", "warning"));
}

TEST(Detector, GradNormWithoutClippingUsesTheRecentMean) {
  AnomalyDetector d(GuardOptions{}, kLayers, 0);
  for (int64_t s = 0; s < 12; ++s) {
    auto o = healthy(s);
    o.clip_threshold = std::numeric_limits<double>::infinity();
    ASSERT_FALSE(d.observe(o).critical());
    d.record_outcome(true);
  }
  auto o = healthy(12);
  o.clip_threshold = std::numeric_limits<double>::infinity();
  o.grad_norm = 4.0;  // 8x the ~0.5 mean: below the factor of 10, and healthy
  EXPECT_FALSE(d.observe(o).critical());
  // The window now holds twelve ~0.5 norms and the 4.0: mean ~0.77, limit ~7.7.
  o.grad_norm = 9.0;
  EXPECT_THAT(kinds(d.observe(o)), ElementsAre("grad_norm"));
}

TEST(Detector, LossSpikeWaitsForWarmupAndKeepsOutliersOutOfItsWindow) {
  GuardOptions opt;
  AnomalyDetector d(opt, kLayers, /*warmup=*/20);
  warm(d, 15);
  auto spike = healthy(15, 4.8);
  EXPECT_FALSE(d.observe(spike).critical()) << "armed during warmup";
  d.record_outcome(true);
  // The warmup spike went into the window (warmup steps are all healthy by definition);
  // restart with a fresh detector for the armed case.
  AnomalyDetector armed(opt, kLayers, 20);
  warm(armed, 40);
  const double mean_before = armed.loss_mean();
  auto v = armed.observe(healthy(40, 4.8));  // 1.2 -> 4.8 style jump: z far above 6
  ASSERT_TRUE(v.critical());
  EXPECT_EQ(v.primary()->kind, AnomalyKind::kLossSpike);
  EXPECT_DOUBLE_EQ(armed.loss_mean(), mean_before) << "the spike must not enter the window";
  // A second identical spike is still a spike.
  EXPECT_TRUE(armed.observe(healthy(41, 4.8)).critical());
  // A 3% rise is within the 1%-of-mean std floor x 6.
  EXPECT_FALSE(armed.observe(healthy(42, 2.0 * 1.03)).critical());
}

TEST(Detector, LayerOutlierNamesTheLayerThatJumpedFirst) {
  AnomalyDetector d(GuardOptions{}, kLayers, 5);
  warm(d, 30);
  auto o = healthy(30);
  o.layer_norms[2] *= 20;  // layers.1 jumps first
  auto v = d.observe(o);
  ASSERT_EQ(v.anomalies.size(), 1u);
  EXPECT_EQ(v.anomalies[0].kind, AnomalyKind::kLayerOutlier);
  EXPECT_EQ(v.anomalies[0].severity, Severity::kWarning);
  EXPECT_THAT(v.anomalies[0].layers, ElementsAre("layers.1"));
  d.record_outcome(true);
  // Next step layers.1 is still out and embed_tokens joins, and the gradient explodes:
  // the critical verdict names layers.1 first although embed_tokens comes earlier in
  // the model.
  o = healthy(31);
  o.layer_norms[2] *= 20;
  o.layer_norms[0] *= 20;
  o.grad_norm = 50;
  v = d.observe(o);
  ASSERT_TRUE(v.critical());
  EXPECT_THAT(v.primary()->layers, ElementsAre("layers.1", "embed_tokens"));
}

TEST(Detector, BackoffStormAfterTheFirstAppliedStepOnly) {
  GuardOptions opt;  // 3 backoffs within 20 steps
  AnomalyDetector d(opt, kLayers, 0);
  // The initial scale search: backoffs before any applied step are not a storm.
  for (int64_t s = 0; s < 4; ++s) {
    auto o = healthy(s);
    o.scaler_dynamic = true;
    o.scaler_backed_off = true;
    o.grad_norm = std::numeric_limits<double>::infinity();
    EXPECT_FALSE(d.observe(o).critical()) << s;
    d.record_outcome(false);
  }
  d.observe(healthy(4));
  d.record_outcome(true);
  std::vector<int64_t> fired;
  for (int64_t s = 5; s < 30; s += 4) {  // one backoff every 4 steps: 3 within 20 steps
    auto o = healthy(s);
    o.scaler_dynamic = true;
    o.scaler_backed_off = true;
    o.grad_norm = std::numeric_limits<double>::infinity();
    auto v = d.observe(o);
    if (v.critical()) fired.push_back(s);
    d.record_outcome(false);
    d.observe(healthy(s + 1));
    d.record_outcome(true);
  }
  // Backoffs at 5, 9, 13 -> storm at 13; the counter restarts: 17, 21, 25 -> 25.
  EXPECT_THAT(fired, ElementsAre(13, 25));
}

TEST(Detector, SkipStreak) {
  GuardOptions opt;
  opt.skip_streak = 3;
  AnomalyDetector d(opt, kLayers, 0);
  warm(d, 2);
  std::vector<int64_t> fired;
  for (int64_t s = 2; s < 9; ++s) {
    auto o = healthy(s);
    o.scaler_dynamic = true;  // overflows are routine, so only the streak rule can fire
    o.grad_norm = std::numeric_limits<double>::infinity();
    if (d.observe(o).critical()) fired.push_back(s);
    d.record_outcome(false);
  }
  EXPECT_THAT(fired, ElementsAre(4, 7));
}

TEST(Detector, DisabledRulesStayQuiet) {
  GuardOptions opt;
  opt.grad_norm_factor = 0;
  opt.loss_zscore = 0;
  opt.layer_zscore = 0;
  AnomalyDetector d(opt, kLayers, 0);
  warm(d, 30);
  auto o = healthy(30, 50.0, 1e6);
  o.layer_norms = {1e6, 1e6, 1e6, 1e6};
  EXPECT_TRUE(d.observe(o).anomalies.empty());
}

TEST(Detector, StateRoundTripsExactly) {
  AnomalyDetector a(GuardOptions{}, kLayers, 5);
  warm(a, 37);
  AnomalyDetector b(GuardOptions{}, kLayers, 5);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(a.state_dict().dump(), b.state_dict().dump());
  auto o = healthy(37, 3.1);
  EXPECT_EQ(kinds(a.observe(o)), kinds(b.observe(o)));
  EXPECT_EQ(a.state_dict().dump(), b.state_dict().dump());

  AnomalyDetector other(GuardOptions{}, {"only"}, 5);
  try {
    other.load_state_dict(a.state_dict());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("4 layers"));
  }
  EXPECT_THROW(other.load_state_dict(nlohmann::json{{"losses", 1}}), Error);
}

TEST(Detector, EventLineCarriesTheNumbers) {
  Anomaly a{AnomalyKind::kGradNorm, Severity::kCritical, "msg", {{"grad_norm", 12.0}, {"ratio", std::nan("")}},
            {"layers.0"}};
  auto j = to_event(7, a);
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["event"], "anomaly");
  EXPECT_EQ(j["kind"], "grad_norm");
  EXPECT_EQ(j["severity"], "critical");
  EXPECT_EQ(j["grad_norm"], 12.0);
  EXPECT_TRUE(j["ratio"].is_null());
  EXPECT_EQ(j["layers"][0], "layers.0");
}

}  // namespace
}  // namespace gradguard::guard
