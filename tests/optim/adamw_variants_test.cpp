// The AdamW variants (optim/adamw.h) against their papers' formulas written out here in
// float64, one coordinate at a time:
//   Adam-atan2, Everett et al. 2024 (arXiv 2407.05872): p -= lr * a * atan2(m-hat, b * sqrt(v-hat)),
//     a = 1.27, b = 1, no epsilon;
//   update clipping, StableAdamW (Wortsman et al. 2023, arXiv 2304.13013, Algorithm 2): the
//     tensor's lr (update and weight decay) divided by max(1, sqrt(mean(g^2 / max(v-hat, eps^2)))).
// Plus the properties each is for: Adam-atan2's updates do not change when every gradient is
// scaled by 1e-8 (AdamW's do: eps dominates), and update clipping damps a 1000x gradient spike
// in the tensor that spiked while the others keep their step size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "golden_util.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/host_read.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/optimizer.h"
#include "test_util.h"

namespace gradguard::optim {
namespace {

using ::testing::HasSubstr;

struct Hyper {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One tensor's state in the float64 reference.
struct RefTensor {
  std::vector<double> p, m, v;
  double weight_decay = 0;
};

// One step of the reference on one tensor; returns the RMS of update clipping (1 when off).
double reference_step(RefTensor& t, const std::vector<double>& g, int64_t step, const Hyper& h, bool atan2, bool clip) {
  const size_t n = t.p.size();
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  for (size_t i = 0; i < n; ++i) {
    t.m[i] = h.beta1 * t.m[i] + (1 - h.beta1) * g[i];
    t.v[i] = h.beta2 * t.v[i] + (1 - h.beta2) * g[i] * g[i];
  }
  double rms = 1;
  if (clip) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += g[i] * g[i] / std::max(t.v[i] / bc2, h.eps * h.eps);
    rms = std::sqrt(sum / static_cast<double>(n));
  }
  const double lr = h.lr / std::max(1.0, rms);
  for (size_t i = 0; i < n; ++i) {
    const double m_hat = t.m[i] / bc1, v_hat = t.v[i] / bc2;
    const double direction =
        atan2 ? 1.27 * std::atan2(m_hat, 1.0 * std::sqrt(v_hat)) : m_hat / (std::sqrt(v_hat) + h.eps);
    t.p[i] = t.p[i] * (1 - lr * t.weight_decay) - lr * direction;
  }
  return rms;
}

std::vector<double> values(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kDouble).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

OptimOptions options_for(const Hyper& h, OptimizerKind kind, bool clip) {
  OptimOptions o;
  o.name = kind;
  o.lr = h.lr;
  o.betas = {h.beta1, h.beta2};
  o.eps = h.eps;
  o.weight_decay = h.weight_decay;
  o.update_clipping = clip;
  return o;
}

class Variants : public ::testing::TestWithParam<std::tuple<bool, bool>> {};  // (atan2, clip)

TEST_P(Variants, MatchTheFormulaInFloat64) {
  const auto [atan2, clip] = GetParam();
  const Hyper h;
  torch::manual_seed(3);
  // A matrix (decays) and a vector (no decay, as every norm weight and bias).
  auto w = torch::randn({5, 4}, torch::kDouble).requires_grad_();
  auto b = torch::randn({4}, torch::kDouble).requires_grad_();
  RefTensor rw{values(w), std::vector<double>(20, 0.0), std::vector<double>(20, 0.0), h.weight_decay};
  RefTensor rb{values(b), std::vector<double>(4, 0.0), std::vector<double>(4, 0.0), 0.0};
  auto opt = make_optimizer({{"w", w}, {"b", b}},
                            options_for(h, atan2 ? OptimizerKind::kAdamAtan2 : OptimizerKind::kAdamW, clip));
  auto* group = dynamic_cast<GroupAdamW*>(opt.get());
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->rule(), atan2 ? AdamWRule::kAtan2 : AdamWRule::kAdam);
  EXPECT_EQ(group->update_clipping(), clip);
  double max_rms = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    auto gw = torch::randn({5, 4}, torch::kDouble);
    if (step == 4) gw.mul_(50);  // a spike: update clipping must act here
    auto gb = torch::randn({4}, torch::kDouble) * 0.1;
    w.mutable_grad() = gw;
    b.mutable_grad() = gb;
    opt->step();
    max_rms = std::max(max_rms, reference_step(rw, values(gw), step, h, atan2, clip));
    reference_step(rb, values(gb), step, h, atan2, clip);
    const auto got_w = values(w), got_b = values(b);
    for (size_t i = 0; i < got_w.size(); ++i)
      ASSERT_NEAR(got_w[i], rw.p[i], 1e-12 * std::max(1.0, std::abs(rw.p[i]))) << "step " << step << " w[" << i << "]";
    for (size_t i = 0; i < got_b.size(); ++i)
      ASSERT_NEAR(got_b[i], rb.p[i], 1e-12 * std::max(1.0, std::abs(rb.p[i]))) << "step " << step << " b[" << i << "]";
  }
  // At the spike g^2 / v-hat ~ (1 - beta2^4) / (1 - beta2) ~ 3.7 per coordinate.
  if (clip) EXPECT_GT(max_rms, 1.5) << "the spike should have been clipped: the test would not see the clipping";
}

