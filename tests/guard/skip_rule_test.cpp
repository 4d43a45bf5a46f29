// OLMo-core's skip rule (SkipStepOptimizer; OLMo 2, arXiv 2501.00656): skip when the loss
// or the gradient norm exceeds mean + sigma x std of the previous `window` values (std
// with n - 1, torch.std's default), armed at max(2, window / 2) values, every finite
// step recorded. The limits here are computed in float64 from that formula.
#include "gradguard/guard/skip_rule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "test_util.h"

namespace gradguard::guard {
namespace {
using ::testing::HasSubstr;

double limit_of(const std::vector<double>& v, double sigma) {
  double m = 0, ss = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) ss += (x - m) * (x - m);
  return m + sigma * std::sqrt(ss / (v.size() - 1));
}

TEST(SkipRule, ArmsAtHalfTheWindow) {
  SkipRule rule(6, 8);
  for (int i = 0; i < 4; ++i) {
    const auto d = rule.observe(i == 3 ? 1e6 : 2.0 + 0.1 * i, 1.0 + 0.01 * i);  // even a huge value passes
    EXPECT_FALSE(d.armed) << i;
    EXPECT_FALSE(d.skip) << i;
  }
  EXPECT_TRUE(rule.observe(2.0, 1.0).armed);
}

TEST(SkipRule, LimitIsMeanPlusSigmaSampleStdOfEachValue) {
  const std::vector<double> losses = {2.0, 2.1, 1.9, 2.05, 1.95, 2.2};
  const std::vector<double> norms = {1.0, 1.3, 0.8, 1.1, 0.9, 1.2};
  const double sigma = 3;
  const double loss_limit = limit_of(losses, sigma), norm_limit = limit_of(norms, sigma);
  auto fed = [&] {
    SkipRule r(sigma, 12);
    for (size_t i = 0; i < losses.size(); ++i) r.observe(losses[i], norms[i]);
    return r;
  };
  {
    auto r = fed();
    const auto d = r.observe(loss_limit * (1 - 1e-9), norm_limit * (1 - 1e-9));
    EXPECT_TRUE(d.armed);
    EXPECT_FALSE(d.skip);
    EXPECT_NEAR(d.loss_limit, loss_limit, 1e-12);
    EXPECT_NEAR(d.grad_norm_limit, norm_limit, 1e-12);
  }
  {
    auto r = fed();
    EXPECT_TRUE(r.observe(loss_limit * (1 + 1e-9), 1.0).skip);  // the loss alone
  }
  {
    auto r = fed();
    EXPECT_TRUE(r.observe(2.0, norm_limit * (1 + 1e-9)).skip);  // the gradient norm alone
  }
}

TEST(SkipRule, EveryFiniteStepIsRecordedAndTheWindowRolls) {
  SkipRule r(6, 4);
  std::vector<double> seen;
  for (int i = 0; i < 10; ++i) {
    const double x = 1.0 + 0.1 * (i % 3);
    r.observe(x, x);
    seen.push_back(x);
  }
  EXPECT_EQ(r.size(), 4u);
  const std::vector<double> last4(seen.end() - 4, seen.end());
  EXPECT_NEAR(r.observe(1.0, 1.0).loss_limit, limit_of(last4, 6), 1e-12);
  // A skipped outlier enters the window too (so a lasting shift becomes the new normal).
  SkipRule s(2, 8);
  for (double x : {1.0, 1.1, 0.9, 1.0}) s.observe(x, x);
  EXPECT_TRUE(s.observe(5.0, 1.0).skip);
  EXPECT_EQ(s.size(), 5u);
  EXPECT_FALSE(s.observe(5.0, 1.0).skip);  // 5.0 is now inside mean + 2 std
}

TEST(SkipRule, NonFiniteValuesAreNeitherJudgedNorRecorded) {
  SkipRule r(6, 8);
  for (double x : {1.0, 1.1, 0.9, 1.0}) r.observe(x, x);
  EXPECT_FALSE(r.observe(INFINITY, 1.0).skip);
  EXPECT_FALSE(r.observe(1.0, NAN).skip);
  EXPECT_EQ(r.size(), 4u);
}

TEST(SkipRule, OffNeverSkipsOrRecords) {
  SkipRule r(0, 8);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(r.observe(i == 19 ? 1e9 : 1.0, 1.0).skip);
  EXPECT_EQ(r.size(), 0u);
}

TEST(SkipRule, StateRoundTripsAndRefusesBadState) {
  SkipRule a(3, 8);
  for (double x : {1.0, 1.2, 0.8, 1.1, 0.95}) a.observe(x, 2 * x);
  SkipRule b(3, 8);
  b.load_state_dict(a.state_dict(), "state.json");
  for (double x : {1.05, 3.0, 1.0}) {
    const auto da = a.observe(x, 2 * x), db = b.observe(x, 2 * x);
    EXPECT_EQ(da.skip, db.skip);
    EXPECT_EQ(da.loss_limit, db.loss_limit);
  }
  // A smaller window on resume keeps the newest values.
  SkipRule small(3, 4);
  small.load_state_dict(a.state_dict(), "state.json");
  EXPECT_EQ(small.size(), 4u);
  auto bad = a.state_dict();
  bad["grad_norms"].erase(0);
  EXPECT_THAT(test::bad_input_message([&] { b.load_state_dict(bad, "state.json"); }), HasSubstr("grad_norms"));
  bad = a.state_dict();
  bad["losses"][0] = "x";
  EXPECT_THAT(test::bad_input_message([&] { b.load_state_dict(bad, "state.json"); }), HasSubstr("losses"));
}

TEST(SkipRule, OptionsNameTheKey) {
  EXPECT_THAT(test::bad_input_message([] { config::load_config("", {"guard.skip_rule.sigma=-1"}); }),
              HasSubstr("guard.skip_rule.sigma"));
  EXPECT_THAT(test::bad_input_message([] { config::load_config("", {"guard.skip_rule.window=3"}); }),
              HasSubstr("guard.skip_rule.window"));
}

}  // namespace
}  // namespace gradguard::guard
