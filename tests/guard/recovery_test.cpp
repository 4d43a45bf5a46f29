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
  EXPECT_EQ(l.decide(100, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  EXPECT_EQ(l.decide(110, AnomalyKind::kLossSpike, true).action, RecoveryAction::kCooldown);
  EXPECT_EQ(l.decide(120, AnomalyKind::kLossSpike, true).action, RecoveryAction::kResetMoments);
  EXPECT_EQ(l.decide(130, AnomalyKind::kLossSpike, true).action, RecoveryAction::kRollback);
  EXPECT_EQ(l.decide(140, AnomalyKind::kLossSpike, true).action, RecoveryAction::kHalt);
  // After a calm period the ladder starts at the bottom again.
  RecoveryLadder m(o);
  EXPECT_EQ(m.decide(100, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  EXPECT_EQ(m.decide(151, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  // 50 steps after 151: still within.
  EXPECT_EQ(m.decide(201, AnomalyKind::kLossSpike, true).action, RecoveryAction::kCooldown);
}

TEST(Recovery, AnotherKindOfAnomalyStartsAtTheBottom) {
  RecoveryLadder l(RecoveryOptions{});
  EXPECT_EQ(l.decide(100, AnomalyKind::kNonfinite, true).action, RecoveryAction::kSkip);
  EXPECT_EQ(l.decide(101, AnomalyKind::kNonfinite, true).action, RecoveryAction::kCooldown);
  // An independent event.
  EXPECT_EQ(l.decide(102, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  EXPECT_EQ(l.decide(103, AnomalyKind::kLossSpike, true).action, RecoveryAction::kCooldown);
}

TEST(Recovery, SpentBudgetsAndMissingCheckpointsArePassedOver) {
  RecoveryOptions o;
  o.skip_budget = 1;
  o.cooldown_budget = 0;
  RecoveryLadder l(o);
  auto a = l.decide(0, AnomalyKind::kLossSpike, false);
  EXPECT_EQ(a.action, RecoveryAction::kSkip);
  EXPECT_EQ(a.budget_left, 0);
  // Calm again, but skip is spent and cooldown has no budget.
  a = l.decide(1000, AnomalyKind::kLossSpike, false);
  EXPECT_EQ(a.action, RecoveryAction::kResetMoments);
  EXPECT_THAT(a.note, ::testing::HasSubstr("skip passed over: budget spent"));
  EXPECT_THAT(a.note, ::testing::HasSubstr("cooldown passed over"));
  a = l.decide(1001, AnomalyKind::kLossSpike, false);  // rollback impossible without a checkpoint -> halt
  EXPECT_EQ(a.action, RecoveryAction::kHalt);
  EXPECT_THAT(a.note, ::testing::HasSubstr("no checkpoint"));
}

TEST(Recovery, LadderWithoutHaltStillHaltsWhenSpent) {
  RecoveryOptions o;
  o.ladder = {RecoveryAction::kSkip};
  o.skip_budget = 2;
  RecoveryLadder l(o);
  EXPECT_EQ(l.decide(0, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  EXPECT_EQ(l.decide(100, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  auto a = l.decide(200, AnomalyKind::kLossSpike, true);
  EXPECT_EQ(a.action, RecoveryAction::kHalt);
  EXPECT_THAT(a.note, ::testing::HasSubstr("budget spent"));
  EXPECT_EQ(l.budget_left(RecoveryAction::kSkip), 0);
}

TEST(Recovery, CooldownLowersTheLearningRateForItsSteps) {
  RecoveryOptions o;
  o.ladder = {RecoveryAction::kCooldown, RecoveryAction::kResetMoments};
  o.cooldown_steps = 3;
  o.cooldown_factor = 0.25;
  RecoveryLadder l(o);
  EXPECT_EQ(l.lr_factor(10), 1.0);
  EXPECT_EQ(l.decide(10, AnomalyKind::kLossSpike, true).action, RecoveryAction::kCooldown);
  EXPECT_EQ(l.lr_factor(10), 1.0);  // the anomalous step itself is skipped anyway
  EXPECT_EQ(l.lr_factor(11), 0.25);
  EXPECT_EQ(l.lr_factor(13), 0.25);
  EXPECT_EQ(l.lr_factor(14), 1.0);
  // A moment reset cools down too, so fresh moments settle at a lower lr.
  EXPECT_EQ(l.decide(20, AnomalyKind::kLossSpike, true).action, RecoveryAction::kResetMoments);
  EXPECT_EQ(l.lr_factor(21), 0.25);
}

TEST(Recovery, StateRoundTrips) {
  RecoveryOptions o;
  o.calm_steps = 50;
  RecoveryLadder a(o);
  a.decide(5, AnomalyKind::kLossSpike, true);
  a.decide(9, AnomalyKind::kLossSpike, true);
  RecoveryLadder b(o);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(a.state_dict().dump(), b.state_dict().dump());
  // It continues the escalation.
  EXPECT_EQ(b.decide(12, AnomalyKind::kLossSpike, true).action, RecoveryAction::kResetMoments);
  EXPECT_EQ(b.lr_factor(13), RecoveryOptions{}.cooldown_factor);
  EXPECT_THROW(b.load_state_dict(nlohmann::json::object()), Error);
}

TEST(Recovery, PrecisionRungServesLossScaleAnomaliesOnly) {
  RecoveryOptions o;
  o.ladder = {RecoveryAction::kSkip, RecoveryAction::kPrecision, RecoveryAction::kCooldown, RecoveryAction::kHalt};
  o.precision_steps = 10;
  o.precision_budget = 2;
  RecoveryLadder l(o);
  EXPECT_EQ(l.decide(5, AnomalyKind::kBackoffStorm, true).action, RecoveryAction::kSkip);
  const auto d = l.decide(7, AnomalyKind::kBackoffStorm, true);
  EXPECT_EQ(d.action, RecoveryAction::kPrecision);
  EXPECT_EQ(d.budget_left, 1);
  // The window: the steps after the action, precision_steps of them.
  EXPECT_EQ(l.precision_level(7), 0);
  EXPECT_EQ(l.precision_level(8), 1);
  EXPECT_EQ(l.precision_level(17), 1);
  EXPECT_EQ(l.precision_level(18), 0);
  // A loss spike passes over it without a note, as if it were not in the ladder.
  RecoveryLadder m(o);
  EXPECT_EQ(m.decide(5, AnomalyKind::kLossSpike, true).action, RecoveryAction::kSkip);
  const auto spike = m.decide(7, AnomalyKind::kLossSpike, true);
  EXPECT_EQ(spike.action, RecoveryAction::kCooldown);
  EXPECT_EQ(spike.note, "");
  EXPECT_EQ(m.precision_level(8), 0);
}

TEST(Recovery, ASecondFallbackInsideTheWindowWidensAgainAndTheStateKeepsIt) {
  RecoveryOptions o;
  o.ladder = {RecoveryAction::kPrecision, RecoveryAction::kHalt};
  o.precision_steps = 10;
  o.calm_steps = 1;  // each anomaly starts at the bottom again
  RecoveryLadder l(o);
  EXPECT_EQ(l.decide(3, AnomalyKind::kLossScaleStuck, true).action, RecoveryAction::kPrecision);
  EXPECT_EQ(l.decide(8, AnomalyKind::kLossScaleStuck, true).action, RecoveryAction::kPrecision);
  EXPECT_EQ(l.precision_level(9), 2);
  EXPECT_EQ(l.precision_level(18), 2);
  EXPECT_EQ(l.precision_level(19), 0);
  RecoveryLadder b(o);
  b.load_state_dict(l.state_dict());
  EXPECT_EQ(b.precision_level(12), 2);
  // The budget (2) is spent: the next one halts.
  EXPECT_EQ(b.decide(30, AnomalyKind::kLossScaleStuck, true).action, RecoveryAction::kHalt);
  // A state from before the rung existed loads with no fallback under way.
  auto old = l.state_dict();
  for (const char* k : {"precisions", "precision_from", "precision_until", "precision_level"}) old.erase(k);
  RecoveryLadder c(o);
  c.load_state_dict(old);
  EXPECT_EQ(c.precision_level(12), 0);
}

}  // namespace
}  // namespace gradguard::guard
