// Clipping strategies. `global` against torch.nn.utils.clip_grad_norm_
// (tests/golden/clip.json); history, layerwise, agc and zscore against hand-computed
// cases from their definitions (clip.h); adagc against its paper's formula in float64.
#include "gradguard/grad/clip.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden_util.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

namespace gradguard::grad {
namespace {
using ::testing::HasSubstr;

struct GradSet {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
};

GradSet from_golden(const nlohmann::json& c) {
  GradSet s;
  for (size_t i = 0; i < c["shapes"].size(); ++i) {
    auto shape = c["shapes"][i].get<std::vector<int64_t>>();
    auto p = torch::zeros(shape, torch::requires_grad());
    p.mutable_grad() = test::golden_tensor(c["grads"][i], shape);
    s.params.push_back(p);
    s.names.push_back("p" + std::to_string(i));
  }
  return s;
}

// Gradients with a given global norm spread over two tensors.
GradSet with_norm(double norm) {
  GradSet s;
  auto a = torch::zeros({3}, torch::requires_grad()), b = torch::zeros({4}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f, 0.0f}) * static_cast<float>(norm / 5.0);
  b.mutable_grad() = torch::tensor({0.0f, 4.0f, 0.0f, 0.0f}) * static_cast<float>(norm / 5.0);
  s.params = {a, b};
  s.names = {"a", "b"};
  return s;
}

// Gives the existing tensors of `s` (those a Clipper holds) gradients of norm `norm`.
void set_norm(GradSet& s, double norm) {
  auto fresh = with_norm(norm);
  for (size_t i = 0; i < s.params.size(); ++i) s.params[i].mutable_grad() = fresh.params[i].grad();
}

ClipResult run(Clipper& clipper, GradSet& s) {
  GradStatsComputer stats(s.params, s.names);
  return clipper.apply(stats.compute(1.0, {}, clipper.device_hook()));
}

TEST(Clip, GlobalMatchesTorchClipGradNorm) {
  auto golden = test::load_golden("clip.json");
  ASSERT_GE(golden["cases"].size(), 4u);
  int clipped_cases = 0;
  for (const auto& c : golden["cases"]) {
    auto s = from_golden(c);
    ClipOptions o;
    o.max_norm = c["max_norm"];
    Clipper clipper(o, s.params, s.names);
    auto r = run(clipper, s);
    const double total = c["total_norm"];
    EXPECT_NEAR(r.grad_norm, total, 1e-6 * total);
    if (r.clip_coef < 1) ++clipped_cases;
    for (size_t i = 0; i < s.params.size(); ++i) {
      auto expected = test::golden_tensor(c["clipped"][i], s.params[i].sizes().vec());
      EXPECT_TRUE(torch::allclose(s.params[i].grad(), expected, 1e-7, 1e-12)) << "max_norm " << o.max_norm;
    }
  }
  EXPECT_GE(clipped_cases, 2);  // the golden set exercises both branches
}

TEST(Clip, NoneMeasuresWithoutChanging) {
  auto s = with_norm(50.0);
  ClipOptions o;
  o.strategy = ClipStrategy::kNone;
  Clipper clipper(o, s.params, s.names);
  auto before = s.params[1].grad().clone();
  auto r = run(clipper, s);
  EXPECT_NEAR(r.grad_norm, 50.0, 1e-4);
  EXPECT_EQ(r.clip_coef, 1.0);
  EXPECT_TRUE(std::isinf(r.threshold));
  EXPECT_TRUE(torch::equal(s.params[1].grad(), before));
}

TEST(Clip, HistoryThresholdFollowsTheWindow) {
  ClipOptions o;
  o.strategy = ClipStrategy::kHistory;
  o.max_norm = 1.0;
  o.history_window = 2;
  o.history_factor = 0.8;
  auto s = with_norm(0.5);
  Clipper clipper(o, s.params, s.names);
  auto r = run(clipper, s);  // empty history: threshold = min(cap, 0.8 * cap) = 0.8
  EXPECT_DOUBLE_EQ(r.threshold, 0.8);
  EXPECT_EQ(r.clip_coef, 1.0);
  set_norm(s, 0.3);
  r = run(clipper, s);  // window {0.5}: threshold 0.4, no clip
  EXPECT_NEAR(r.threshold, 0.4, 1e-7);
  set_norm(s, 2.0);
  r = run(clipper, s);  // window {0.5, 0.3}: threshold 0.32 -> coef 0.16
  EXPECT_NEAR(r.threshold, 0.32, 1e-7);
  EXPECT_NEAR(r.clip_coef, 0.16, 1e-6);
  set_norm(s, 0.1);
  r = run(clipper, s);  // window {0.3, 0.32} (clipped norm enters, 0.5 left): 0.8 * 0.31
  EXPECT_NEAR(r.threshold, 0.248, 1e-6);
}

TEST(Clip, LayerwiseClipsEachGroupAlone) {
  auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  auto c = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});   // layers.0: with b, norm sqrt(25+0.25)
  b.mutable_grad() = torch::tensor({0.0f, 0.5f});
  c.mutable_grad() = torch::tensor({0.3f, 0.4f});   // layers.1: norm 0.5, untouched
  GradSet s{{a, b, c}, {"model.layers.0.x.weight", "model.layers.0.y.weight", "model.layers.1.x.weight"}};
  ClipOptions o;
  o.strategy = ClipStrategy::kLayerwise;
  o.max_norm = 1.0;
  Clipper clipper(o, s.params, s.names);
  auto r = run(clipper, s);
  const double n0 = std::sqrt(25.25);
  EXPECT_NEAR(torch::cat({a.grad(), b.grad()}).norm().item<double>(), 1.0, 1e-5);
  EXPECT_TRUE(torch::allclose(c.grad(), torch::tensor({0.3f, 0.4f})));
  EXPECT_NEAR(r.clip_coef, std::sqrt(1.0 + 0.25) / std::sqrt(n0 * n0 + 0.25), 1e-5);
}

