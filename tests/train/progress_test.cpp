// The progress display's modes (lines, jsonl, quiet), the fields it shows, and its ETA
// (an EMA of the seconds per step measured in this process, so a resumed run's ETA is
// not skewed by the time before the resume).
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/core/choice.h"
#include "gradguard/train/progress.h"

namespace gradguard::train {
namespace {
using config::ProgressMode;

// Runs `fn` with a Progress writing into a temporary file and returns what it wrote.
template <typename F>
std::string capture(ProgressMode mode, int64_t total, int64_t every, F&& fn) {
  std::FILE* f = std::tmpfile();
  {
    Progress p(mode, total, every, f);
    fn(p);
    p.finish();
  }
  std::rewind(f);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  std::fclose(f);
  return out;
}

StepMetrics metrics(int64_t step, double elapsed, double scale = 1) {
  StepMetrics m;
  m.step = step;
  m.loss = 2.5;
  m.lr = 1e-3;
  m.grad_norm = 0.75;
  m.loss_scale = scale;
  m.tokens_per_s = 1000;
  m.elapsed_s = elapsed;
  return m;
}

TEST(Progress, LinesModeShowsScaleAnomaliesAndEta) {
  const std::string out = capture(ProgressMode::kLines, 100, 10, [](Progress& p) {
    p.step(metrics(0, 2.0, 65536));  // first step: ETA = 99 x its own 2 s
    for (int64_t s = 1; s < 10; ++s) p.step(metrics(s, 2.0 + s, 65536), s >= 5 ? 1 : 0);
  });
  std::istringstream lines(out);
  std::string first, tenth;
  std::getline(lines, first);
  std::getline(lines, tenth);
  EXPECT_NE(first.find("step 1/100 | loss 2.5000 | lr 1.000e-03 | grad_norm 0.750 | scale 65536"), std::string::npos)
      << first;
  EXPECT_NE(first.find("ETA 3:18"), std::string::npos) << first;  // 99 x 2 s
  EXPECT_EQ(first.find("anomal"), std::string::npos) << first;
  EXPECT_NE(tenth.find("step 10/100"), std::string::npos) << tenth;
  EXPECT_NE(tenth.find("1 anomaly"), std::string::npos) << tenth;
  // EMA after 9 one-second steps: 1 + (2 - 1) * 0.9^9 = 1.387 s x 90 steps = 2:05.
  EXPECT_NE(tenth.find("ETA 2:05"), std::string::npos) << tenth;
  EXPECT_TRUE(lines.peek() == EOF);  // steps 2..9 print nothing in lines mode (every 10)
}

TEST(Progress, ResumedRunEtaIgnoresTimeBeforeTheResume) {
  // Resumed at step 500: elapsed_s counts from this process's start, so the first step's
  // 1 s is the estimate, not 1 s / 501 steps.
  const std::string json = capture(ProgressMode::kJsonl, 1000, 1, [](Progress& p) { p.step(metrics(500, 1.0)); });
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(json)["eta_s"].get<double>(), 499.0);
}

TEST(Progress, ValidationTimeIsAmortisedNotAveragedAsAStep) {
  // 1 s steps (tokens / tokens_per_s) with a 30 s validation before the fifth: the EMA stays
  // at 1 s and the 30 s spread over the 4 steps seen adds 7.5 s per step.
  const std::string out = capture(ProgressMode::kJsonl, 100, 1, [](Progress& p) {
    const double elapsed[] = {1, 2, 3, 4, 35};
    for (int64_t s = 0; s < 5; ++s) {
      StepMetrics m = metrics(s, elapsed[s]);
      m.tokens = 1000;
      p.step(m);
    }
  });
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) last = line;
  EXPECT_NEAR(nlohmann::json::parse(last)["eta_s"].get<double>(), 95 * (1.0 + 30.0 / 4), 1e-9);
}

TEST(Progress, JsonlModeWritesOneObjectPerStepAndMessage) {
  const std::string out = capture(ProgressMode::kJsonl, 4, 1, [](Progress& p) {
    p.line("hello");
    StepMetrics m = metrics(0, 1.0);
    m.loss = std::nan("");
    m.skipped = true;
    p.step(m, 2);
  });
  std::istringstream lines(out);
  std::string a, b;
  std::getline(lines, a);
  std::getline(lines, b);
  EXPECT_EQ(nlohmann::json::parse(a), nlohmann::json({{"message", "hello"}}));
  const auto j = nlohmann::json::parse(b);
  EXPECT_EQ(j["step"], 0);
  EXPECT_EQ(j["total_steps"], 4);
  EXPECT_TRUE(j["loss"].is_null());  // NaN travels as null
  EXPECT_EQ(j["skipped"], true);
  EXPECT_EQ(j["anomalies"], 2);
  EXPECT_DOUBLE_EQ(j["eta_s"].get<double>(), 3.0);
}

TEST(Progress, QuietAndNoneWriteNothing) {
  // By name, as log.progress reads them: "none" is another name for quiet.
  for (const char* mode : {"quiet", "none"}) {
    const std::string out = capture(parse_choice<ProgressMode>(mode, "log.progress"), 4, 1, [](Progress& p) {
      p.line("hello");
      p.step(metrics(0, 1.0));
    });
    EXPECT_EQ(out, "") << mode;
  }
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(65.4), "1:05");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

}  // namespace
}  // namespace gradguard::train
