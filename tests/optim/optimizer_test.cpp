// AdamW against torch.optim.AdamW with two param groups (tests/golden/adamw.json).
#include "gradguard/optim/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden_util.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
namespace {

TEST(AdamW, MatchesTorchAdamWWithDecayGroups) {
  auto g = test::load_golden("adamw.json");
  auto wshape = g["shapes"]["weight"].get<std::vector<int64_t>>();
  auto bshape = g["shapes"]["bias"].get<std::vector<int64_t>>();
  auto weight = test::golden_tensor(g["init"]["weight"], wshape).requires_grad_();
  auto bias = test::golden_tensor(g["init"]["bias"], bshape).requires_grad_();
  OptimOptions o;
  o.betas = {g["betas"][0].get<double>(), g["betas"][1].get<double>()};
  o.eps = g["eps"];
  o.weight_decay = g["weight_decay"]["weight"];
  ASSERT_EQ(g["weight_decay"]["bias"].get<double>(), 0.0);  // our rule: no decay on dim < 2
  auto opt = make_optimizer({{"weight", weight}, {"bias", bias}}, o);
  for (const auto& step : g["steps"]) {
    set_learning_rate(*opt, step["lr"].get<double>());
    weight.mutable_grad() = test::golden_tensor(step["grads"]["weight"], wshape);
    bias.mutable_grad() = test::golden_tensor(step["grads"]["bias"], bshape);
    opt->step();
    EXPECT_LT(test::max_rel_diff(weight, test::golden_tensor(step["params"]["weight"], wshape)), 1e-6);
    EXPECT_LT(test::max_rel_diff(bias, test::golden_tensor(step["params"]["bias"], bshape)), 1e-6);
  }
}

TEST(AdamW, DecayOnlyOnMatrices) {
  auto w = torch::ones({2, 2}, torch::requires_grad());
  auto b = torch::ones({2}, torch::requires_grad());
  OptimOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  auto opt = make_optimizer({{"w", w}, {"b", b}}, o);
  w.mutable_grad() = torch::zeros({2, 2});
  b.mutable_grad() = torch::zeros({2});
  opt->step();  // zero gradient: only decay moves the weights
  EXPECT_TRUE(torch::allclose(w, torch::full({2, 2}, 1.0f - 0.1f * 0.5f)));
  EXPECT_TRUE(torch::equal(b, torch::ones({2})));
}

TEST(AdamW, RejectsBadOptions) {
  auto check = [](OptimOptions o, const std::string& key) {
    try {
      o.validate();
      FAIL() << key;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(key));
    }
  };
  OptimOptions o;
  o.lr = -1e-3;
  check(o, "optim.lr");
  o = {};
  o.betas = {0.9, 1.0};
  check(o, "optim.betas");
  o = {};
  o.name = "sgdd";
  check(o, "optim.name");
  o = {};
  o.eps = 0;
  check(o, "optim.eps");
  o = {};
  o.weight_decay = -0.1;
  check(o, "optim.weight_decay");
}

}  // namespace
}  // namespace gradguard::optim
