// SPAM (Huang et al. 2025, arXiv 2501.06842: Spike-Aware Adam with Momentum Reset) against
// its formula written out here in float64, one coordinate at a time, over enough steps to
// pass two moment resets: every reset_every updates m = v = 0; from clip_delay updates
// after the start and after each reset, a coordinate with g^2 > theta * v (v before the
// step) takes sign(g) sqrt(theta * v), unless v = 0; the k-th update after a reset is
// scaled by 1 - 0.99 (1 + cos(pi k / (warmup + 1))) / 2 for k < warmup (the paper's cosine
// decay of 0.99). The rest is torch.optim.AdamW's update with the bias correction counting
// on through resets. Plus what it is for: a 1000x spike in one coordinate inflates its
// second moment by at most beta2 + (1 - beta2) theta, where AdamW's takes the whole spike
// and silences that coordinate for hundreds of steps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/optimizer.h"

namespace gradguard::optim {
namespace {

using ::testing::HasSubstr;

struct Spam {
  double theta = 50;
  int64_t reset_every = 10, warmup = 4, clip_delay = 3;
};

struct Ref {
  std::vector<double> p, m, v;
};

// One step of the reference on one tensor; `t` counts this update (1-based).
void reference_step(Ref& r, std::vector<double> g, int64_t t, double lr, double b1, double b2, double eps,
                    double wd, const Spam& s) {
  const size_t n = r.p.size();
  if (t % s.reset_every == 0)
    for (size_t i = 0; i < n; ++i) r.m[i] = 0, r.v[i] = 0;
  const bool clips = t >= s.clip_delay && t % s.reset_every >= s.clip_delay;
  for (size_t i = 0; i < n; ++i)
    if (clips && r.v[i] > 0 && g[i] * g[i] > s.theta * r.v[i]) g[i] = (g[i] > 0 ? 1 : -1) * std::sqrt(s.theta * r.v[i]);
  double factor = 1;
  const int64_t k = t % s.reset_every;
  if (t >= s.reset_every && k < s.warmup) factor = 1 - 0.99 * (1 + std::cos(M_PI * k / (s.warmup + 1.0))) / 2;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
  for (size_t i = 0; i < n; ++i) {
    r.m[i] = b1 * r.m[i] + (1 - b1) * g[i];
    r.v[i] = b2 * r.v[i] + (1 - b2) * g[i] * g[i];
    r.p[i] = r.p[i] * (1 - lr * wd) - lr * factor * (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + eps);
  }
}

std::vector<double> values(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kDouble).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

OptimOptions spam_options(const Spam& s) {
  OptimOptions o;
  o.lr = 1e-2;
  o.betas = {0.9, 0.95};
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.spam_threshold = s.theta;
  o.spam_reset_every = s.reset_every;
  o.spam_warmup = s.warmup;
  o.spam_clip_delay = s.clip_delay;
  return o;
}

TEST(Spam, MatchesTheFormulaInFloat64AcrossTwoResets) {
  const Spam s;
  const auto o = spam_options(s);
  torch::manual_seed(11);
  auto w = torch::randn({6, 3}, torch::kDouble).requires_grad_();
  Ref ref{values(w), std::vector<double>(18, 0.0), std::vector<double>(18, 0.0)};
  auto opt = make_optimizer({{"w", w}}, o);
  auto* group = dynamic_cast<GroupAdamW*>(opt.get());
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->kernel(), AdamWKernel::foreach);  // auto resolves SPAM to foreach
  int clipped_steps = 0;
  for (int64_t t = 1; t <= 25; ++t) {
    auto g = torch::randn({6, 3}, torch::kDouble) * 0.1;
    // Spikes: in coordinate 4 at steps 6 and 17 (clipped), and at step 12 (within the
    // clip delay after the reset at 10: not clipped); coordinate 7 is zero until step 14
    // (v = 0: never clipped).
    if (t == 6 || t == 12) g.view(-1)[4] = 100.0;
    if (t == 17) g.view(-1)[4] = -1000.0;
    if (t < 14) g.view(-1)[7] = 0.0;
    const auto gv = values(g);
    if ((t == 6 || t == 17) && gv[4] * gv[4] > s.theta * ref.v[4]) ++clipped_steps;
    w.mutable_grad() = g;
    opt->step();
    reference_step(ref, gv, t, o.lr, o.betas[0], o.betas[1], o.eps, o.weight_decay, s);
    const auto got = values(w);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref.p[i], 1e-12 * (1 + std::abs(ref.p[i]))) << "step " << t;
  }
  EXPECT_EQ(clipped_steps, 2);  // both spikes outside the delay exceeded theta * v
}

