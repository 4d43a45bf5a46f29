// `gradguard bench seed` in its tiny mode end to end, and the analysis of a run's
// metrics on a hand-made file whose answers are known.
#include "gradguard/apps/seed.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;

TEST(SeedBench, AnalysisOfAKnownCurve) {
  test::TempDir dir;
  std::ostringstream m;
  // Steps 0..29, loss 3.0 flat; warmup 5; step 12 injected (ignored); step 20 spikes to
  // 3.6 (one spike, residual 0.6); step 25 skipped; a rollback event.
  for (int s = 0; s < 30; ++s) {
    double loss = s == 20 ? 3.6 : (s == 12 ? 9.0 : 3.0);
    m << nlohmann::json{{"step", s}, {"loss", loss}, {"skipped", s == 25}, {"elapsed_s", 0.5 * (s + 1)}}.dump() << "\n";
  }
  m << nlohmann::json{{"step", 26}, {"event", "rollback"}, {"to_step", 20}}.dump() << "\n";
  m << nlohmann::json{{"step", 30}, {"val_loss", 2.9}}.dump() << "\n";
  test::write_text(dir.file("metrics.jsonl"), m.str());
  auto r = seed::analyse_run(dir.file("metrics.jsonl"), {12}, 5, 64);
  EXPECT_EQ(r.steps, 30);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_EQ(r.rollbacks, 1);
  EXPECT_EQ(r.spikes, 1);
  EXPECT_NEAR(r.fluctuation, 0.6, 1e-12);
  EXPECT_NEAR(r.samples_per_s, 30 * 64 / 15.0, 1e-9);
  EXPECT_DOUBLE_EQ(r.final_val_loss, 2.9);

  test::write_text(dir.file("empty.jsonl"), "{\"step\": 0, \"val_loss\": 1}\n");
  EXPECT_THAT(test::bad_input_message([&] { seed::analyse_run(dir.file("empty.jsonl"), {}, 0, 1); }),
              HasSubstr("holds no step lines"));
}

TEST(SeedBench, TinyModeComparesTheFiveSetups) {
  test::TempDir dir;
  std::ostringstream text;
  for (int i = 0; i < 800; ++i) text << "Pack my box with five dozen liquor jugs, number " << i << ".\n";
  test::write_text(dir.file("corpus.txt"), text.str());
  ASSERT_EQ(test::run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir.path()).exit_code, 0);
  const std::string args = "bench seed --mode tiny --presets '" + test::source_path("configs/seed") +
                           "' --out seed --set data.train_path=data/train.bin --set data.val_path=data/val.bin";
  auto r = test::run_cli(args, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* setup : {"baseline", "history", "static_warmup", "tuned", "gradguard"})
    EXPECT_THAT(r.output, HasSubstr("| " + std::string(setup) + " |"));
  auto j = nlohmann::json::parse(test::read_text(dir.file("seed/seed.json")));
  ASSERT_EQ(j["setups"].size(), 5u);
  for (const auto& s : j["setups"]) {
    EXPECT_EQ(s["steps"].get<int64_t>() >= 40, true) << s;
    EXPECT_GT(s["samples_per_s"].get<double>(), 0) << s;
    EXPECT_GT(s["peak_rss_mb"].get<double>(), 10) << s;
    EXPECT_GT(s["cpu_util"].get<double>(), 0) << s;
    EXPECT_TRUE(s["final_val_loss"].is_number()) << s;
  }
  // Without a guard the injected batches are trained on; gradguard's guard skips them.
  EXPECT_EQ(j["setups"][0]["skipped"], 0);
  EXPECT_GE(j["setups"][4]["skipped"].get<int64_t>(), 3);
  EXPECT_TRUE(test::read_text(dir.file("seed/seed.md")).find("| setup |") != std::string::npos);
  // Every setup's report.html carries the table and links to the others' reports.
  for (const char* setup : {"baseline", "gradguard"}) {
    const std::string page = test::read_text(dir.file("seed/" + std::string(setup) + "/report.html"));
    EXPECT_THAT(page, HasSubstr("gradguard bench seed: all setups"));
    EXPECT_THAT(page, HasSubstr("../static_warmup/report.html"));
    EXPECT_THAT(page, HasSubstr("| tuned |"));
  }
  // Results are not overwritten without --force; a bad override names its key.
  r = test::run_cli(args, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--force"));
  r = test::run_cli(args + " --force --set optim.lr=-1", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("optim.lr"));
  r = test::run_cli("bench seed --mode huge", dir.path());
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace gradguard