TEST(Clip, AgcBoundsEveryRowByItsWeightNorm) {
  // Weight rows have norms 10 and 0 (-> eps = 1e-3); lambda 0.1 allows 1.0 and 1e-4.
  auto w = torch::tensor({{6.0f, 8.0f}, {0.0f, 0.0f}}).requires_grad_();
  w.mutable_grad() = torch::tensor({{3.0f, 4.0f}, {0.6f, 0.8f}});  // row norms 5 and 1
  auto bias = torch::zeros({2}, torch::requires_grad());
  bias.mutable_grad() = torch::tensor({100.0f, 0.0f});  // 1-D: not clipped by AGC
  auto head = torch::ones({2, 2}).requires_grad_();
  head.mutable_grad() = torch::full({2, 2}, 50.0f);     // lm_head: excluded (as in the paper)
  GradSet s{{w, bias, head}, {"model.layers.0.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"}};
  ClipOptions o;
  o.strategy = ClipStrategy::kAgc;
  o.agc_lambda = 0.1;
  o.agc_eps = 1e-3;
  Clipper clipper(o, s.params, s.names);
  auto r = run(clipper, s);
  EXPECT_TRUE(torch::allclose(w.grad(), torch::tensor({{0.6f, 0.8f}, {0.6e-4f, 0.8e-4f}}), 1e-5, 1e-9));
  EXPECT_EQ(bias.grad()[0].item<float>(), 100.0f);
  EXPECT_EQ(head.grad()[0][0].item<float>(), 50.0f);
  const double before = std::sqrt(25.0 + 1.0 + 100.0 * 100.0 + 4 * 2500.0);
  const double after = std::sqrt(1.0 + 1e-8 + 100.0 * 100.0 + 4 * 2500.0);
  EXPECT_NEAR(r.grad_norm, before, 1e-3);
  EXPECT_NEAR(r.clip_coef, after / before, 1e-6);
}

TEST(Clip, ZscoreClipsOutliersAfterWarmup) {
  ClipOptions o;
  o.strategy = ClipStrategy::kZscore;
  o.max_norm = 100.0;
  o.zscore_warmup = 4;
  o.zscore_threshold = 2.0;
  o.zscore_alpha = 0.5;
  auto s = with_norm(1.0);
  Clipper clipper(o, s.params, s.names);
  for (double n : {1.0, 2.0, 1.0, 2.0}) {  // warmup: mean 1.5, variance 0.25 (std 0.5)
    set_norm(s, n);
    EXPECT_EQ(run(clipper, s).clip_coef, 1.0);
  }
  set_norm(s, 2.4);  // z = 1.8: kept; EMA -> mean 1.95, var 0.5*0.25 + 0.5*0.45^2 = 0.22625
  auto r = run(clipper, s);
  EXPECT_NEAR(r.threshold, 1.5 + 2.0 * 0.5, 1e-9);
  EXPECT_EQ(r.clip_coef, 1.0);
  set_norm(s, 10.0);  // z = (10 - 1.95) / sqrt(0.22625) > 2: clipped to 1.95 + 2 * 0.47566
  r = run(clipper, s);
  const double thr = 1.95 + 2.0 * std::sqrt(0.22625);
  EXPECT_NEAR(r.threshold, thr, 1e-6);
  EXPECT_NEAR(r.clip_coef, thr / (10.0 + 1e-6), 1e-6);
  EXPECT_NEAR(s.params[0].grad().norm().item<double>() * 5.0 / 3.0, thr, 1e-4);
}