INSTANTIATE_TEST_SUITE_P(Rules, Variants,
                         ::testing::Values(std::make_tuple(true, false), std::make_tuple(false, true),
                                           std::make_tuple(true, true)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Atan2" : "AdamW") +
                                  (std::get<1>(info.param) ? "UpdateClipping" : "");
                         });

// Params after `steps` updates from the same start with gradients g_k * scale.
torch::Tensor after_steps(OptimizerKind kind, double scale, int steps) {
  torch::manual_seed(11);
  auto w = torch::randn({8, 8}).requires_grad_();
  OptimOptions o;
  o.name = kind;
  o.lr = 1e-3;
  o.weight_decay = 0;
  auto opt = make_optimizer({{"w", w}}, o);
  const auto start = w.detach().clone();
  for (int k = 0; k < steps; ++k) {
    w.mutable_grad() = torch::randn({8, 8}) * 1e-2 * scale;
    opt->step();
  }
  return w.detach() - start;
}

TEST(AdamAtan2, UpdatesDoNotChangeWhenEveryGradientIsScaledBy1e8) {
  const auto atan2 = after_steps(OptimizerKind::kAdamAtan2, 1.0, 4);
  const auto atan2_small = after_steps(OptimizerKind::kAdamAtan2, 1e-8, 4);
  // float32 rounding of m and sqrt(v) at two scales: a few ulps of the update.
  EXPECT_LT(test::max_rel_diff(atan2_small, atan2), 1e-5);
  // AdamW: at 1e-10-sized gradients sqrt(v-hat) ~ 1e-10 is far below eps = 1e-8, so its
  // update shrinks about a hundredfold.
  const auto adamw = after_steps(OptimizerKind::kAdamW, 1.0, 4);
  const auto adamw_small = after_steps(OptimizerKind::kAdamW, 1e-8, 4);
  EXPECT_LT(adamw_small.abs().max().item<double>(), 0.05 * adamw.abs().max().item<double>());
}

// Two tensors; at the last of 20 steps one gets a gradient 1000x its usual size.
std::pair<torch::Tensor, torch::Tensor> spike_updates(bool clip) {
  constexpr int kSteps = 20;
  torch::manual_seed(5);
  auto a = torch::randn({16, 16}).requires_grad_();
  auto b = torch::randn({16, 16}).requires_grad_();
  OptimOptions o;
  o.lr = 1e-2;
  o.update_clipping = clip;
  auto opt = make_optimizer({{"a", a}, {"b", b}}, o);
  torch::Tensor before_a, before_b;
  for (int step = 1; step <= kSteps; ++step) {
    auto ga = torch::randn({16, 16}) * 1e-2;
    if (step == kSteps) {
      ga.mul_(1000);
      before_a = a.detach().clone();
      before_b = b.detach().clone();
    }
    a.mutable_grad() = ga;
    b.mutable_grad() = torch::randn({16, 16}) * 1e-2;
    opt->step();
  }
  return {a.detach() - before_a, b.detach() - before_b};
}

