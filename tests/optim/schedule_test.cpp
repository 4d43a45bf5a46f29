// LrSchedule against torch.optim.lr_scheduler (LinearLR warmup + CosineAnnealingLR /
// LinearLR / ConstantLR via SequentialLR), golden values in tests/golden/schedule.json.
#include "gradguard/optim/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "golden_util.h"
#include "gradguard/config/config.h"
#include "gradguard/core/choice.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
namespace {
using ::testing::HasSubstr;

TEST(Schedule, MatchesTorchSchedulers) {
  auto golden = test::load_golden("schedule.json");
  ASSERT_GE(golden["cases"].size(), 5u);
  for (const auto& c : golden["cases"]) {
    ScheduleOptions o;
    o.warmup_steps = c["warmup_steps"];
    o.total_steps = c["total_steps"];
    o.decay = parse_choice<Decay>(c["decay"].get<std::string>(), "schedule.json: decay");
    o.min_lr = c["min_lr"];
    LrSchedule s(c["lr"].get<double>(), o);
    const auto lrs = c["lrs"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(lrs.size()), o.total_steps);
    for (size_t i = 0; i < lrs.size(); ++i)
      EXPECT_NEAR(s.lr_at(static_cast<int64_t>(i)), lrs[i], 1e-9 * c["lr"].get<double>())
          << name_of(o.decay) << " W=" << o.warmup_steps << " step " << i;
  }
}

TEST(Schedule, FloorAfterTotalAndNeverBelowMin) {
  ScheduleOptions o;
  o.warmup_steps = 3;
  o.total_steps = 10;
  o.min_lr = 1e-4;
  for (Decay decay : {Decay::kCosine, Decay::kLinear}) {
    o.decay = decay;
    LrSchedule s(1e-3, o);
    for (int64_t step = 0; step < 40; ++step) EXPECT_GE(s.lr_at(step), 1e-4);
    EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-4);
    EXPECT_DOUBLE_EQ(s.lr_at(1000), 1e-4);
    EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-3);  // peak exactly at s = W
  }
  o.decay = Decay::kConstant;
  EXPECT_DOUBLE_EQ(LrSchedule(1e-3, o).lr_at(500), 1e-3);
}

TEST(Schedule, WarmupIsLinearFromFirstStep) {
  ScheduleOptions o;
  o.warmup_steps = 4;
  o.total_steps = 8;
  o.min_lr = 0;
  LrSchedule s(2.0, o);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 2.0);
}

TEST(Schedule, WarmupStableDecay) {
  ScheduleOptions o;
  o.warmup_steps = 10;
  o.total_steps = 110;
  o.decay = Decay::kWsd;
  o.wsd_decay_fraction = 0.2;  // decay over the last 20 of the 100 post-warmup steps
  o.min_lr = 1e-4;
  LrSchedule s(1e-3, o);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(89), 1e-3);  // p = 0.79: still stable
  EXPECT_DOUBLE_EQ(s.lr_at(90), 1e-3);  // p = 0.8: decay starts
  EXPECT_NEAR(s.lr_at(100), 1e-3 - 0.9e-3 * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
}

TEST(Schedule, BatchScalingRules) {
  EXPECT_DOUBLE_EQ(scaled_lr(1e-3, LrScaling::kNone, 256, 1024), 1e-3);
  EXPECT_DOUBLE_EQ(scaled_lr(1e-3, LrScaling::kLinear, 256, 1024), 4e-3);
  EXPECT_DOUBLE_EQ(scaled_lr(1e-3, LrScaling::kSqrt, 256, 1024), 2e-3);
  EXPECT_DOUBLE_EQ(scaled_lr(1e-3, LrScaling::kLinear, 0, 1024), 1e-3);  // base_batch 0: unchanged
  // An unknown rule is rejected where the config is read.
  EXPECT_THAT(test::bad_input_message([] { config::load_config("", {"optim.lr_scaling=cubic"}); }),
              HasSubstr("optim.lr_scaling: 'cubic' is not valid (valid: none, linear, sqrt)"));
}

