// LAMB and LARS against a float64 transcription of the papers' update rules
// (tests/golden/lamb_lars.json from tests/golden/make_lamb_lars_golden.py), exact resume
// through torch::save / torch::load of the optimizer, and option validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "golden_util.h"
#include "gradguard/core/error.h"
#include "gradguard/optim/lamb.h"
#include "gradguard/optim/lars.h"

namespace gradguard::optim {
namespace {

using torch::optim::OptimizerParamGroup;

LambOptions lamb_options(const nlohmann::json& o) {
  return LambOptions()
      .betas(std::make_tuple(o["betas"][0].get<double>(), o["betas"][1].get<double>()))
      .eps(o["eps"].get<double>())
      .weight_decay(o["weight_decay"].get<double>())
      .max_trust_ratio(o["max_trust_ratio"].get<double>())
      .bias_correction(o["bias_correction"].get<bool>());
}

LarsOptions lars_options(const nlohmann::json& o) {
  return LarsOptions()
      .momentum(o["momentum"].get<double>())
      .weight_decay(o["weight_decay"].get<double>())
      .trust_coefficient(o["trust_coefficient"].get<double>())
      .eps(o["eps"].get<double>());
}

// The layout every test uses: group 0 holds `w` with `options` (adaptive), group 1 holds
// `b` with the same options but adaptive false and no weight decay.
template <typename Opt, typename Options>
std::unique_ptr<Opt> make_two_groups(const torch::Tensor& w, const torch::Tensor& b,
                                     const Options& options) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w}, std::make_unique<Options>(options));
  groups.emplace_back(
      std::vector<torch::Tensor>{b},
      std::make_unique<Options>(Options(options).adaptive(false).weight_decay(0.0)));
  return std::make_unique<Opt>(std::move(groups), options);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