// AdaGC (Wang et al. 2025, arXiv 2502.11034), its formula evaluated here in float64:
// warmup: global clip at max_norm, gamma_i = min(gamma_i, ||clipped g_i||); after:
// h_i = min(1, lambda gamma_i / ||g_i||), gamma_i <- beta gamma_i + (1 - beta) h_i ||g_i||.
struct ThreeTensors {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names = {"layers.0.a", "layers.0.b", "layers.1.c"};
  ThreeTensors() {
    for (int64_t n : {6, 4, 5}) params.push_back(torch::zeros({n}, torch::requires_grad()));
  }
  // Gradients whose per-tensor norms are `norms` (a fixed direction scaled).
  void set(const std::vector<double>& norms) {
    for (size_t i = 0; i < params.size(); ++i) {
      auto d = torch::arange(1, params[i].numel() + 1, torch::kFloat);
      params[i].mutable_grad() = d / d.norm() * static_cast<float>(norms[i]);
    }
  }
  ClipResult run(Clipper& c) {
    GradStatsComputer stats(params, names);
    return c.apply(stats.compute(1.0, {}, c.device_hook()));
  }
};

TEST(Clip, AdagcFollowsItsFormulaAndClipsOnlyTheSpikedTensor) {
  ClipOptions o;
  o.strategy = ClipStrategy::kAdagc;
  o.max_norm = 1.0;
  o.adagc_warmup = 3;
  o.adagc_lambda = 1.05;
  o.adagc_beta = 0.9;
  ThreeTensors t;
  Clipper c(o, t.params, t.names);
  std::vector<double> gamma(3, INFINITY);
  const std::vector<std::vector<double>> warm = {{0.3, 0.4, 0.5}, {0.9, 0.2, 0.6}, {0.25, 0.5, 0.7}};
  for (const auto& norms : warm) {  // warmup: the global clip of torch, gamma the running minimum
    t.set(norms);
    double g = 0;
    for (double n : norms) g += n * n;
    g = std::sqrt(g);
    const auto r = t.run(c);
    const double coef = std::min(1.0, 1.0 / (g + 1e-6));
    EXPECT_NEAR(r.clip_coef, coef, 1e-6);
    EXPECT_TRUE(r.threshold_is_global);
    for (size_t i = 0; i < 3; ++i) gamma[i] = std::min(gamma[i], coef * norms[i]);
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(c.adagc_gamma()[i], gamma[i], 1e-6 * gamma[i]) << i;

  // A 1000x spike in tensor 1 only: it is clipped to lambda gamma_1, the others untouched.
  const std::vector<double> norms = {0.25, 1000 * 0.18, 0.5};  // 0 and 2 within 1.05 gamma
  t.set(norms);
  const auto before = std::vector<torch::Tensor>{t.params[0].grad().clone(), t.params[2].grad().clone()};
  const auto r = t.run(c);
  EXPECT_FALSE(r.threshold_is_global);
  EXPECT_TRUE(torch::equal(t.params[0].grad(), before[0]));
  EXPECT_TRUE(torch::equal(t.params[2].grad(), before[1]));
  EXPECT_NEAR(t.params[1].grad().norm().item<double>(), 1.05 * gamma[1], 1e-5 * gamma[1]);
  double after = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double h = std::min(1.0, 1.05 * gamma[i] / norms[i]);
    after += std::pow(h * norms[i], 2);
    gamma[i] = 0.9 * gamma[i] + 0.1 * h * norms[i];
    EXPECT_NEAR(c.adagc_gamma()[i], gamma[i], 1e-6 * gamma[i]) << i;
  }
  double g = 0;
  for (double n : norms) g += n * n;
  EXPECT_NEAR(r.clip_coef, std::sqrt(after / g), 1e-6);

  // Tensor 0 at 1.2 x its EMA is clipped to 1.05 x it; a tensor without a gradient is left be.
  t.set({1.2 * gamma[0], 0.4, 0.6});
  t.params[2].mutable_grad() = torch::Tensor();
  const double want0 = 1.05 * gamma[0];
  t.run(c);
  EXPECT_NEAR(t.params[0].grad().norm().item<double>(), want0, 1e-5 * want0);
  EXPECT_FALSE(t.params[2].grad().defined());
}