TEST(UpdateClipping, DampsASpikeOnlyInTheTensorThatSpiked) {
  const auto [plain_a, plain_b] = spike_updates(false);
  const auto [clipped_a, clipped_b] = spike_updates(true);
  // The spiking tensor: the spike dominates v, so g^2 / v-hat ~ (1 - beta2^20) / (1 - beta2)
  // = 12.8 per coordinate and its learning rate is divided by about sqrt(12.8) = 3.6.
  const double ratio = clipped_a.norm().item<double>() / plain_a.norm().item<double>();
  EXPECT_LT(ratio, 0.36);
  EXPECT_GT(ratio, 0.2);
  // The quiet tensor keeps its step size: its RMS stays near 1 (random gradients push it a
  // little above 1 on some steps, so its trajectory differs slightly from AdamW's).
  const double quiet = clipped_b.norm().item<double>() / plain_b.norm().item<double>();
  EXPECT_NEAR(quiet, 1.0, 0.02);
}

TEST(UpdateClipping, StepOneIsAdamWsStep) {
  // v-hat = g^2 at the first step: RMS = 1, nothing is clipped.
  torch::manual_seed(2);
  const auto start = torch::randn({6, 6});
  const auto grad = torch::randn({6, 6});
  torch::Tensor out[2];
  for (int clip = 0; clip < 2; ++clip) {
    auto w = start.clone().requires_grad_();
    OptimOptions o;
    o.update_clipping = clip == 1;
    auto opt = make_optimizer({{"w", w}}, o);
    w.mutable_grad() = grad.clone();
    opt->step();
    out[clip] = w.detach();
  }
  EXPECT_LT(test::max_rel_diff(out[1], out[0]), 1e-6);
}

TEST(AdamWVariants, StepReadsNothingOnTheHost) {
  // The per-tensor learning rate of update clipping stays on the device: the guarded step's
  // one host read per step is not spent here.
  auto w = torch::randn({4, 4}).requires_grad_();
  auto b = torch::randn({4}).requires_grad_();
  OptimOptions o;
  o.name = OptimizerKind::kAdamAtan2;
  o.update_clipping = true;
  auto opt = make_optimizer({{"w", w}, {"b", b}}, o);
  for (int step = 0; step < 3; ++step) {
    w.mutable_grad() = torch::randn({4, 4});
    b.mutable_grad() = torch::randn({4});
    HostReadCounter reads;
    opt->step();
    EXPECT_EQ(reads.count(), 0) << "step " << step;
  }
}

TEST(AdamWVariants, BadCombinationsNameTheKey) {
  auto w = torch::zeros({2, 2}).requires_grad_();
  for (auto kind : {OptimizerKind::kLamb, OptimizerKind::kLars}) {
    OptimOptions o;
    o.name = kind;
    o.update_clipping = true;
    EXPECT_THAT(test::bad_input_message([&] { make_optimizer({{"w", w}}, o); }),
                HasSubstr("optim.update_clipping: applies to adamw and adam_atan2"));
  }
  for (auto impl : {AdamWImplementation::kFused, AdamWImplementation::kLoop}) {
    OptimOptions o;
    o.name = OptimizerKind::kAdamAtan2;
    o.implementation = impl;
    const auto message = test::bad_input_message([&] { make_optimizer({{"w", w}}, o); });
    // fused may already be refused as missing from this LibTorch: either way the key is named.
    EXPECT_THAT(message, HasSubstr("optim.implementation"));
  }
  OptimOptions o;
  o.update_clipping = true;
  o.implementation = AdamWImplementation::kLoop;
  EXPECT_THAT(test::bad_input_message([&] { make_optimizer({{"w", w}}, o); }),
              HasSubstr("optim.implementation: 'loop' has no kernel for optim.update_clipping"));
}

TEST(AdamWVariants, ConfigSelectsThem) {
  auto cfg = config::load_config("", {"optim.name=adam_atan2", "optim.update_clipping=true"});
  EXPECT_EQ(cfg.optim.name, OptimizerKind::kAdamAtan2);
  EXPECT_TRUE(cfg.optim.update_clipping);
  auto w = torch::zeros({2, 2}).requires_grad_();
  auto opt = make_optimizer({{"w", w}}, cfg.optim);
  auto* group = dynamic_cast<GroupAdamW*>(opt.get());
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->kernel(), AdamWKernel::foreach);
  EXPECT_EQ(group->rule(), AdamWRule::kAtan2);
}

}  // namespace
}  // namespace gradguard::optim
