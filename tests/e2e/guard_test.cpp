// End-to-end tests of the guard through the `gradguard` executable: injected faults are
// detected at their steps and recovered from, each recovery action does what it says,
// snapshots hold the evidence, replay tells reproducing from non-reproducing anomalies,
// and telemetry reaches metrics.jsonl on a machine without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "test_util.h"

namespace gradguard {
namespace {
namespace stdfs = std::filesystem;
using ::testing::HasSubstr;
using test::run_cli;

class Guard : public ::testing::Test {
 protected:
  void SetUp() override {
    // Random sentences over a small vocabulary: the loss falls to a plateau instead of
    // memorising a repeated line, like real text at this model size.
    const char* words[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
                           "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
                           "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"};
    std::ostringstream text;
    uint64_t x = 12345;
    for (int line = 0; line < 1500; ++line) {
      for (int k = 0; k < 8; ++k) {
        x = (x * 1103515245 + 12345) % (1ULL << 31);
        text << (k ? " " : "") << words[(x >> 16) % 26];
      }
      text << ".\n";
    }
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // The tiny model for `steps` steps, checkpoints every 10, validation at the end.
  std::string train_args(int steps, const std::string& extra) const {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin"
           " --set schedule.total_steps=" + std::to_string(steps) +
           " --set schedule.warmup_steps=5 --set eval.every=0 --set eval.batches=8 --set checkpoint.every=10"
           " --set checkpoint.keep_last=0 --set log.every=10 " + extra;
  }
  std::vector<nlohmann::json> lines(const std::string& run) const {
    return test::read_jsonl(dir_.file("runs/" + run + "/metrics.jsonl"));
  }
  std::vector<nlohmann::json> events(const std::string& run, const std::string& kind) const {
    std::vector<nlohmann::json> out;
    for (auto& l : lines(run))
      if (l.value("event", "") == kind) out.push_back(l);
    return out;
  }
  double final_val_loss(const std::string& run) const {
    double v = NAN;
    for (auto& l : lines(run))
      if (l.contains("val_loss")) v = l["val_loss"];
    return v;
  }
  std::string snapshot_dir(const std::string& run) const {
    for (const auto& e : stdfs::directory_iterator(dir_.file("runs/" + run + "/snapshots")))
      return e.path().string();
    return "";
  }
  test::TempDir dir_;
};

TEST_F(Guard, InjectedFaultsAreDetectedAtTheirStepsAndTheRunRecovers) {
  // Long enough for the loss to level off, so the steps the guard discards cost little.
  const int steps = 400;
  const std::string common = "--set optim.lr=5e-3 --set schedule.warmup_steps=10 --set checkpoint.every=20 ";
  auto clean = run_cli(train_args(steps, common + "--name clean"), dir_.path());
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  for (const auto& a : events("clean", "anomaly"))
    EXPECT_NE(a["severity"], "critical") << "false alarm in a healthy run: " << a;

  auto r = run_cli(train_args(steps, common + "--name faults "
                                     "--set guard.inject.nonfinite_steps=[100] --set guard.inject.spike_steps=[200] "
                                     "--set guard.inject.overflow_storm=[300,3]"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<int64_t> critical_steps;
  for (const auto& a : events("faults", "anomaly"))
    if (a["severity"] == "critical") critical_steps.insert(a["step"].get<int64_t>());
  EXPECT_EQ(critical_steps, (std::set<int64_t>{100, 200, 300, 301, 302}));
  std::map<int64_t, std::string> actions;
  for (const auto& e : events("faults", "recovery")) actions[e["step"]] = e["action"];
  EXPECT_EQ(actions, (std::map<int64_t, std::string>{
                         {100, "skip"}, {200, "skip"}, {300, "skip"}, {301, "cooldown"}, {302, "reset_moments"}}));
  // The storm escalated (the same kind again within guard.recovery.calm_steps); the
  // nonfinite step and the spike were independent events, each skipped.
  // No anomalous update was applied, and every applied step's numbers are finite.
  for (const auto& l : lines("faults")) {
    if (l.contains("event") || !l.contains("loss")) continue;
    if (critical_steps.count(l["step"].get<int64_t>())) EXPECT_TRUE(l["skipped"].get<bool>()) << l;
    else EXPECT_FALSE(l["loss"].is_null()) << l;
  }
  // Nothing non-finite reached the weights.
  auto weights = checkpoint::load_safetensors(dir_.file("runs/faults/checkpoints/step-0000400/model.safetensors"));
  for (const auto& [name, t] : weights.tensors) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << name;
  // The final validation loss is within 5% of the run without faults.
  const double v_clean = final_val_loss("clean"), v_faults = final_val_loss("faults");
  EXPECT_LT(std::abs(v_faults - v_clean), 0.05 * v_clean) << v_clean << " vs " << v_faults;
  EXPECT_THAT(r.output, HasSubstr("step 200: anomaly"));
  EXPECT_THAT(r.output, HasSubstr("5 recovery actions"));
}

TEST_F(Guard, SnapshotHoldsTheEvidenceAndReplayReproducesADataSpike) {
  auto r = run_cli(train_args(40, "--name spike --set guard.inject.spike_steps=[30]"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string snap = snapshot_dir("spike");
  ASSERT_THAT(snap, HasSubstr("step-0000030-"));
  for (const char* f : {"model/config.json", "model/model.safetensors", "optimizer.safetensors",
                        "gradients.safetensors", "batch.safetensors", "state.json", "metrics.jsonl",
                        "telemetry.jsonl", "config.yaml", "diagnosis.json", "diagnosis.md"})
    EXPECT_TRUE(stdfs::exists(snap + "/" + f)) << f;
  auto batch = checkpoint::load_safetensors(snap + "/batch.safetensors");
  EXPECT_EQ(batch.tensors["inputs"].sizes(), (std::vector<int64_t>{2, 4, 16}));  // [accum, micro, T]
  // Sample numbers follow docs/design.md: k = (step * accum + m) * micro + row.
  EXPECT_EQ(batch.tensors["sample_index"][1][3].item<int64_t>(), (30 * 2 + 1) * 4 + 3);
  auto optim = checkpoint::load_safetensors(snap + "/optimizer.safetensors");
  EXPECT_TRUE(optim.tensors.count("exp_avg_sq/model.layers.0.mlp.down_proj.weight"));
  EXPECT_EQ(optim.metadata["step/lm_head.weight"], "30");
  auto state = nlohmann::json::parse(test::read_text(snap + "/state.json"));
  EXPECT_EQ(state["step"], 30);
  EXPECT_EQ(state["injected"], "spike_batch");
  EXPECT_EQ(state["micro_losses"].size(), 2u);
  auto history = test::read_text(snap + "/metrics.jsonl");
  EXPECT_THAT(history, HasSubstr("\"step\":29"));
  auto diagnosis = nlohmann::json::parse(test::read_text(snap + "/diagnosis.json"));
  EXPECT_EQ(diagnosis["causes"][0]["cause"], "injected");
  EXPECT_FALSE(diagnosis["layers"].empty());
  EXPECT_THAT(test::read_text(snap + "/diagnosis.md"), HasSubstr("Likely causes"));

  auto replay = run_cli("replay '" + snap + "' --top 3", dir_.path());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_THAT(replay.output, HasSubstr("REPRODUCED"));
  EXPECT_THAT(replay.output, ::testing::Not(HasSubstr("NOT REPRODUCED")));
  auto report = nlohmann::json::parse(test::read_text(snap + "/replay.json"));
  EXPECT_TRUE(report["reproduced"].get<bool>());
  EXPECT_EQ(report["micro_batches"].size(), 2u);
  ASSERT_EQ(report["top_samples"].size(), 3u);
  // The named samples are the step's own, largest gradient first.
  const int64_t first = (30 * 2) * 4;
  for (const auto& s : report["top_samples"]) {
    EXPECT_GE(s["sample_index"].get<int64_t>(), first);
    EXPECT_LT(s["sample_index"].get<int64_t>(), first + 8);
  }
  EXPECT_GE(report["top_samples"][0]["grad_norm"].get<double>(), report["top_samples"][1]["grad_norm"].get<double>());
}

TEST_F(Guard, AModelOverTheSnapshotBudgetLeavesAReferenceThatReplaysBitForBit) {
  // A 7B model's weights, gradients and moments (> 100 GB) never fit guard.snapshot.max_mb;
  // here the tiny model's ~0.6 MB do not fit 0.05 MiB. The snapshot names the checkpoint
  // of step 30 instead, keeps it from pruning (keep_last 1 would remove it at step 40),
  // and replay re-executes steps 30..35 to the recorded step.
  auto r = run_cli(train_args(45, "--name big --set guard.inject.spike_steps=[35] --set guard.snapshot.max_mb=0.05 "
                                  "--set checkpoint.keep_last=1"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string snap = snapshot_dir("big");
  ASSERT_THAT(snap, HasSubstr("step-0000035-"));
  for (const char* f : {"model", "optimizer.safetensors", "gradients.safetensors"})
    EXPECT_FALSE(stdfs::exists(snap + "/" + f)) << f;
  const auto ref = nlohmann::json::parse(test::read_text(snap + "/reference.json"));
  EXPECT_EQ(ref["checkpoint"], "checkpoints/step-0000030");
  EXPECT_EQ(ref["from_step"], 30);
  EXPECT_EQ(ref["world_size"], 1);
  EXPECT_GT(ref["full_bytes"].get<int64_t>(), 100 * 1024);
  int64_t bytes = 0;
  for (const auto& e : stdfs::recursive_directory_iterator(snap))
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  EXPECT_LT(bytes, ref["full_bytes"].get<int64_t>() / 4);  // the batch and the records only
  // Pruning kept the referenced checkpoint beside the newest.
  EXPECT_TRUE(stdfs::exists(dir_.file("runs/big/checkpoints/step-0000030/manifest.json")));
  EXPECT_TRUE(stdfs::exists(dir_.file("runs/big/checkpoints/step-0000045/manifest.json")));
  EXPECT_FALSE(stdfs::exists(dir_.file("runs/big/checkpoints/step-0000040")));

  auto replay = run_cli("replay '" + snap + "' --json --top 2", dir_.path());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const auto report = nlohmann::json::parse(replay.output);
  const auto state = nlohmann::json::parse(test::read_text(snap + "/state.json"));
  EXPECT_TRUE(report["reproduced"].get<bool>()) << report.dump(1);
  EXPECT_TRUE(report["bitwise"].get<bool>()) << report.dump(1);
  EXPECT_EQ(report["loss"].get<double>(), state["loss"].get<double>());
  EXPECT_EQ(report["grad_norm"].get<double>(), state["grad_norm"].get<double>());
  EXPECT_THAT(report["replayed_from"].get<std::string>(), HasSubstr("checkpoints/step-0000030, re-executing steps 30..35"));
  EXPECT_EQ(report["micro_batches"].size(), 2u);  // the breakdown ran on the re-executed weights
  EXPECT_EQ(report["top_samples"].size(), 2u);
  // Nothing of the run changed, and a removed checkpoint is named.
  stdfs::remove_all(dir_.file("runs/big/checkpoints/step-0000030"));
  auto gone = run_cli("replay '" + snap + "'", dir_.path());
  EXPECT_EQ(gone.exit_code, 2) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("step-0000030: is gone"));
  // A reference that is not one gradguard writes: exit 2 naming reference.json.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"checkpoint": "checkpoints/step-0000030", "from_step": 30, "world_size": 2})", "the run had 2 ranks"},
      {R"({"checkpoint": "../../elsewhere", "from_step": 30, "world_size": 1})", "must name checkpoints/step-N"},
      {R"({"checkpoint": "", "from_step": 99, "world_size": 1})", "from_step 99 is after the step 35"},
      {R"({"checkpoint": 3})", "reference.json: malformed"},
  };
  for (const auto& [text, needle] : bad) {
    test::write_text(snap + "/reference.json", text);
    auto r2 = run_cli("replay '" + snap + "'", dir_.path());
    EXPECT_EQ(r2.exit_code, 2) << text << "\n" << r2.output;
    EXPECT_THAT(r2.output, HasSubstr(needle)) << text;
  }
}

TEST_F(Guard, AReferenceBeforeTheFirstCheckpointReplaysFromTheRunsStart) {
  // No checkpoint before the step (checkpoint.every 0): the reference is the run's start
  // (the seeded initialisation), and replay runs steps 0..30 again.
  auto r = run_cli(train_args(32, "--name early --set guard.inject.spike_steps=[30] --set guard.snapshot.max_mb=0.05 "
                                  "--set checkpoint.every=0"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string snap = snapshot_dir("early");
  ASSERT_THAT(snap, HasSubstr("step-0000030-"));
  const auto ref = nlohmann::json::parse(test::read_text(snap + "/reference.json"));
  EXPECT_EQ(ref["checkpoint"], "");
  auto replay = run_cli("replay '" + snap + "' --json --top 0", dir_.path());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const auto report = nlohmann::json::parse(replay.output);
  EXPECT_TRUE(report["bitwise"].get<bool>()) << report.dump(1);
  EXPECT_THAT(report["replayed_from"].get<std::string>(), HasSubstr("the run's start, re-executing steps 0..30"));
}

TEST_F(Guard, ReplayOfATransientFaultDoesNotReproduce) {
  auto r = run_cli(train_args(20, "--name transient --set guard.inject.nonfinite_steps=[12]"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string snap = snapshot_dir("transient");
  ASSERT_THAT(snap, HasSubstr("step-0000012-nonfinite"));
  auto replay = run_cli("replay '" + snap + "' --json --top 0", dir_.path());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  auto report = nlohmann::json::parse(replay.output);
  EXPECT_FALSE(report["reproduced"].get<bool>());
  EXPECT_EQ(report["verdict"], "not_reproduced");
  EXPECT_TRUE(report["recorded_nonfinite"].get<bool>());
  EXPECT_FALSE(report["nonfinite"].get<bool>());
  EXPECT_THAT(report["explanation"].get<std::string>(), HasSubstr("injected"));
  EXPECT_TRUE(report["top_samples"].empty());
}

TEST_F(Guard, ReplayRejectsWhatIsNotASnapshot) {
  auto r = run_cli("replay data", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("not a snapshot: state.json is missing"));
  r = run_cli("replay data --rtol 0", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST_F(Guard, RollbackRestoresTheLastCheckpointAndSkipsTheDataWindow) {
  auto r = run_cli(train_args(40, "--name rb --set guard.recovery.ladder=[rollback] "
                                  "--set guard.recovery.rollback_skip_steps=2 --set guard.inject.spike_steps=[25]"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rb = events("rb", "rollback");
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0]["step"], 25);
  EXPECT_EQ(rb[0]["to_step"], 20);
  EXPECT_EQ(rb[0]["data_offset"], 25 + 1 - 20 + 2);
  EXPECT_THAT(rb[0]["checkpoint"].get<std::string>(), HasSubstr("step-0000020"));
  // Steps 20..25 ran twice; the run still ends at step 40 with a finite loss.
  int step20 = 0;
  for (const auto& l : lines("rb"))
    if (!l.contains("event") && l.contains("loss") && l["step"] == 20) ++step20;
  EXPECT_EQ(step20, 2);
  EXPECT_THAT(r.output, HasSubstr("summary: 40 steps"));
  EXPECT_THAT(r.output, HasSubstr("rolled back to"));
  // A resume carries the data offset on: the final checkpoint's state has it.
  auto st = nlohmann::json::parse(test::read_text(dir_.file("runs/rb/checkpoints/step-0000040/trainer_state.json")));
  EXPECT_EQ(st["data_offset"], 8);
  EXPECT_EQ(st["guard"]["recovery"]["rollbacks"], 1);
}

TEST_F(Guard, RollbackWithoutACheckpointEscalates) {
  auto r = run_cli(train_args(12, "--name nock --set checkpoint.every=0 --set guard.recovery.ladder=[rollback,halt] "
                                  "--set guard.inject.nonfinite_steps=[3]"),
                   dir_.path());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no checkpoint to roll back to"));
}

TEST_F(Guard, MomentResetAndCooldown) {
  auto r = run_cli(train_args(20, "--name reset --set guard.recovery.ladder=[reset_moments] "
                                  "--set guard.recovery.cooldown_steps=3 --set guard.recovery.cooldown_factor=0.5 "
                                  "--set guard.inject.nonfinite_steps=[12]"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rec = events("reset", "recovery");
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0]["action"], "reset_moments");
  EXPECT_EQ(rec[0]["tensors_reset"], 1);  // the inf was put into the embedding
  auto clean = run_cli(train_args(20, "--name plain"), dir_.path());
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  std::map<int64_t, double> lr_reset, lr_plain;
  for (const auto& l : lines("reset"))
    if (!l.contains("event") && l.contains("lr")) lr_reset[l["step"]] = l["lr"];
  for (const auto& l : lines("plain"))
    if (!l.contains("event") && l.contains("lr")) lr_plain[l["step"]] = l["lr"];
  for (int64_t s : {13, 14, 15}) EXPECT_DOUBLE_EQ(lr_reset[s], 0.5 * lr_plain[s]) << s;
  for (int64_t s : {12, 16, 17}) EXPECT_DOUBLE_EQ(lr_reset[s], lr_plain[s]) << s;
}

TEST_F(Guard, HaltExitsWithThreeAndTheSnapshotPath) {
  auto r = run_cli(train_args(20, "--name halt --set guard.recovery.ladder=[halt] --set guard.inject.nonfinite_steps=[7]"),
                   dir_.path());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Snapshot: "));
  EXPECT_THAT(r.output, HasSubstr("snapshots/step-0000007-nonfinite"));
  EXPECT_TRUE(stdfs::exists(dir_.file("runs/halt/snapshots/step-0000007-nonfinite/diagnosis.md")));
}

TEST_F(Guard, OverflowStormUnderADynamicScaler) {
  auto r = run_cli(train_args(30, "--name storm --set amp.scaler.mode=dynamic --set amp.scaler.init_scale=1024 "
                                  "--set guard.inject.overflow_storm=[15,4]"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> skips;
  for (const auto& e : events("storm", "skip")) skips.push_back(e["step"]);
  EXPECT_EQ(skips, (std::vector<int64_t>{15, 16, 17, 18}));
  std::vector<nlohmann::json> anomalies;
  for (const auto& a : events("storm", "anomaly"))
    if (a["severity"] == "critical") anomalies.push_back(a);
  ASSERT_FALSE(anomalies.empty());
  EXPECT_EQ(anomalies[0]["kind"], "backoff_storm");
  EXPECT_EQ(anomalies[0]["step"], 17);  // the third backoff within 20 steps
}

TEST_F(Guard, TelemetryAndNoiseScaleReachTheMetrics) {
  auto r = run_cli(train_args(30, "--name tele --set telemetry.period_ms=50 --set guard.noise_scale.every=1 "
                                  "--set guard.noise_scale.warn_after=5 --set guard.noise_scale.warn_ratio=0.001"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto tele = events("tele", "telemetry");
  ASSERT_GE(tele.size(), 2u);
  EXPECT_GT(tele[0]["rss_mb"].get<double>(), 0);
  EXPECT_EQ(tele[0]["gpu_count"], 0);
  int with_noise = 0;
  for (const auto& l : lines("tele"))
    if (!l.contains("event") && l.contains("noise_scale")) ++with_noise;
  EXPECT_GE(with_noise, 25);
  EXPECT_EQ(events("tele", "warning").size(), 1u);  // warned once
  EXPECT_THAT(r.output, HasSubstr("gradient noise scale"));
}

TEST_F(Guard, ZLossIsLoggedApartAndTwoRanksReportTheOneProcessValue) {
  // loss.z_loss adds c x logsumexp^2 to the objective; metrics.jsonl gets it as z_loss and
  // keeps `loss` the cross-entropy. Over two ranks each rank's share travels with the
  // gradient all-reduce, so the logged term is the global batch's, as in one process.
  const std::string z = " --set loss.z_loss=1e-3 --set batch.global_batch=8 --set log.every=1 ";
  auto r = run_cli(train_args(6, z + "--set run.name=z1"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("launch --nproc 2 -- " + train_args(6, z + "--set run.name=z2"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto steps = [&](const std::string& run) {
    std::vector<nlohmann::json> out;
    for (auto& l : lines(run))
      if (l.contains("loss") && !l.contains("event")) out.push_back(l);
    return out;
  };
  const auto one = steps("z1"), two = steps("z2");
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(two.size(), 6u);
  for (size_t k = 0; k < one.size(); ++k) {
    ASSERT_TRUE(one[k].contains("z_loss")) << one[k].dump();
    const double z1 = one[k]["z_loss"], z2 = two[k]["z_loss"];
    // c x log^2 Z: log Z of a fresh 256-token model is near log(256) = 5.5, so about 0.03.
    EXPECT_GT(z1, 1e-3 * 4.0 * 4.0) << one[k].dump();
    EXPECT_LT(z1, 1e-3 * 8.0 * 8.0) << one[k].dump();
    EXPECT_NEAR(z2, z1, 1e-4 * z1) << "step " << k;
    EXPECT_NEAR(two[k]["loss"].get<double>(), one[k]["loss"].get<double>(), 1e-4);
  }
  // Off: no z_loss key.
  EXPECT_FALSE(lines("z1").empty());
  r = run_cli(train_args(6, "--set log.every=1 --set run.name=z0"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto& l : lines("z0")) EXPECT_FALSE(l.contains("z_loss")) << l.dump();
}

TEST_F(Guard, SkipRuleDropsAnInjectedSpikeAndResumesWithItsWindow) {
  // The detector's own rules are off, so only guard.skip_rule can drop the random-token
  // batch at step 30; without the rule the same step is applied.
  const std::string common =
      " --set guard.inject.spike_steps=[30] --set guard.loss_zscore=0 --set guard.grad_norm_factor=0"
      " --set guard.layer_zscore=0 --set log.every=1 --set checkpoint.every=20 --set schedule.decay=constant ";
  const std::string rule = " --set guard.skip_rule.sigma=4 --set guard.skip_rule.window=16 ";
  auto r = run_cli(train_args(40, common + rule + "--set run.name=rule"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step 30: skipped by guard.skip_rule"));
  auto step_line = [&](const std::string& run, int64_t step) {
    for (auto& l : lines(run))
      if (!l.contains("event") && l.contains("loss") && l["step"] == step) return l;
    return nlohmann::json();
  };
  bool found = false;
  for (auto& e : events("rule", "skip"))
    if (e["step"] == 30) {
      found = true;
      EXPECT_EQ(e["reason"], "skip_rule");
      EXPECT_GT(e["loss"].get<double>(), e["loss_limit"].get<double>()) << e.dump();
    }
  EXPECT_TRUE(found);
  EXPECT_TRUE(step_line("rule", 30)["skipped"].get<bool>());

  r = run_cli(train_args(40, common + "--set run.name=norule"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(step_line("norule", 30)["skipped"].get<bool>());
  EXPECT_TRUE(events("norule", "skip").empty());

  // Resumed at step 20 (a constant schedule, so 20 + 20 steps are the 40 straight ones),
  // the rule's window comes back with the checkpoint: the same steps are skipped with the
  // same limits.
  r = run_cli(train_args(20, common + rule + "--set run.name=split"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli(train_args(40, common + rule + "--set run.name=split --resume runs/split"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<int64_t, double> straight, resumed;
  for (auto& e : events("rule", "skip")) straight[e["step"]] = e["loss_limit"];
  for (auto& e : events("split", "skip")) resumed[e["step"]] = e["loss_limit"];
  EXPECT_EQ(resumed, straight);
}

TEST_F(Guard, PrecisionFallbackComputesWiderForItsWindow) {
  // bf16 autocast with a dynamic scaler on the CPU; three injected overflows in a row make
  // a backoff storm at step 7, and the ladder's first rung then computes in float32 for 5
  // steps, recorded on each step line, before bf16 returns.
  auto r = run_cli(train_args(20, "--name fallback --set amp.dtype=bf16 --set amp.scaler.mode=dynamic "
                                  "--set amp.scaler.init_scale=1024 --set guard.inject.overflow_storm=[5,3] "
                                  "--set guard.recovery.ladder=[precision,skip,halt] "
                                  "--set guard.recovery.precision_steps=5 --set log.every=1"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rec = events("fallback", "recovery");
  ASSERT_EQ(rec.size(), 1u) << r.output;
  EXPECT_EQ(rec[0]["step"], 7);
  EXPECT_EQ(rec[0]["action"], "precision");
  std::vector<int64_t> wide;
  for (auto& l : lines("fallback"))
    if (!l.contains("event") && l.contains("loss") && l.contains("compute_dtype")) {
      EXPECT_EQ(l["compute_dtype"], "fp32");
      wide.push_back(l["step"]);
    }
  EXPECT_EQ(wide, (std::vector<int64_t>{8, 9, 10, 11, 12}));
  // bf16 weights cannot compute wider: the rung is refused with the key named.
  r = run_cli(train_args(6, "--name refused --set amp.dtype=bf16 --set memory.weights_dtype=bf16 "
                            "--set guard.recovery.ladder=[precision,halt]"),
              dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("guard.recovery.ladder"));
}

}  // namespace
}  // namespace gradguard