TEST(Spam, TheWarmupFactorFollowsTheCosineAndResetsZeroTheMoments) {
  SpamRule r{50, 10, 4, 3};
  EXPECT_EQ(r.lr_factor(1), 1.0);   // before the first reset: the schedule's own warmup applies
  EXPECT_EQ(r.lr_factor(9), 1.0);
  EXPECT_NEAR(r.lr_factor(10), 0.01, 1e-15);  // the reset itself: 1 - 0.99
  EXPECT_NEAR(r.lr_factor(12), 1 - 0.99 * (1 + std::cos(M_PI * 2 / 5)) / 2, 1e-15);
  EXPECT_EQ(r.lr_factor(14), 1.0);  // k = warmup: done
  EXPECT_TRUE(r.resets_at(10));
  EXPECT_TRUE(r.resets_at(20));
  EXPECT_FALSE(r.resets_at(15));
  EXPECT_FALSE(r.clips_at(2));   // clip delay after the start
  EXPECT_TRUE(r.clips_at(3));
  EXPECT_FALSE(r.clips_at(11));  // and after a reset
  EXPECT_TRUE(r.clips_at(13));
  r.reset_every = 0;  // no resets: clipping only, no warmups
  EXPECT_TRUE(r.clips_at(1000));
  EXPECT_EQ(r.lr_factor(1000), 1.0);
  EXPECT_FALSE(r.resets_at(1000));
}

TEST(Spam, ASpikeInflatesTheSecondMomentByAtMostTheThreshold) {
  // The same 1000x spike in one coordinate after 30 calm steps, with and without SPAM (no
  // reset in this window). Under AdamW the spike's square enters v and silences that
  // coordinate's updates for hundreds of steps; SPAM's clipped spike multiplies v by at
  // most beta2 + (1 - beta2) theta, and the first moment takes sqrt(theta v) in its place.
  const double theta = 5000, beta1 = 0.9, beta2 = 0.95;
  auto run = [&](double spam, double* v_before, double* m_before) {
    torch::manual_seed(5);
    auto w = torch::zeros({64}, torch::kDouble).requires_grad_();
    OptimOptions o;
    o.lr = 1e-3, o.weight_decay = 0, o.betas = {beta1, beta2}, o.spam_threshold = spam, o.spam_reset_every = 0;
    auto opt = make_optimizer({{"w", w}}, o);
    for (int t = 1; t <= 31; ++t) {
      auto g = torch::randn({64}, torch::kDouble) * 0.01;
      if (t == 31) {
        const auto st = moments_of(*opt, w);
        *v_before = st.exp_avg_sq[0].item<double>();
        *m_before = st.exp_avg[0].item<double>();
        g[0] = 10.0;
      }
      w.mutable_grad() = g;
      opt->step();
    }
    const auto st = moments_of(*opt, w);
    return std::vector<double>{st.exp_avg[0].item<double>(), st.exp_avg_sq[0].item<double>(),
                               st.exp_avg_sq[1].item<double>()};
  };
  double v0 = 0, m0 = 0, pv0 = 0, pm0 = 0;
  const auto spam = run(theta, &v0, &m0), plain = run(0, &pv0, &pm0);
  EXPECT_EQ(v0, pv0);  // the same 30 calm steps
  EXPECT_NEAR(spam[1], (beta2 + (1 - beta2) * theta) * v0, 1e-12 * spam[1]);
  EXPECT_NEAR(spam[0], beta1 * m0 + (1 - beta1) * std::sqrt(theta * v0), 1e-12);
  EXPECT_NEAR(plain[1], beta2 * v0 + (1 - beta2) * 100.0, 1e-12);
  EXPECT_GT(plain[1], 50 * spam[1]);  // AdamW's v took the whole spike
  EXPECT_EQ(spam[2], plain[2]);       // other coordinates: untouched
}

TEST(Spam, BadSettingsNameTheirKey) {
  struct Case {
    void (*set)(OptimOptions&);
    const char* key;
  };
  const std::vector<Case> cases = {
      {[](OptimOptions& o) { o.spam_threshold = -1; }, "optim.spam_threshold"},
      {[](OptimOptions& o) { o.spam_threshold = std::nan(""); }, "optim.spam_threshold"},
      {[](OptimOptions& o) { o.spam_reset_every = -5; }, "optim.spam_reset_every"},
      {[](OptimOptions& o) { o.spam_warmup = -1; }, "optim.spam_warmup"},
      {[](OptimOptions& o) { o.spam_clip_delay = -1; }, "optim.spam_clip_delay"},
      {[](OptimOptions& o) { o.spam_threshold = 5000, o.spam_reset_every = 20, o.spam_clip_delay = 20; },
       "optim.spam_clip_delay"},
      {[](OptimOptions& o) { o.spam_threshold = 5000, o.name = OptimizerKind::kLamb; }, "optim.spam_threshold"},
  };
  for (const auto& c : cases) {
    OptimOptions o;
    c.set(o);
    try {
      o.validate();
      ADD_FAILURE() << c.key << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), c.key);
    }
  }
  // An explicit fused kernel has no SPAM.
  OptimOptions o;
  o.spam_threshold = 5000;
  o.implementation = AdamWImplementation::kFused;
  auto w = torch::zeros({4}, torch::kFloat).requires_grad_();
  try {
    make_optimizer({{"w", w}}, o);
    ADD_FAILURE() << "fused with SPAM was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "optim.implementation");
  }
}

}  // namespace
}  // namespace gradguard::optim
