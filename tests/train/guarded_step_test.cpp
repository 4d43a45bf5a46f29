// guarded_update: the optimizer steps on a finite step and not on one whose gradients
// hold an inf; the loss and the clipping it reports are the ones it was given / computed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "gradguard/guard/guard_options.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/train/guarded_step.h"

namespace gradguard::train {
namespace {

struct Parts {
  torch::Tensor w = torch::ones({4, 3}, torch::requires_grad());
  std::vector<torch::Tensor> params{w};
  std::vector<std::string> names{"layers.0.w"};
  std::unique_ptr<torch::optim::Optimizer> opt;
  amp::LossScaler scaler{amp::LossScalerOptions{}, "dynamic"};
  grad::GradStatsComputer stats{params, names};
  grad::Clipper clipper{grad::ClipOptions{}, params, names};
  guard::AnomalyDetector detector{guard::GuardOptions{}, stats.groups().names, 0};
  Parts() {
    optim::OptimOptions o;
    o.lr = 0.1;
    opt = optim::make_optimizer({{"layers.0.w", w}}, o);
  }
};

TEST(GuardedUpdate, StepsOnFiniteGradientsAndClipsToMaxNorm) {
  Parts p;
  // Gradient of norm 2 * sqrt(12) ~ 6.93 with the scale's factor; max_norm 1 clips it.
  const double scale = p.scaler.scale();
  p.w.mutable_grad() = torch::full({4, 3}, 2.0 * scale);
  const auto g = guarded_update(0, scale, {torch::tensor(3.5)}, p.stats, p.clipper, p.scaler, p.detector, *p.opt);
  EXPECT_TRUE(g.applied);
  EXPECT_FALSE(g.scaler.skipped);
  EXPECT_DOUBLE_EQ(g.stats.extras[0], 3.5);
  EXPECT_NEAR(g.clip.grad_norm, 2.0 * std::sqrt(12.0), 1e-4);  // unscaled by 1/scale
  EXPECT_LT(g.clip.clip_coef, 1.0);
  EXPECT_FALSE(torch::equal(p.w.detach(), torch::ones({4, 3})));  // AdamW moved the weights
}

TEST(GuardedUpdate, SkipsTheOptimizerOnAnInfGradient) {
  Parts p;
  const double scale = p.scaler.scale();
  auto grad = torch::ones({4, 3});
  grad[1][2] = std::numeric_limits<float>::infinity();
  p.w.mutable_grad() = grad;
  const auto g = guarded_update(0, scale, {torch::tensor(2.0)}, p.stats, p.clipper, p.scaler, p.detector, *p.opt);
  EXPECT_FALSE(g.applied);
  EXPECT_TRUE(g.scaler.skipped);
  EXPECT_TRUE(g.stats.nonfinite);
  EXPECT_TRUE(torch::equal(p.w.detach(), torch::ones({4, 3})));  // untouched
  EXPECT_LT(p.scaler.scale(), scale);                              // backed off
}

}  // namespace
}  // namespace gradguard::train