TEST(Schedule, TheDefaultFloorIsAShareOfThePeak) {
  // min_lr -1 (the default): the floor is min_lr_ratio x the peak, so any optim.lr works;
  // an absolute min_lr moves with optim.lr_scaling (peak / configured lr).
  ScheduleOptions o;
  EXPECT_EQ(o.min_lr, -1.0);
  EXPECT_DOUBLE_EQ(o.floor_lr(2e-5, 2e-5), 2e-6);
  EXPECT_DOUBLE_EQ(o.floor_lr(4e-5, 2e-5), 4e-6);
  o.min_lr_ratio = 0;
  EXPECT_DOUBLE_EQ(o.floor_lr(4e-5, 2e-5), 0.0);
  o.min_lr = 1e-6;
  EXPECT_DOUBLE_EQ(o.floor_lr(4e-5, 2e-5), 2e-6);
  EXPECT_DOUBLE_EQ(o.floor_lr(4e-5, 0), 1e-6);
  // The schedule ends on the relative floor.
  ScheduleOptions rel;
  rel.warmup_steps = 0, rel.total_steps = 10;
  EXPECT_DOUBLE_EQ(LrSchedule(2e-5, rel).lr_at(10), 2e-6);
  EXPECT_DOUBLE_EQ(LrSchedule(2e-5, rel).lr_at(0), 2e-5);
}

TEST(Schedule, WarmupRatioAndEpochs) {
  // Hugging Face Trainer's rules (transformers TrainingArguments.get_warmup_steps):
  // warmup ceil(ratio x N); epochs x rows / global batch rounded up (a last partial
  // step still trains).
  ScheduleOptions o;
  o.total_steps = 1000, o.warmup_ratio = 0.03;
  o.resolve();
  EXPECT_EQ(o.warmup_steps, 30);
  o.total_steps = 100, o.warmup_ratio = 0.021;
  o.resolve();
  EXPECT_EQ(o.warmup_steps, 3);  // ceil(2.1)
  o.total_steps = 10, o.warmup_ratio = 0.01;
  o.resolve();
  EXPECT_EQ(o.warmup_steps, 1);  // never 0 when a ratio asks for warmup
  o.warmup_ratio = 0, o.warmup_steps = 7;
  o.resolve();
  EXPECT_EQ(o.warmup_steps, 7);  // ratio 0 leaves warmup_steps alone
  EXPECT_EQ(ScheduleOptions::steps_for_epochs(3, 10000, 64), 469);  // 30000 / 64 = 468.75
  EXPECT_EQ(ScheduleOptions::steps_for_epochs(1, 128, 64), 2);
  EXPECT_EQ(ScheduleOptions::steps_for_epochs(0.5, 128, 64), 1);
  EXPECT_EQ(ScheduleOptions::steps_for_epochs(0.01, 10, 64), 1);  // at least one step
}

TEST(Schedule, RejectsBadOptions) {
  auto expect_error = [](ScheduleOptions o, const std::string& key) {
    try {
      o.validate();
      FAIL() << "expected an error for " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_THAT(e.what(), HasSubstr(key));
    }
  };
  ScheduleOptions o;
  o.warmup_steps = 300;
  expect_error(o, "schedule.warmup_steps");
  o = {};
  o.total_steps = 0;
  expect_error(o, "schedule.total_steps");
  o = {};
  o.min_lr = -0.5;  // -1 is "relative"; other negatives are errors
  expect_error(o, "schedule.min_lr");
  o = {};
  o.min_lr_ratio = 1.5;
  expect_error(o, "schedule.min_lr_ratio");
  o = {};
  o.warmup_ratio = 1;
  expect_error(o, "schedule.warmup_ratio");
  o = {};
  o.epochs = -1;
  expect_error(o, "schedule.epochs");
  o.epochs = std::nan("");
  expect_error(o, "schedule.epochs");
  o = {};
  o.wsd_decay_fraction = 0;
  expect_error(o, "schedule.wsd_decay_fraction");
  // An unknown decay is rejected where the config is read, with the valid ones.
  try {
    config::load_config("", {"schedule.decay=step"});
    FAIL() << "expected an error for schedule.decay";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("schedule.decay: 'step' is not valid (valid: cosine, linear, constant, wsd)"));
  }
}

}  // namespace
}  // namespace gradguard::optim
