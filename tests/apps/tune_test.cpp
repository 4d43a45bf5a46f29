// `gradguard tune`: how a probe is judged from its metrics.jsonl, the whole procedure on
// a seconds-long model (probes, decisions, a recommended config that loads), and its
// bad-input paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/apps/plan.h"
#include "gradguard/apps/tune.h"
#include "gradguard/config/config.h"
#include "test_util.h"

namespace gradguard::tune {
namespace {
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string step_line(int64_t step, const Json& loss, double clip_coef, bool skipped = false) {
  return Json{{"step", step}, {"loss", loss}, {"clip_coef", clip_coef}, {"skipped", skipped},
              {"elapsed_s", 0.1 * (step + 1)}, {"noise_scale", 8.0 + step}}
             .dump() +
         "\n";
}

TEST(TuneProbe, StableProbeMeasuresClippingAndNoise) {
  test::TempDir dir;
  std::string m;
  for (int64_t s = 0; s < 4; ++s) m += step_line(s, 3.0 - 0.1 * s, s < 1 ? 0.5 : 1.0);
  test::write_text(dir.file("metrics.jsonl"), m);
  Probe p;
  p.global_batch = 8;
  analyse_probe(dir.file("metrics.jsonl"), &p);
  EXPECT_TRUE(p.stable) << p.verdict;
  EXPECT_EQ(p.steps, 4);
  EXPECT_DOUBLE_EQ(p.clip_fraction, 0.25);
  EXPECT_DOUBLE_EQ(p.noise_scale, 10.0);  // median of 8, 9, 10, 11 (upper middle)
  // EMA(0.9) of 3.0, 2.9, 2.8, 2.7 as bench seed computes it.
  double ema = 3.0;
  for (double l : {2.9, 2.8, 2.7}) ema = 0.9 * ema + 0.1 * l;
  EXPECT_NEAR(p.final_loss, ema, 1e-12);
}

TEST(TuneProbe, EachInstabilityIsNamed) {
  test::TempDir dir;
  auto judge = [&](const std::string& metrics, int exit_code = 0) {
    test::write_text(dir.file("metrics.jsonl"), metrics);
    Probe p;
    p.global_batch = 8;
    p.exit_code = exit_code;
    analyse_probe(dir.file("metrics.jsonl"), &p);
    EXPECT_FALSE(p.stable);
    return p.verdict;
  };
  const std::string ok = step_line(0, 3.0, 1.0) + step_line(1, 2.9, 1.0);
  EXPECT_EQ(judge(ok + step_line(2, nullptr, 1.0)), "loss ended non-finite");
  EXPECT_EQ(judge(ok + step_line(2, 2.8, 1.0, true)), "1 skipped step(s)");
  EXPECT_EQ(judge(ok + Json{{"step", 1}, {"event", "anomaly"}, {"kind", "loss_spike"}, {"severity", "critical"}}.dump() +
                  "\n"),
            "1 critical anomaly");
  EXPECT_EQ(judge(ok + Json{{"step", 1}, {"event", "rollback"}, {"to_step", 0}}.dump() + "\n"), "1 rollback(s)");
  EXPECT_EQ(judge(ok, 3), "halted by its guard");
  // A warning-level anomaly does not make a probe unstable.
  test::write_text(dir.file("metrics.jsonl"),
                   ok + Json{{"step", 1}, {"event", "anomaly"}, {"kind", "x"}, {"severity", "warning"}}.dump() + "\n");
  Probe p;
  analyse_probe(dir.file("metrics.jsonl"), &p);
  EXPECT_TRUE(p.stable) << p.verdict;
  test::write_text(dir.file("metrics.jsonl"), "");
  EXPECT_THAT(test::bad_input_message([&] { analyse_probe(dir.file("metrics.jsonl"), &p); }), HasSubstr("no step lines"));
}

TEST(TuneOptionsTest, ValidateNamesTheFlag) {
  TuneOptions o;
  o.clip_values = {1.0, 0.3};
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--clip"));
  o = {};
  o.warmup_fractions = {0.02, 0.1};
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--warmup"));
  o = {};
  o.growth = 1.5;
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--growth"));
  o = {};
  o.probe_steps = 2;
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--steps"));
  o = {};
  o.device = "tpu";
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--device"));
  o = {};
  o.memory_gb = -1;
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--memory"));
  o = {};
  o.gpus = 0;
  EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr("--gpus"));
}

TEST(TuneMemory, RecommendationGetsTheMicroBatchPlanFitsOnTheDevice) {
  // tiny.yaml at global batch 64 on 2 GPUs: 32 sequences per rank. The device's memory is
  // set between plan's estimates of micro-batch 8 and 16, so 8 x accumulation 4 fits.
  auto cfg = config::load_config(test::source_path("configs/tiny.yaml"), {"batch.global_batch=64"});
  auto in = plan::PlanInputs::from_config(cfg, 2);
  auto at = [&](int64_t micro) {
    in.micro_batch = micro;
    return plan::estimate(in).total;
  };
  TuneOptions o;
  o.gpus = 2;
  o.memory_gb = (at(8) + at(16)) / 2 / 1e9;
  std::vector<std::string> rec{"optim.lr=0.001"};
  const auto d = memory_decision(cfg, o, &rec);
  EXPECT_EQ(rec, (std::vector<std::string>{"optim.lr=0.001", "batch.micro_batch=8"}));
  EXPECT_THAT(d, HasSubstr("on 2 x custom"));
  EXPECT_THAT(d, HasSubstr("micro-batch 8 x accumulation 4 without activation checkpointing fits"));
  // A named device whose memory cannot hold even micro-batch 1 with checkpointing: nothing
  // is added, and the sentence points to plan's layouts.
  o.device = "mi210";
  o.memory_gb = at(1) / 100 / 1e9;
  rec = {};
  EXPECT_THAT(memory_decision(cfg, o, &rec), HasSubstr("no micro-batch of the recommended run fits 2 x mi210"));
  EXPECT_TRUE(rec.empty());
  // Three GPUs cannot split 64 sequences: said, nothing added.
  o.gpus = 3;
  EXPECT_THAT(memory_decision(cfg, o, &rec), HasSubstr("does not divide over 3 GPUs"));
  EXPECT_TRUE(rec.empty());
  // Without a device: the estimate on this CPU, nothing added.
  EXPECT_THAT(memory_decision(cfg, {}, &rec), HasSubstr("per process on this CPU"));
  EXPECT_TRUE(rec.empty());
}

class TuneCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ostringstream text;
    for (int i = 0; i < 400; ++i) text << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = test::run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string args(const std::string& extra) const {
    return "tune --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin --steps 6 " + extra;
  }
  test::TempDir dir_;
};