// Runs every golden case of `kind` and compares the parameters after each step.
template <typename Opt, typename Options>
void check_golden(const std::string& kind, Options (*options_from)(const nlohmann::json&)) {
  auto golden = test::load_golden("lamb_lars.json");
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    if (c["optimizer"] != kind) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    auto wshape = c["shapes"]["w"].get<std::vector<int64_t>>();
    auto bshape = c["shapes"]["b"].get<std::vector<int64_t>>();
    auto w = test::golden_tensor(c["init"]["w"], wshape).requires_grad_();
    auto b = test::golden_tensor(c["init"]["b"], bshape).requires_grad_();
    auto opt = make_two_groups<Opt>(w, b, options_from(c["options"]));
    for (size_t s = 0; s < c["steps"].size(); ++s) {
      const auto& step = c["steps"][s];
      set_lr(*opt, c["lrs"][s].get<double>());
      w.mutable_grad() = test::golden_tensor(step["grads"]["w"], wshape);
      b.mutable_grad() = test::golden_tensor(step["grads"]["b"], bshape);
      opt->step();
      // 1e-6 relative against float64, measured against max(|ref|, 1e-2): an element near
      // zero is a difference of O(1) float32 values, so its error is absolute (a few
      // 1e-9), not relative. Worst seen: about 5e-7.
      EXPECT_LT(test::max_rel_diff(w, test::golden_tensor(step["params"]["w"], wshape), 1e-2), 1e-6)
          << "step " << s;
      EXPECT_LT(test::max_rel_diff(b, test::golden_tensor(step["params"]["b"], bshape), 1e-2), 1e-6)
          << "step " << s;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(Lamb, MatchesPaperFormulaGolden) {
  check_golden<Lamb>("lamb", &lamb_options);
}

TEST(Lars, MatchesPaperFormulaGolden) {
  check_golden<Lars>("lars", &lars_options);
}

// Saves the optimizer after `split` of `total` steps, loads it into a fresh optimizer over
// copies of the parameters, finishes there, and requires bit-identical parameters to an
// uninterrupted run.
template <typename Opt, typename Options>
void check_resume(const Options& options) {
  constexpr int kTotal = 7, kSplit = 3;
  torch::manual_seed(0);
  auto w0 = torch::randn({5, 4});
  auto b0 = torch::randn({4});
  std::vector<torch::Tensor> gw, gb;  // [step]
  for (int s = 0; s < kTotal; ++s) {
    gw.push_back(torch::randn({5, 4}));
    gb.push_back(torch::randn({4}));
  }
  auto run = [&](Opt& opt, torch::Tensor& w, torch::Tensor& b, int from, int to) {
    for (int s = from; s < to; ++s) {
      set_lr(opt, options.lr() * (1.0 + 0.25 * s));
      w.mutable_grad() = gw[s].clone();
      b.mutable_grad() = gb[s].clone();
      opt.step();
    }
  };
  auto make_params = [](const torch::Tensor& w, const torch::Tensor& b) {
    return std::make_pair(w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_());
  };

  auto [wa, ba] = make_params(w0, b0);
  auto whole = make_two_groups<Opt>(wa, ba, options);
  run(*whole, wa, ba, 0, kTotal);

  auto [wb, bb] = make_params(w0, b0);
  auto first = make_two_groups<Opt>(wb, bb, options);
  run(*first, wb, bb, 0, kSplit);
  std::stringstream archive;
  torch::save(*first, archive);

  auto [wc, bc] = make_params(wb, bb);  // new tensors: state is matched by group position
  auto resumed = make_two_groups<Opt>(wc, bc, options);
  torch::load(*resumed, archive);
  EXPECT_EQ(resumed->state().size(), first->state().size());
  run(*resumed, wc, bc, kSplit, kTotal);

  EXPECT_TRUE(torch::equal(wa, wc));
  EXPECT_TRUE(torch::equal(ba, bc));
  EXPECT_FALSE(torch::equal(wa, wb));  // the split run really stopped early
}

TEST(Lamb, ResumeThroughSaveLoadIsBitIdentical) {
  check_resume<Lamb>(LambOptions(0.02));
  check_resume<Lamb>(LambOptions(0.02).betas(std::make_tuple(0.5, 0.9)).bias_correction(false));
}

TEST(Lars, ResumeThroughSaveLoadIsBitIdentical) {
  check_resume<Lars>(LarsOptions(0.1).trust_coefficient(0.02));
  check_resume<Lars>(LarsOptions(0.1).momentum(0.0));  // no state at all
}

TEST(Lamb, StateHoldsStepAndMoments) {
  auto w = torch::ones({2, 2}, torch::requires_grad());
  Lamb opt(std::vector<torch::Tensor>{w}, LambOptions(0.1));
  w.mutable_grad() = torch::full({2, 2}, 2.0);
  opt.step();
  opt.step();
  ASSERT_EQ(opt.state().size(), 1u);
  const auto& st = static_cast<const LambParamState&>(*opt.state().begin()->second);
  EXPECT_EQ(st.step(), 2);
  EXPECT_TRUE(torch::allclose(st.exp_avg(), torch::full({2, 2}, 2.0 * (1 - 0.9 * 0.9))));
}

TEST(Lamb, ZeroWeightTakesUnitTrust) {
  // ||w|| = 0: trust 1, so the first step is exactly Adam's (m_hat / sqrt(v_hat) = sign g).
  auto w = torch::zeros({3}, torch::requires_grad());
  Lamb opt(std::vector<torch::Tensor>{w}, LambOptions(0.5).eps(1e-12).weight_decay(0.0));
  w.mutable_grad() = torch::tensor({3.0f, -2.0f, 0.0f});
  opt.step();
  EXPECT_TRUE(torch::allclose(w, torch::tensor({-0.5f, 0.5f, 0.0f})));
}

TEST(Lars, ZeroGradientLeavesWeightsWithoutDecay) {
  // ||g|| = 0: local_lr 1, no NaN from 0/0; with no decay the weights stay put.
  auto w = torch::ones({3}, torch::requires_grad());
  Lars opt(std::vector<torch::Tensor>{w}, LarsOptions(0.1).weight_decay(0.0).eps(0.0));
  w.mutable_grad() = torch::zeros({3});
  opt.step();
  EXPECT_TRUE(torch::equal(w, torch::ones({3})));
}

// Each bad value must be rejected by validate() and by the constructor, naming the key.
template <typename Opt, typename Options>
void expect_rejected(const Options& options, const std::string& key) {
  SCOPED_TRACE(key);
  try {
    options.validate();
    ADD_FAILURE() << "validate() accepted a bad " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(e.where(), key);
    EXPECT_THAT(e.what(), ::testing::HasSubstr(key));
  }
  auto p = torch::zeros({2});
  EXPECT_THROW(Opt(std::vector<torch::Tensor>{p}, options), Error);
  // A bad group option is caught too, even with valid defaults.
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p}, std::make_unique<Options>(options));
  EXPECT_THROW(Opt(std::move(groups), Options()), Error);
}

TEST(Lamb, RejectsBadOptions) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NO_THROW(LambOptions().validate());
  EXPECT_NO_THROW(LambOptions(0.0).max_trust_ratio(inf).validate());
  expect_rejected<Lamb>(LambOptions(-1e-3), "optim.lr");
  expect_rejected<Lamb>(LambOptions().betas(std::make_tuple(0.9, 1.0)), "optim.betas");
  expect_rejected<Lamb>(LambOptions().betas(std::make_tuple(-0.1, 0.9)), "optim.betas");
  expect_rejected<Lamb>(LambOptions().eps(0.0), "optim.eps");
  expect_rejected<Lamb>(LambOptions().weight_decay(-0.01), "optim.weight_decay");
  expect_rejected<Lamb>(LambOptions().max_trust_ratio(0.0), "optim.max_trust_ratio");
  expect_rejected<Lamb>(LambOptions().max_trust_ratio(std::nan("")), "optim.max_trust_ratio");
}

TEST(Lars, RejectsBadOptions) {
  EXPECT_NO_THROW(LarsOptions().validate());
  EXPECT_NO_THROW(LarsOptions().momentum(0.0).weight_decay(0.0).eps(0.0).validate());
  expect_rejected<Lars>(LarsOptions(std::nan("")), "optim.lr");
  expect_rejected<Lars>(LarsOptions().momentum(1.0), "optim.momentum");
  expect_rejected<Lars>(LarsOptions().weight_decay(-1e-4), "optim.weight_decay");
  expect_rejected<Lars>(LarsOptions().trust_coefficient(0.0), "optim.trust_coefficient");
  expect_rejected<Lars>(LarsOptions().eps(-1e-9), "optim.eps");
}

}  // namespace
}  // namespace gradguard::optim
