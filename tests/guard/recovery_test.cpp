// The recovery ladder: escalation within the calm period, the restart after it, budgets,
// rollback without a checkpoint, the halt at the top, the cool-down window and the state
// round trip.
#include "gradguard/guard/recovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"

namespace gradguard::guard {
namespace {

TEST(Recovery, EscalatesWithinTheCalmPeriodAndRestartsAfterIt) {
  RecoveryOptions o;  // skip, cooldown, reset_moments, rollback, halt
  o.calm_steps = 50;
  RecoveryLadder l(o);
  EXPECT_EQ(l.decide(100, "loss_spike", true).action, "skip");
  EXPECT_EQ(l.decide(110, "loss_spike", true).action, "cooldown");
  EXPECT_EQ(l.decide(120, "loss_spike", true).action, "reset_moments");
  EXPECT_EQ(l.decide(130, "loss_spike", true).action, "rollback");
  EXPECT_EQ(l.decide(140, "loss_spike", true).action, "halt");
  // After a calm period the ladder starts at the bottom again.
  RecoveryLadder m(o);
  EXPECT_EQ(m.decide(100, "loss_spike", true).action, "skip");
  EXPECT_EQ(m.decide(151, "loss_spike", true).action, "skip");
  EXPECT_EQ(m.decide(201, "loss_spike", true).action, "cooldown");  // 50 steps after 151: still within
}

TEST(Recovery, AnotherKindOfAnomalyStartsAtTheBottom) {
  RecoveryLadder l(RecoveryOptions{});
  EXPECT_EQ(l.decide(100, "nonfinite", true).action, "skip");
  EXPECT_EQ(l.decide(101, "nonfinite", true).action, "cooldown");
  EXPECT_EQ(l.decide(102, "loss_spike", true).action, "skip");  // an independent event
  EXPECT_EQ(l.decide(103, "loss_spike", true).action, "cooldown");
}

TEST(Recovery, SpentBudgetsAndMissingCheckpointsArePassedOver) {
  RecoveryOptions o;
  o.skip_budget = 1;
  o.cooldown_budget = 0;
  RecoveryLadder l(o);
  auto a = l.decide(0, "loss_spike", false);
  EXPECT_EQ(a.action, "skip");
  EXPECT_EQ(a.budget_left, 0);
  a = l.decide(1000, "loss_spike", false);  // calm again, but skip is spent and cooldown has no budget
  EXPECT_EQ(a.action, "reset_moments");
  EXPECT_THAT(a.note, ::testing::HasSubstr("skip passed over: budget spent"));
  EXPECT_THAT(a.note, ::testing::HasSubstr("cooldown passed over"));
  a = l.decide(1001, "loss_spike", false);  // rollback impossible without a checkpoint -> halt
  EXPECT_EQ(a.action, "halt");
  EXPECT_THAT(a.note, ::testing::HasSubstr("no checkpoint"));
}

TEST(Recovery, LadderWithoutHaltStillHaltsWhenSpent) {
  RecoveryOptions o;
  o.ladder = {"skip"};
  o.skip_budget = 2;
  RecoveryLadder l(o);
  EXPECT_EQ(l.decide(0, "loss_spike", true).action, "skip");
  EXPECT_EQ(l.decide(100, "loss_spike", true).action, "skip");
  auto a = l.decide(200, "loss_spike", true);
  EXPECT_EQ(a.action, "halt");
  EXPECT_THAT(a.note, ::testing::HasSubstr("budget spent"));
  EXPECT_EQ(l.budget_left("skip"), 0);
}

TEST(Recovery, CooldownLowersTheLearningRateForItsSteps) {
  RecoveryOptions o;
  o.ladder = {"cooldown", "reset_moments"};
  o.cooldown_steps = 3;
  o.cooldown_factor = 0.25;
  RecoveryLadder l(o);
  EXPECT_EQ(l.lr_factor(10), 1.0);
  EXPECT_EQ(l.decide(10, "loss_spike", true).action, "cooldown");
  EXPECT_EQ(l.lr_factor(10), 1.0);  // the anomalous step itself is skipped anyway
  EXPECT_EQ(l.lr_factor(11), 0.25);
  EXPECT_EQ(l.lr_factor(13), 0.25);
  EXPECT_EQ(l.lr_factor(14), 1.0);
  // A moment reset cools down too, so fresh moments settle at a lower lr.
  EXPECT_EQ(l.decide(20, "loss_spike", true).action, "reset_moments");
  EXPECT_EQ(l.lr_factor(21), 0.25);
}

TEST(Recovery, StateRoundTrips) {
  RecoveryOptions o;
  o.calm_steps = 50;
  RecoveryLadder a(o);
  a.decide(5, "loss_spike", true);
  a.decide(9, "loss_spike", true);
  RecoveryLadder b(o);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(a.state_dict().dump(), b.state_dict().dump());
  EXPECT_EQ(b.decide(12, "loss_spike", true).action, "reset_moments");  // continues the escalation
  EXPECT_EQ(b.lr_factor(13), RecoveryOptions{}.cooldown_factor);
  EXPECT_THROW(b.load_state_dict(nlohmann::json::object()), Error);
}

}  // namespace
}  // namespace gradguard::guard
