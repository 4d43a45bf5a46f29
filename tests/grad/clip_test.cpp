// Global-norm clipping against torch.nn.utils.clip_grad_norm_ (tests/golden/clip.json).
#include "gradguard/grad/clip.h"

#include <gtest/gtest.h>

#include "golden_util.h"
#include "gradguard/core/error.h"

namespace gradguard::grad {
namespace {

std::vector<torch::Tensor> params_with_grads(const nlohmann::json& c) {
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < c["shapes"].size(); ++i) {
    auto shape = c["shapes"][i].get<std::vector<int64_t>>();
    auto p = torch::zeros(shape, torch::requires_grad());
    p.mutable_grad() = test::golden_tensor(c["grads"][i], shape);
    params.push_back(p);
  }
  return params;
}

TEST(Clip, MatchesTorchClipGradNorm) {
  auto golden = test::load_golden("clip.json");
  ASSERT_GE(golden["cases"].size(), 4u);
  int clipped_cases = 0;
  for (const auto& c : golden["cases"]) {
    auto params = params_with_grads(c);
    ClipOptions o;
    o.max_norm = c["max_norm"];
    auto r = clip_gradients(params, o);
    const double total = c["total_norm"];
    EXPECT_NEAR(r.grad_norm, total, 1e-6 * total);
    if (r.clip_coef < 1) ++clipped_cases;
    for (size_t i = 0; i < params.size(); ++i) {
      auto expected = test::golden_tensor(c["clipped"][i], params[i].sizes().vec());
      // Same float32 arithmetic as torch: equal to the last bit or one ulp.
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected, 1e-7, 1e-9)) << "case max_norm " << o.max_norm;
    }
  }
  EXPECT_GE(clipped_cases, 2);  // the golden set exercises both branches
}

TEST(Clip, NoneMeasuresWithoutChanging) {
  auto golden = test::load_golden("clip.json");
  const auto& c = golden["cases"][1];
  auto params = params_with_grads(c);
  std::vector<torch::Tensor> before;
  for (auto& p : params) before.push_back(p.grad().clone());
  ClipOptions o;
  o.strategy = "none";
  o.max_norm = 1e-3;
  auto r = clip_gradients(params, o);
  EXPECT_NEAR(r.grad_norm, c["total_norm"].get<double>(), 1e-5);
  EXPECT_EQ(r.clip_coef, 1.0);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), before[i]));
}

TEST(Clip, SkipsParametersWithoutGradient) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  auto r = clip_gradients({a, b}, ClipOptions{});
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-6);
  EXPECT_NEAR(r.clip_coef, 1.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_FALSE(b.grad().defined());
}

TEST(Clip, NonFiniteGradientGivesNonFiniteNorm) {
  auto a = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(std::isfinite(clip_gradients({a}, ClipOptions{}).grad_norm));
}

TEST(Clip, RejectsBadOptions) {
  ClipOptions o;
  o.strategy = "adaptive";
  EXPECT_THROW(o.validate(), Error);
  o = {};
  o.max_norm = 0;
  try {
    o.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clip.max_norm"), std::string::npos);
  }
}

}  // namespace
}  // namespace gradguard::grad