TEST_F(TuneCli, RecommendsAConfigWithEvidence) {
  // tiny.yaml: micro 4 x accum 2 = 8 sequences; sweeps at 4, growth to 8 and 16.
  auto r = test::run_cli(args("--clip 0.3,1.0 --warmup 0.3,0.1 --lr-scale 1,2 --max-batch 16 --noise-ratio 0"),
                         dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tune [clip] batch 4 clip.max_norm=0.3"));
  const Json j = Json::parse(test::read_text(dir_.file("runs/tune/tune.json")));
  std::map<std::string, int> phases;
  for (const auto& p : j["probes"]) {
    ++phases[p["phase"].get<std::string>()];
    EXPECT_EQ(p["steps"], 6) << p.dump();
    EXPECT_TRUE(std::filesystem::exists(dir_.file("runs/tune/probes/" + p["name"].get<std::string>() + "/metrics.jsonl")));
  }
  EXPECT_EQ(phases["clip"], 2);
  EXPECT_EQ(phases["warmup"], 2);
  EXPECT_EQ(phases["lr"], 2);
  EXPECT_GE(phases["batch"], 1);
  EXPECT_LE(phases["batch"], 2);
  ASSERT_GE(j["decisions"].size(), 4u);
  // The recommendation is a complete config the trainer accepts, with the chosen values.
  const auto rec = j["recommendation"].get<std::vector<std::string>>();
  ASSERT_EQ(rec.size(), 6u);
  EXPECT_THAT(rec[0], HasSubstr("clip.max_norm="));
  EXPECT_EQ(rec[1], "schedule.warmup_ratio=0");  // a config's ratio would override the tuned warmup_steps
  const auto cfg = config::load_config(dir_.file("runs/tune/tune.yaml"), {});
  const std::string batch = rec[5].substr(rec[5].find('=') + 1);
  EXPECT_EQ(cfg.batch.global_batch, std::stoll(batch));
  EXPECT_EQ(cfg.optim.lr_scaling, optim::LrScaling::kNone);  // tune's optim.lr must not be scaled again
  // The clip choice follows the rule: the first (safest) stable probe within 1% of the best.
  double best = 1e300;
  for (const auto& p : j["probes"])
    if (p["phase"] == "clip" && p["stable"].get<bool>()) best = std::min(best, p["final_loss"].get<double>());
  std::string expected;
  for (const auto& p : j["probes"])
    if (p["phase"] == "clip" && p["stable"].get<bool>() && p["final_loss"].get<double>() <= best + 0.01 * best) {
      expected = p["settings"][0].get<std::string>();
      break;
    }
  EXPECT_EQ(rec[0], expected);
  EXPECT_THAT(test::read_text(dir_.file("runs/tune/tune.md")), HasSubstr("## Decisions"));
  // A second run without --force keeps the evidence.
  r = test::run_cli(args("--clip 0.3 --warmup 0.1 --lr-scale 1 --max-batch 4"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--force"));
}

TEST_F(TuneCli, AFineTuneIsNeverRecommendedAShortWarmup) {
  // bench natural (docs/natural.md): without 10 warmup steps a fine-tune's first updates
  // jump the loss. 5% of 100 steps is 5: raised to 10, and the decision says why.
  auto r = test::run_cli("train --config '" + test::source_path("configs/tiny.yaml") +
                             "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin",
                         dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_cli(args("--clip 0.3 --warmup 0.05 --lr-scale 1 --max-batch 4 --set schedule.total_steps=100 "
                         "--set model.init_from=runs/tiny/checkpoints/step-0000006"),
                    dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(test::read_text(dir_.file("runs/tune/tune.json")));
  const auto rec = j["recommendation"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(rec.begin(), rec.end(), "schedule.warmup_steps=10"), rec.end()) << j["recommendation"];
  EXPECT_THAT(j["decisions"].dump(), HasSubstr("warmup: 5 steps raised to 10"));
  // From random init the same choice stands.
  r = test::run_cli(args("--clip 0.3 --warmup 0.05 --lr-scale 1 --max-batch 4 --set schedule.total_steps=100 --force"),
                    dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rec2 = Json::parse(test::read_text(dir_.file("runs/tune/tune.json")))["recommendation"];
  EXPECT_THAT(rec2.dump(), HasSubstr("schedule.warmup_steps=5"));
}

TEST_F(TuneCli, BadInputExitsTwoBeforeAnyProbe) {
  auto r = test::run_cli(args("--clip 1.0,0.3"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--clip"));
  r = test::run_cli(args("--set optim.lr=-1"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("optim.lr"));
  r = test::run_cli(args("--device tpu"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("unknown device 'tpu'"));
  r = test::run_cli(args("--start-batch 6"), dir_.path());  // not a multiple of micro_batch 4
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("batch.global_batch"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("runs/tune/tune.json")));
}

}  // namespace
}  // namespace gradguard::tune
