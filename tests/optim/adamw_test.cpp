// GroupAdamW's kernels: each against torch.optim.AdamW (tests/golden/adamw.json, made by
// tests/golden/make_golden.py with python3-torch), foreach bit-identical to LibTorch's
// per-tensor AdamW, fused within float rounding of it, and the state behaviours the
// guard relies on (reset moments, checkpoints, tensors without gradients).
#include "gradguard/optim/adamw.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include <torch/torch.h>

#include "golden_util.h"
#include "gradguard/config/config.h"
#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"
#include "gradguard/optim/optimizer.h"

namespace gradguard::optim {
namespace {

bool fused_here() { return compat::fused_adamw_available(c10::kCPU); }

class AdamWKernels : public ::testing::TestWithParam<AdamWImplementation> {
 protected:
  void SetUp() override {
    if (GetParam() == AdamWImplementation::kFused && !fused_here())
      GTEST_SKIP() << "this LibTorch has no CPU fused AdamW (2.4+); FusedUnavailableIsAClearError covers it";
  }
};

TEST_P(AdamWKernels, MatchesTorchAdamWGolden) {
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
  o.implementation = GetParam();
  auto opt = make_optimizer({{"weight", weight}, {"bias", bias}}, o);
  auto* group_adamw = dynamic_cast<GroupAdamW*>(opt.get());
  ASSERT_NE(group_adamw, nullptr);
  EXPECT_EQ(group_adamw->kernel(), resolve_adamw_kernel(GetParam(), c10::Device(c10::kCPU)));
  for (const auto& step : g["steps"]) {
    set_learning_rate(*opt, step["lr"].get<double>());
    weight.mutable_grad() = test::golden_tensor(step["grads"]["weight"], wshape);
    bias.mutable_grad() = test::golden_tensor(step["grads"]["bias"], bshape);
    opt->step();
    EXPECT_LT(test::max_rel_diff(weight, test::golden_tensor(step["params"]["weight"], wshape)), 1e-6);
    EXPECT_LT(test::max_rel_diff(bias, test::golden_tensor(step["params"]["bias"], bshape)), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernel, AdamWKernels,
                         ::testing::Values(AdamWImplementation::kAuto, AdamWImplementation::kFused,
                                           AdamWImplementation::kForeach, AdamWImplementation::kLoop),
                         [](const auto& info) { return std::string(name_of(info.param)); });

// Two groups (decay / no decay), several tensors, five steps of random gradients: the
// given kernel against LibTorch's torch::optim::AdamW on copies of the same tensors.
void compare_with_libtorch(AdamWKernel kernel, double tolerance) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> mine, theirs;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {5}, {3, 4, 2}, {9}}) {
    auto t = torch::randn(shape);
    mine.push_back(t.clone().requires_grad_());
    theirs.push_back(t.clone().requires_grad_());
  }
  auto options = torch::optim::AdamWOptions(3e-2).betas({0.9, 0.95}).eps(1e-8);
  auto groups = [&](std::vector<torch::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{p[0], p[2]},
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0.1)));
    g.emplace_back(std::vector<torch::Tensor>{p[1], p[3]},
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0.0)));
    return g;
  };
  GroupAdamW a(groups(mine), options, kernel);
  torch::optim::AdamW b(groups(theirs), options);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < mine.size(); ++i) {
      auto grad = torch::randn(mine[i].sizes()) * (step + 1);
      mine[i].mutable_grad() = grad.clone();
      theirs[i].mutable_grad() = grad.clone();
    }
    a.step();
    b.step();
    for (size_t i = 0; i < mine.size(); ++i) {
      if (tolerance == 0)
        EXPECT_TRUE(torch::equal(mine[i], theirs[i])) << "tensor " << i << " step " << step;
      else
        EXPECT_LT(test::max_rel_diff(mine[i], theirs[i]), tolerance) << "tensor " << i << " step " << step;
    }
  }
}

TEST(GroupAdamW, ForeachIsBitIdenticalToLibTorchAdamW) { compare_with_libtorch(AdamWKernel::foreach, 0); }

TEST(GroupAdamW, FusedMatchesLibTorchAdamWToFloatRounding) {
  if (!fused_here()) GTEST_SKIP() << "this LibTorch has no CPU fused AdamW (2.4+)";
  // The fused kernel folds the bias corrections differently: a few float32 ulps.
  compare_with_libtorch(AdamWKernel::fused, 1e-6);
}