TEST(Clip, AdagcStateRoundTripsAndRefusesAnotherModel) {
  ClipOptions o;
  o.strategy = ClipStrategy::kAdagc;
  o.adagc_warmup = 2;
  ThreeTensors t;
  Clipper a(o, t.params, t.names), b(o, t.params, t.names);
  for (const auto& n : std::vector<std::vector<double>>{{0.3, 0.4, 0.5}, {0.2, 0.6, 0.4}, {0.3, 0.3, 3.0}}) {
    t.set(n);
    t.run(a);
  }
  b.load_state_dict(nlohmann::json::parse(a.state_dict().dump()));
  EXPECT_EQ(b.adagc_gamma(), a.adagc_gamma());
  for (const auto& n : std::vector<std::vector<double>>{{0.3, 9.0, 0.5}, {0.2, 0.6, 0.4}}) {
    t.set(n);
    const auto ra = t.run(a);
    t.set(n);
    const auto rb = t.run(b);
    EXPECT_EQ(ra.clip_coef, rb.clip_coef);
  }
  auto bad = a.state_dict();
  bad["adagc_gamma"].erase(0);
  try {
    b.load_state_dict(bad, "state.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("adagc_gamma"));
  }
}

TEST(Clip, StateRoundTripContinuesIdentically) {
  ClipOptions o;
  o.strategy = ClipStrategy::kZscore;
  o.zscore_warmup = 3;
  auto s = with_norm(1.0);
  Clipper a(o, s.params, s.names), b(o, s.params, s.names);
  const std::vector<double> norms = {1.0, 1.3, 0.8, 1.1, 4.0, 0.9, 1.2};
  for (size_t i = 0; i < 4; ++i) {
    set_norm(s, norms[i]);
    run(a, s);
  }
  b.load_state_dict(nlohmann::json::parse(a.state_dict().dump()));
  for (size_t i = 4; i < norms.size(); ++i) {
    set_norm(s, norms[i]);
    auto ra = run(a, s);
    set_norm(s, norms[i]);
    auto rb = run(b, s);
    EXPECT_EQ(ra.clip_coef, rb.clip_coef);
    EXPECT_EQ(ra.threshold, rb.threshold);
  }
  ClipOptions other;
  other.strategy = ClipStrategy::kHistory;
  Clipper c(other, s.params, s.names);
  EXPECT_THROW(c.load_state_dict(a.state_dict()), Error);
  EXPECT_THROW(c.load_state_dict(nlohmann::json::object()), Error);
}

TEST(Clip, NonFiniteSkipsOrHalts) {
  auto s = with_norm(1.0);
  s.params[0].grad()[0] = std::numeric_limits<float>::quiet_NaN();
  ClipOptions o;
  Clipper skip(o, s.params, s.names);
  auto r = run(skip, s);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(r.clip_coef, 1.0);
  o.error_if_nonfinite = true;
  Clipper halt(o, s.params, s.names);
  try {
    run(halt, s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_THAT(e.what(), HasSubstr("inf or NaN"));
  }
}

TEST(Clip, RejectsBadOptions) {
  auto expect_key = [](ClipOptions o, const std::string& key) {
    try {
      o.validate();
      FAIL() << key;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(key));
    }
  };
  {
    ClipOptions o;
    o.adagc_lambda = 0.5;
    expect_key(o, "clip.adagc_lambda");
    o = {};
    o.adagc_beta = 1.0;
    expect_key(o, "clip.adagc_beta");
    o = {};
    o.adagc_warmup = -1;
    expect_key(o, "clip.adagc_warmup");
  }
  // An unknown strategy is rejected where the config is read, naming the key and the
  // valid strategies.
  try {
    config::load_config("", {"clip.strategy=adaptive"});
    ADD_FAILURE() << "clip.strategy";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("clip.strategy: 'adaptive' is not valid "
                                    "(valid: none, global, history, layerwise, agc, zscore, adagc)"));
  }
  ClipOptions o;
  o.max_norm = 0;
  expect_key(o, "clip.max_norm");
  o = {};
  o.history_window = 0;
  expect_key(o, "clip.history_window");
  o = {};
  o.zscore_alpha = 1.0;
  expect_key(o, "clip.zscore_alpha");
  o = {};
  o.zscore_warmup = 1;
  expect_key(o, "clip.zscore_warmup");
  o = {};
  o.agc_lambda = -1;
  expect_key(o, "clip.agc_lambda");
}

}  // namespace
}  // namespace gradguard::grad
