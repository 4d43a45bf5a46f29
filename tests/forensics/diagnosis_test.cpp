// The diagnosis rules on hand-made evidence, and the Adam evidence computed from a real
// optimizer state against the formulas of torch.optim.AdamW.
#include "gradguard/forensics/diagnosis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/forensics/snapshot.h"
#include "gradguard/optim/optimizer.h"

namespace gradguard::forensics {
namespace {

using ::testing::HasSubstr;
using guard::AnomalyKind;
using guard::Severity;

DiagnosisInput spike_input() {
  DiagnosisInput in;
  in.step = 40;
  in.anomalies = {{AnomalyKind::kLossSpike, Severity::kCritical, "loss 4.8 against 1.2", {}, {}}};
  in.loss = 4.8;
  in.loss_mean = 1.2;
  in.grad_norm = 0.8;
  in.clip_threshold = 1.0;
  in.lr = 1e-3;
  in.peak_lr = 3e-3;
  in.warmup_steps = 10;
  in.scaler_mode = amp::ScalerMode::kOff;
  return in;
}

TEST(Diagnosis, AnOutlierMicroBatchPointsAtTheData) {
  auto in = spike_input();
  in.micro_losses = {1.2, 1.25, 1.18, 9.5};
  auto d = diagnose(in);
  ASSERT_FALSE(d.causes.empty());
  EXPECT_EQ(d.causes[0].id, "data");
  EXPECT_THAT(d.causes[0].evidence[0], HasSubstr("micro-batch 3"));
  auto md = d.to_markdown(in, "Step 40: loss_spike");
  EXPECT_THAT(md, HasSubstr("1. **data**"));
  auto j = d.to_json(in);
  EXPECT_EQ(j["causes"][0]["cause"], "data");
  EXPECT_EQ(j["micro_losses"].size(), 4u);
}

TEST(Diagnosis, InjectedFaultsRankFirst) {
  auto in = spike_input();
  in.injected = "spike_batch";
  in.micro_losses = {1.2, 1.25, 1.18, 9.5};
  EXPECT_EQ(diagnose(in).causes[0].id, "injected");
}

TEST(Diagnosis, TinySecondMomentsPointAtEpsilon) {
  auto in = spike_input();
  in.anomalies = {{AnomalyKind::kGradNorm, Severity::kCritical, "norm 40", {}, {"embed_tokens"}}};
  in.grad_norm = 40;
  in.layers = {{"embed_tokens", 40, 0.5, 1e-9, 0.8, 25.0, 0.9}};
  auto d = diagnose(in);
  EXPECT_EQ(d.causes[0].id, "adam_epsilon");
  EXPECT_THAT(d.causes[0].evidence[0], HasSubstr("80% of elements"));
}

TEST(Diagnosis, ScaleGrowthBeforeAnOverflowStorm) {
  auto in = spike_input();
  in.anomalies = {{AnomalyKind::kBackoffStorm, Severity::kCritical, "3 backoffs", {}, {}}};
  in.scaler_mode = amp::ScalerMode::kDynamic;
  in.last_scale_growth = 35;
  auto d = diagnose(in);
  EXPECT_EQ(d.causes[0].id, "loss_scale");
  EXPECT_THAT(d.causes[0].evidence[0], HasSubstr("grew at step 35"));
}

TEST(Diagnosis, HotThrottledGpuAndASlowStepPointAtHardware) {
  auto in = spike_input();
  in.anomalies = {{AnomalyKind::kGradNorm, Severity::kCritical, "norm 40", {}, {}}};
  telemetry::Sample s;
  telemetry::GpuSample gpu;
  gpu.index = 0;
  gpu.temperature_c = 91;
  s.gpus.push_back(gpu);
  in.telemetry = {s};
  in.recent_step_seconds = {1, 1, 1, 1, 1, 5};
  auto d = diagnose(in);
  const auto it = std::find_if(d.causes.begin(), d.causes.end(), [](const Cause& c) { return c.id == "hardware"; });
  ASSERT_NE(it, d.causes.end());
  EXPECT_THAT(it->evidence[0], HasSubstr("91 C"));
  EXPECT_THAT(it->evidence.back(), HasSubstr("5 s against a median of 1 s"));
}

TEST(Diagnosis, NothingMatchedSaysSo) {
  DiagnosisInput in;
  in.anomalies = {{AnomalyKind::kGradNorm, Severity::kCritical, "x", {}, {}}};
  in.scaler_mode = amp::ScalerMode::kOff;
  auto d = diagnose(in);
  ASSERT_EQ(d.causes.size(), 1u);
  EXPECT_EQ(d.causes[0].id, "unknown");
}

TEST(Diagnosis, LayerEvidenceFollowsAdamW) {
  torch::manual_seed(3);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  torch::optim::AdamW opt({w}, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8));
  for (int i = 0; i < 3; ++i) {
    w.mutable_grad() = torch::full({8, 8}, 1e-3);
    opt.step();
  }
  w.mutable_grad() = torch::full({8, 8}, 1.0);  // a gradient 1000x the usual
  const std::vector<at::Tensor> params = {w};
  auto moments = [&](size_t i) { return optim::moments_of(opt, params[i]); };
  auto e = layer_evidence(moments, "w", params, {0}, 0.9, 0.999, 1e-8, 8.0, 0.008);
  // Every past gradient was 1e-3, so sqrt(v_hat) = 1e-3 and m_hat / sqrt(v_hat) = 1.
  EXPECT_NEAR(e.sqrt_v_rms, 1e-3, 1e-9);
  EXPECT_NEAR(e.previous_update_rms, 1.0, 1e-4);
  // t = 4: m = 0.9 m + 0.1, v = 0.999 v + 0.001; AdamW's update (m/bc1) / (sqrt(v/bc2) + eps).
  const double b1 = 0.9, b2 = 0.999;
  const double m3 = 1e-3 * (1 - std::pow(b1, 3)), v3 = 1e-6 * (1 - std::pow(b2, 3));
  const double m4 = b1 * m3 + (1 - b1) * 1.0, v4 = b2 * v3 + (1 - b2) * 1.0;
  const double expected = (m4 / (1 - std::pow(b1, 4))) / (std::sqrt(v4 / (1 - std::pow(b2, 4))) + 1e-8);
  EXPECT_NEAR(e.update_rms, expected, 1e-6 * expected);
  EXPECT_EQ(e.tiny_v_fraction, 0.0);
}

TEST(SnapshotBudget, CountIntervalAndDiskBudget) {
  guard::SnapshotOptions o;
  o.max_count = 2;
  o.min_interval = 10;
  o.max_mb = 1;
  SnapshotBudget b(o);
  std::string why;
  EXPECT_TRUE(b.allow(0, false, 600 * 1024, &why));
  b.record(0, 600 * 1024);
  EXPECT_FALSE(b.allow(5, false, 1, &why));
  EXPECT_THAT(why, HasSubstr("min_interval"));
  EXPECT_TRUE(b.allow(5, /*force=*/true, 1, &why));
  EXPECT_FALSE(b.allow(20, false, 600 * 1024, &why));
  EXPECT_THAT(why, HasSubstr("guard.snapshot.max_mb"));
  EXPECT_TRUE(b.allow(20, false, 100 * 1024, &why));
  b.record(20, 100 * 1024);
  EXPECT_FALSE(b.allow(40, true, 1, &why));
  EXPECT_THAT(why, HasSubstr("max_count"));
  SnapshotBudget copy(o);
  copy.load_state_dict(b.state_dict());
  EXPECT_EQ(copy.state_dict().dump(), b.state_dict().dump());
  o.enabled = false;
  EXPECT_FALSE(SnapshotBudget(o).allow(0, true, 1, &why));
  EXPECT_THAT(why, HasSubstr("enabled is false"));
}

}  // namespace
}  // namespace gradguard::forensics