TEST(GroupAdamW, AutoPicksFusedExactlyWhereTheKernelExists) {
  EXPECT_EQ(resolve_adamw_kernel(AdamWImplementation::kAuto, c10::Device(c10::kCPU)),
            fused_here() ? AdamWKernel::fused : AdamWKernel::foreach);
  EXPECT_EQ(resolve_adamw_kernel(AdamWImplementation::kForeach, c10::Device(c10::kCPU)), AdamWKernel::foreach);
  EXPECT_EQ(resolve_adamw_kernel(AdamWImplementation::kLoop, c10::Device(c10::kCPU)), AdamWKernel::loop);
}

TEST(GroupAdamW, FusedUnavailableIsAClearError) {
  if (fused_here()) {
    EXPECT_EQ(resolve_adamw_kernel(AdamWImplementation::kFused, c10::Device(c10::kCPU)), AdamWKernel::fused);
    return;
  }
  try {
    resolve_adamw_kernel(AdamWImplementation::kFused, c10::Device(c10::kCPU));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("optim.implementation"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("use auto or foreach"));
  }
}

TEST(GroupAdamW, BadImplementationNamesTheKey) {
  // An unknown kernel name is rejected where the config is read.
  try {
    config::load_config("", {"optim.implementation=turbo"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("optim.implementation"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("'turbo' is not valid (valid: auto, fused, foreach, loop)"));
  }
}

// After reset_moments(a), a's next update is a first update (fresh moments, step 1)
// while b continues with its bias correction at step 4.
TEST(GroupAdamW, ResetTensorRestartsItsOwnBiasCorrection) {
  for (auto kernel : {AdamWKernel::foreach, AdamWKernel::fused}) {
    if (kernel == AdamWKernel::fused && !fused_here()) continue;
    torch::manual_seed(5);
    auto a = torch::randn({4, 3}).requires_grad_(), b = torch::randn({6}).requires_grad_();
    auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.0);
    GroupAdamW opt({torch::optim::OptimizerParamGroup({a, b})}, options, kernel);
    for (int i = 0; i < 3; ++i) {
      a.mutable_grad() = torch::randn({4, 3});
      b.mutable_grad() = torch::randn({6});
      opt.step();
    }
    ASSERT_TRUE(reset_moments(opt, a));
    auto a_fresh = a.detach().clone().requires_grad_(), b_cont = b.detach().clone();
    torch::optim::AdamW first_update({a_fresh}, options);
    auto ga = torch::randn({4, 3}), gb = torch::randn({6});
    a.mutable_grad() = ga;
    b.mutable_grad() = gb;
    a_fresh.mutable_grad() = ga.clone();
    opt.step();
    first_update.step();
    EXPECT_LT(test::max_rel_diff(a, a_fresh), 1e-6) << to_string(kernel);
    EXPECT_EQ(moments_of(opt, a).step, 1);
    EXPECT_EQ(moments_of(opt, b).step, 4);
    EXPECT_FALSE(torch::equal(b.detach(), b_cont));
  }
}

TEST(GroupAdamW, TensorsWithoutGradientsAreLeftAlone) {
  auto a = torch::ones({3}).requires_grad_(), b = torch::ones({3}).requires_grad_();
  GroupAdamW opt({torch::optim::OptimizerParamGroup({a, b})}, torch::optim::AdamWOptions(0.1).weight_decay(0.5),
                 AdamWKernel::foreach);
  a.mutable_grad() = torch::ones({3});
  opt.step();
  EXPECT_FALSE(torch::equal(a.detach(), torch::ones({3})));
  EXPECT_TRUE(torch::equal(b.detach(), torch::ones({3})));  // no gradient: not even decayed
  EXPECT_EQ(moments_of(opt, b).step, 0);
}

// A checkpoint written by GroupAdamW loads into LibTorch's AdamW and vice versa, and
// training continues identically (the state layout is LibTorch's).
TEST(GroupAdamW, CheckpointsAreLibTorchAdamWCheckpoints) {
  torch::manual_seed(9);
  auto init = torch::randn({5, 4});
  auto p1 = init.clone().requires_grad_();
  GroupAdamW a({torch::optim::OptimizerParamGroup({p1})}, torch::optim::AdamWOptions(1e-2), AdamWKernel::foreach);
  for (int i = 0; i < 2; ++i) {
    p1.mutable_grad() = torch::randn({5, 4});
    a.step();
  }
  std::stringstream saved;
  torch::save(a, saved);

  auto p2 = p1.detach().clone().requires_grad_();
  torch::optim::AdamW b({p2}, torch::optim::AdamWOptions(1e-2));
  torch::load(b, saved);
  auto g = torch::randn({5, 4});
  p1.mutable_grad() = g.clone();
  p2.mutable_grad() = g.clone();
  a.step();
  b.step();
  EXPECT_TRUE(torch::equal(p1, p2));
  EXPECT_EQ(moments_of(a, p1).step, 3);
}

}  // namespace
}  // namespace gradguard::optim
