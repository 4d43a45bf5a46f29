// ZeRO stage 1 end to end: real Gloo ranks started by `gradguard launch` on this CPU.
// References: the replicated data-parallel run with the same ranks (the same gradient
// sums, so the weights, the global and the per-layer gradient norms must be bit-identical:
// sharding changes where the optimizer state lives, not the arithmetic), and one process
// with the same global batch (equal up to the summation order of the ranks' gradients:
// a relative norm difference below 1e-6). Also: a resume at another world size (2 -> 1,
// 2 -> 3) continues as the straight run does, an inf on one rank skips the step on every
// rank, bf16 weights with float32 masters resume bit for bit, and the combinations that
// cannot work stop with exit 2 naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;

// A launch that must succeed; on failure its whole output (every rank's lines, the
// launcher's) is in the test's log, so a failure under load can be read afterwards.
#define ASSERT_RAN(expr)                                                      \
  do {                                                                        \
    const test::CliResult ran_ = (expr);                                      \
    ASSERT_EQ(ran_.exit_code, 0) << ran_.output;                              \
  } while (0)
namespace stdfs = std::filesystem;

class Zero : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* words[] = {"amber", "basil", "cedar", "dune", "ember", "fern", "grove", "heath", "iris", "jade"};
    std::ostringstream text;
    uint64_t x = 4242;
    for (int line = 0; line < 1200; ++line) {
      for (int k = 0; k < 8; ++k) {
        x = (x * 1103515245 + 12345) % (1ULL << 31);
        text << (k ? " " : "") << words[(x >> 16) % 10];
      }
      text << ".\n";
    }
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = test::run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // The tiny model, global batch 24 (micro 4), 8 steps, checkpoints at 4 and 8.
  std::string args(const std::string& run, const std::string& extra = "") const {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin --set run.name=" + run +
           " --set run.threads=1 --set batch.global_batch=24 --set batch.micro_batch=4 --set schedule.total_steps=8"
           " --set eval.every=0 --set checkpoint.every=4 --set checkpoint.keep_last=0 --set log.progress=lines"
           " --set log.every=1000 " + extra;
  }
  test::CliResult launch(int ranks, const std::string& a) const {
    return ranks == 1 ? test::run_cli(a, dir_.path())
                      : test::run_cli("launch --nproc " + std::to_string(ranks) + " -- " + a, dir_.path());
  }
  std::map<std::string, at::Tensor> weights(const std::string& run, int step) const {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step-%07d/model.safetensors", step);
    return checkpoint::load_safetensors(dir_.file("runs/" + run + name)).tensors;
  }
  std::vector<nlohmann::json> steps(const std::string& run) const {
    std::vector<nlohmann::json> out;
    for (auto& l : test::read_jsonl(dir_.file("runs/" + run + "/metrics.jsonl")))
      if (l.contains("loss") && !l.contains("event")) out.push_back(l);
    return out;
  }
  // ||a - b|| / ||a|| over all tensors, in float64.
  static double relative_difference(const std::map<std::string, at::Tensor>& a,
                                    const std::map<std::string, at::Tensor>& b) {
    double diff = 0, norm = 0;
    for (const auto& [name, t] : a) {
      const auto x = t.to(torch::kDouble), y = b.at(name).to(torch::kDouble);
      diff += (x - y).pow(2).sum().item<double>();
      norm += x.pow(2).sum().item<double>();
    }
    return std::sqrt(diff / norm);
  }
  // Copies run `from` to `to` without its step-8 checkpoint, so `to` resumes from step 4.
  void copy_to_step4(const std::string& from, const std::string& to) const {
    stdfs::copy(dir_.file("runs/" + from), dir_.file("runs/" + to), stdfs::copy_options::recursive);
    stdfs::remove_all(dir_.file("runs/" + to + "/checkpoints/step-0000008"));
    test::write_text(dir_.file("runs/" + to + "/checkpoints/latest"), "step-0000004\n");
  }
  test::TempDir dir_;
};

TEST_F(Zero, TwoAndThreeRanksEqualTheReplicatedRunAndOneProcess) {
  // The foreach kernel does the same elementwise arithmetic on a shard's segments as on
  // whole tensors, so the runs below agree bit for bit. LibTorch 2.x's fused CPU kernel
  // rounds its vectorised body and its scalar tail differently (fused multiply-adds), and
  // a segment boundary moves which elements fall in the tail: the last test of this
  // block holds that kernel to 1e-6 instead.
  const std::string foreach = " --set optim.implementation=foreach ";
  ASSERT_RAN(launch(1, args("single", foreach)));
  const auto single = weights("single", 8);
  for (int ranks : {2, 3}) {
    const std::string z = "zero" + std::to_string(ranks), r = "replicated" + std::to_string(ranks);
    auto zr = launch(ranks, args(z, foreach + "--set memory.zero_stage=1 --set dist.check_every=1"));
    ASSERT_EQ(zr.exit_code, 0) << zr.output;
    EXPECT_THAT(zr.output, HasSubstr("optimizer state sharded (ZeRO-1) over " + std::to_string(ranks) + " ranks"));
    ASSERT_RAN(launch(ranks, args(r, foreach)));
    // Against the replicated run on the same ranks: the same numbers, bit for bit.
    for (const auto& [name, t] : weights(r, 8)) EXPECT_TRUE(torch::equal(t, weights(z, 8).at(name))) << name;
    const auto a = steps(r), b = steps(z);
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (size_t s = 0; s < a.size(); ++s) {
      EXPECT_EQ(b[s]["grad_norm"], a[s]["grad_norm"]) << "step " << s;
      EXPECT_EQ(b[s]["layer_grad_norms"], a[s]["layer_grad_norms"]) << "step " << s;
      EXPECT_EQ(b[s]["loss"], a[s]["loss"]) << "step " << s;
    }
    // Against one process: the summation order of the ranks' gradients differs.
    EXPECT_LT(relative_difference(single, weights(z, 8)), 1e-6) << ranks << " ranks";
  }
  // The default kernel (fused where LibTorch has one for the CPU, else foreach).
  ASSERT_RAN(launch(2, args("zero_auto", "--set memory.zero_stage=1")));
  ASSERT_RAN(launch(2, args("replicated_auto")));
  EXPECT_LT(relative_difference(weights("replicated_auto", 8), weights("zero_auto", 8)), 1e-6);
}

TEST_F(Zero, AResumeAtAnotherWorldSizeContinuesTheRun) {
  ASSERT_RAN(launch(2, args("two", "--set memory.zero_stage=1")));
  const auto straight = weights("two", 8);
  // 2 -> 2 is the same arithmetic: bit for bit.
  copy_to_step4("two", "again");
  ASSERT_RAN(launch(2, "train --resume runs/again"));
  for (const auto& [name, t] : weights("again", 8)) EXPECT_TRUE(torch::equal(t, straight.at(name))) << name;
  // 2 -> 1 and 2 -> 3: each rank reads its new range out of the old shards.
  for (int ranks : {1, 3}) {
    const std::string run = "to" + std::to_string(ranks);
    copy_to_step4("two", run);
    auto r = launch(ranks, "train --resume runs/" + run + (ranks == 3 ? " --set batch.micro_batch=2" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("resumed from"));
    EXPECT_LT(relative_difference(straight, weights(run, 8)), 1e-6) << ranks << " ranks";
    EXPECT_TRUE(stdfs::exists(dir_.file("runs/" + run + "/checkpoints/step-0000008/optimizer-shard-00000-of-0000" +
                                        std::to_string(ranks) + ".safetensors")));
  }
}

TEST_F(Zero, AnInfOnOneRankSkipsTheStepOnEveryRank) {
  // Weights are compared across ranks after every step (dist.check_every=1).
  auto r = launch(2, args("inf", "--set memory.zero_stage=1 --set dist.check_every=1 "
                                 "--set guard.inject.nonfinite_steps=[3] --set guard.inject.rank=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = steps("inf");
  ASSERT_EQ(s.size(), 8u);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i]["skipped"].get<bool>(), i == 3) << "step " << i;
}

// ZeRO-2: the gradient is reduced piece by piece to its owners every micro-batch and the
// guard measures the shards, combining their sums of squares in float64: the same
// gradients summed in another order, so against the replicated run the weights, norms,
// loss, z-loss and noise scale agree to 1e-6 rather than bit for bit. Tiny buckets
// (dist.bucket_mb) make tensors straddle owners and buckets wait on each other; a clip
// threshold below the norm makes every step scale the shards.
TEST_F(Zero, StageTwoShardsTheGradientsAndMatchesTheReplicatedRun) {
  const std::string common =
      " --set optim.implementation=foreach --set dist.bucket_mb=0.01 --set clip.max_norm=0.5"
      " --set guard.noise_scale.every=1 --set loss.z_loss=1e-3 ";
  auto rel = [](double a, double b) { return std::abs(a - b) / std::max(std::abs(a), 1e-30); };
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string z = "z2_" + std::to_string(ranks), r = "rep_" + std::to_string(ranks);
    auto zr = launch(ranks, args(z, common + "--set memory.zero_stage=2 --set dist.check_every=1"));
    ASSERT_EQ(zr.exit_code, 0) << zr.output;
    EXPECT_THAT(zr.output, HasSubstr("gradients sharded (ZeRO-2) over " + std::to_string(ranks) + " ranks"));
    EXPECT_THAT(zr.output, HasSubstr("gradient buckets reduced to their shard owners"));
    ASSERT_RAN(launch(ranks, args(r, common)));
    EXPECT_LT(relative_difference(weights(r, 8), weights(z, 8)), 1e-6);
    const auto a = steps(r), b = steps(z);
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (size_t s = 0; s < a.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      EXPECT_LT(a[s]["clip_coef"].get<double>(), 1.0);  // the clip scaled the shards
      for (const char* key : {"grad_norm", "loss", "z_loss", "clip_coef", "noise_scale"})
        EXPECT_LT(rel(a[s][key].get<double>(), b[s][key].get<double>()), 1e-6) << key;
      const auto& la = a[s]["layer_grad_norms"];
      ASSERT_EQ(la.size(), b[s]["layer_grad_norms"].size());
      for (auto it = la.begin(); it != la.end(); ++it)
        EXPECT_LT(rel(it.value().get<double>(), b[s]["layer_grad_norms"][it.key()].get<double>()), 1e-6) << it.key();
    }
  }
}

TEST_F(Zero, StageTwoClipsWithAgcOnTheShardsAsOnWholeGradients) {
  // AGC clips weight rows; 3 ranks with tiny buckets cut rows between ranks, whose pieces
  // are combined in the statistics' collective (tests/grad/sharded_stats_test.cpp checks
  // the rows one by one; here the whole run).
  const std::string agc = " --set optim.implementation=foreach --set dist.bucket_mb=0.01 --set clip.strategy=agc ";
  auto zr = launch(3, args("agc_z2", agc + "--set memory.zero_stage=2 --set dist.check_every=1"));
  ASSERT_EQ(zr.exit_code, 0) << zr.output;
  ASSERT_RAN(launch(3, args("agc_rep", agc)));
  EXPECT_LT(relative_difference(weights("agc_rep", 8), weights("agc_z2", 8)), 1e-6);
  const auto a = steps("agc_rep"), b = steps("agc_z2");
  ASSERT_EQ(b.size(), 8u);
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_LT(a[s]["clip_coef"].get<double>(), 0.99) << "step " << s;  // AGC did clip
    EXPECT_NEAR(b[s]["clip_coef"].get<double>(), a[s]["clip_coef"].get<double>(), 1e-6) << "step " << s;
  }
}

TEST_F(Zero, SpamIsElementwiseAndRunsOnTheShards) {
  // SPAM's clipping, resets and warmup per coordinate: the shards of ZeRO-2 step exactly
  // what the whole tensors would (to the summation order of the gradients).
  const std::string spam = " --set optim.spam_threshold=50 --set optim.spam_reset_every=3 --set optim.spam_warmup=2"
                           " --set optim.spam_clip_delay=1 ";
  ASSERT_RAN(launch(2, args("spam_z2", spam + "--set memory.zero_stage=2")));
  ASSERT_RAN(launch(2, args("spam_rep", spam)));
  EXPECT_LT(relative_difference(weights("spam_rep", 8), weights("spam_z2", 8)), 1e-6);
  ASSERT_RAN(launch(2, args("plain_rep")));
  EXPECT_GT(relative_difference(weights("plain_rep", 8), weights("spam_rep", 8)), 1e-4);  // SPAM did something
}

TEST_F(Zero, StageTwoResumesAtAnotherWorldSizeAndSkipsAnInfOnOneRanksShard) {
  ASSERT_RAN(launch(2, args("two2", "--set memory.zero_stage=2")));
  const auto straight = weights("two2", 8);
  // The optimizer shards are ZeRO-1's: 2 -> 1 (one process: nothing to shard) and 2 -> 3.
  for (int ranks : {1, 3}) {
    const std::string run = "two2_to" + std::to_string(ranks);
    copy_to_step4("two2", run);
    auto r = launch(ranks, "train --resume runs/" + run + (ranks == 3 ? " --set batch.micro_batch=2" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(relative_difference(straight, weights(run, 8)), 1e-6) << ranks << " ranks";
  }
  // A ZeRO-1 checkpoint continues under ZeRO-2: the same optimizer state.
  ASSERT_RAN(launch(2, args("one_then_two", "--set memory.zero_stage=1")));
  copy_to_step4("one_then_two", "now_two");
  auto r = launch(2, "train --resume runs/now_two --set memory.zero_stage=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(relative_difference(weights("one_then_two", 8), weights("now_two", 8)), 1e-6);
  // An inf written into rank 1's shard of the summed gradient: the combined statistics
  // are non-finite on every rank, so every rank skips step 3 (replicas compared each step).
  r = launch(2, args("inf2", "--set memory.zero_stage=2 --set dist.check_every=1 "
                             "--set guard.inject.nonfinite_steps=[3] --set guard.inject.rank=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = steps("inf2");
  ASSERT_EQ(s.size(), 8u);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i]["skipped"].get<bool>(), i == 3) << "step " << i;
}

TEST_F(Zero, Bf16WeightsWithMastersResumeBitForBit) {
  const std::string bf16 = "--set amp.dtype=bf16 --set memory.weights_dtype=bf16";
  auto r = launch(1, args("bf16", bf16));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("bf16 weights with fp32 masters"));
  const auto straight = weights("bf16", 8);
  EXPECT_EQ(straight.begin()->second.scalar_type(), torch::kBFloat16);
  copy_to_step4("bf16", "bf16b");
  ASSERT_RAN(launch(1, "train --resume runs/bf16b"));
  for (const auto& [name, t] : weights("bf16b", 8)) EXPECT_TRUE(torch::equal(t, straight.at(name))) << name;
  // The masters are in the checkpoint: float32, one shard.
  const auto shard = checkpoint::load_safetensors(
      dir_.file("runs/bf16/checkpoints/step-0000008/optimizer-shard-00000-of-00001.safetensors"));
  EXPECT_EQ(shard.tensors.at("master").scalar_type(), torch::kFloat);
}

TEST_F(Zero, Bf16WeightsOnTwoRanksSumTheirGradientsInFloat32) {
  // bf16 weights with float32 masters on 2 ranks: the bf16 gradients are summed in
  // float32, the replicas stay equal (checked every step), and sharding the state changes
  // nothing: ZeRO-1 equals the whole-state run bit for bit.
  const std::string bf16 = "--set amp.dtype=bf16 --set memory.weights_dtype=bf16 --set dist.check_every=1 ";
  auto whole = launch(2, args("bf16whole", bf16));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto sharded = launch(2, args("bf16zero", bf16 + "--set memory.zero_stage=1"));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  const auto a = weights("bf16whole", 8), b = weights("bf16zero", 8);
  for (const auto& [name, t] : a) {
    EXPECT_EQ(t.scalar_type(), torch::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  }
  // One process with the same global batch: bf16 arithmetic in a different order, so
  // close but not equal.
  ASSERT_RAN(launch(1, args("bf16one", bf16)));
  EXPECT_LT(relative_difference(weights("bf16one", 8), b), 1e-2);
  const auto one = steps("bf16one"), two = steps("bf16zero");
  ASSERT_EQ(two.size(), 8u);
  for (size_t s = 0; s < one.size(); ++s)
    EXPECT_NEAR(two[s]["loss"].get<double>(), one[s]["loss"].get<double>(), 2e-2) << "step " << s;
  // Summed in bf16 instead, by choice (dist.hook bf16: half the bytes on the wire).
  auto wire = launch(2, args("bf16wire", bf16 + "--set memory.zero_stage=1 --set dist.hook=bf16"));
  ASSERT_EQ(wire.exit_code, 0) << wire.output;
  EXPECT_LT(relative_difference(b, weights("bf16wire", 8)), 1e-2);
  // ZeRO-2: float32 sums per micro-batch rounded into a bf16 shard (a bf16 gradient, as
  // .grad is without sharding): the same bf16 rounding, in another order.
  auto z2 = launch(2, args("bf16z2", bf16 + "--set memory.zero_stage=2"));
  ASSERT_EQ(z2.exit_code, 0) << z2.output;
  EXPECT_THAT(z2.output, HasSubstr("bf16 weights with fp32 masters, optimizer state and gradients sharded (ZeRO-2)"));
  const auto c = weights("bf16z2", 8);
  for (const auto& [name, t] : c) EXPECT_EQ(t.scalar_type(), torch::kBFloat16) << name;
  EXPECT_LT(relative_difference(b, c), 1e-2);
  const auto three = steps("bf16z2");
  ASSERT_EQ(three.size(), 8u);
  for (size_t s = 0; s < three.size(); ++s)
    EXPECT_NEAR(three[s]["loss"].get<double>(), two[s]["loss"].get<double>(), 2e-2) << "step " << s;
}

TEST_F(Zero, ImpossibleCombinationsExitTwoNamingTheKey) {
  struct Case {
    int ranks;
    std::string extra, key;
  };
  const std::vector<Case> cases = {
      {1, "--set memory.weights_dtype=bf16", "memory.weights_dtype"},  // amp.dtype still fp32
      {2, "--set memory.weights_dtype=bf16 --set amp.dtype=bf16 --set dist.hook=powersgd", "dist.hook"},
      {1, "--set memory.zero_stage=1 --set optim.name=lamb", "optim.name"},
      {1, "--set memory.zero_stage=3", "memory.zero_stage"},
      {2, "--set memory.zero_stage=2 --set dist.hook=fp16", "dist.hook"},
      {2, "--set memory.zero_stage=2 --set optim.update_clipping=true", "optim.update_clipping"},
      {2, "--set memory.zero_stage=1 --set optim.update_clipping=true", "optim.update_clipping"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = launch(cases[i].ranks, args("bad" + std::to_string(i), cases[i].extra));
    EXPECT_EQ(r.exit_code, 2) << cases[i].extra << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(cases[i].key)) << cases[i].extra;
  }
}

TEST_F(Zero, AResumeWithOtherMemorySettingsIsRefusedAndNothingChanges) {
  ASSERT_RAN(launch(1, args("plain")));
  copy_to_step4("plain", "switch");
  const auto before = test::read_text(dir_.file("runs/switch/metrics.jsonl"));
  auto r = launch(1, "train --resume runs/switch --set memory.zero_stage=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("memory settings"));
  EXPECT_EQ(test::read_text(dir_.file("runs/switch/metrics.jsonl")), before);
  // And the reverse: a sharded checkpoint resumed with the state kept whole.
  ASSERT_RAN(launch(1, args("sharded", "--set memory.offload_optimizer=true")));
  copy_to_step4("sharded", "back");
  r = launch(1, "train --resume runs/back --set memory.offload_optimizer=false");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("optimizer_shards.json"));
}

TEST_F(Zero, RanksRollBackToTheShardsAndTheSnapshotReplays) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("memory.zero_stage " + std::to_string(stage));
    const std::string run = "rb" + std::to_string(stage);
    // A spike in rank 1's batch at step 25; the only rung is a rollback to step 20, whose
    // shards every rank reloads. The replicas are compared after every step.
    auto r = launch(2, args(run, "--set memory.zero_stage=" + std::to_string(stage) +
                                     " --set schedule.total_steps=32 --set checkpoint.every=10"
                                     " --set schedule.warmup_steps=5 --set guard.recovery.ladder=[rollback]"
                                     " --set guard.inject.spike_steps=[25] --set guard.inject.rank=1"
                                     " --set dist.check_every=1"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string snapshot;
    int rollbacks = 0;
    for (auto& l : test::read_jsonl(dir_.file("runs/" + run + "/metrics.jsonl"))) {
      if (l.value("event", "") == "rollback") {
        ++rollbacks;
        EXPECT_EQ(l["to_step"], 20);
      }
      if (l.value("event", "") == "recovery" && l["snapshot"].is_string()) snapshot = l["snapshot"].get<std::string>();
    }
    EXPECT_EQ(rollbacks, 1);
    ASSERT_FALSE(snapshot.empty());
    auto replay = test::run_cli("replay '" + snapshot + "' --top 0", dir_.path());
    ASSERT_EQ(replay.exit_code, 0) << replay.output;
    EXPECT_THAT(replay.output, HasSubstr("REPRODUCED"));
    EXPECT_THAT(replay.output, ::testing::Not(HasSubstr("NOT REPRODUCED")));
  }
}

TEST_F(Zero, TheEmbeddingDecaySettingMustMatchTheCheckpoint) {
  // Runs made before optim.decay_embeddings existed decayed the token embedding: their
  // config.yaml lacks the key, so a resume reads the new default (false). Both the
  // replicated optimizer state and the sharded one refuse naming the key, nothing changed.
  for (const std::string memory : {"", "--set memory.offload_optimizer=true"}) {
    SCOPED_TRACE(memory.empty() ? "replicated" : "sharded");
    const std::string run = memory.empty() ? "old_rep" : "old_sh";
    ASSERT_RAN(launch(1, args(run, memory + " --set optim.decay_embeddings=true")));
    copy_to_step4(run, run + "_b");
    const std::string config = dir_.file("runs/" + run + "_b/config.yaml");
    std::string yaml = test::read_text(config);
    const auto at = yaml.find("decay_embeddings: true");
    ASSERT_NE(at, std::string::npos) << yaml;
    const auto begin = yaml.rfind('\n', at) + 1, end = yaml.find('\n', at) + 1;  // the whole line
    yaml.erase(begin, end - begin);
    ASSERT_EQ(yaml.find("decay_embeddings:"), std::string::npos);
    test::write_text(config, yaml);
    const auto before = test::read_text(dir_.file("runs/" + run + "_b/metrics.jsonl"));
    auto r = launch(1, "train --resume runs/" + run + "_b");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("optim.decay_embeddings"));
    EXPECT_EQ(test::read_text(dir_.file("runs/" + run + "_b/metrics.jsonl")), before);
    // Said as the message asks, it continues.
    r = launch(1, "train --resume runs/" + run + "_b --set optim.decay_embeddings=true");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

TEST_F(Zero, ACorruptShardIsCaughtByTheManifestAndTheResumeFallsBack) {
  ASSERT_EQ(launch(1, args("corrupt", "--set memory.offload_optimizer=true --set schedule.total_steps=12")).exit_code,
            0);
  // Flip one byte of the newest checkpoint's shard: its checksum no longer matches.
  const std::string shard = dir_.file("runs/corrupt/checkpoints/step-0000012/optimizer-shard-00000-of-00001.safetensors");
  std::string bytes = test::read_text(shard);
  bytes[bytes.size() - 3] ^= 0x40;
  test::write_text(shard, bytes);
  auto r = launch(1, "train --resume runs/corrupt --set schedule.total_steps=14");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checksum does not match"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/corrupt/checkpoints/step-0000008"));
  // A layout file the manifest does not list is not trusted either.
  const std::string plain_dir = dir_.file("runs/corrupt/checkpoints/step-0000004");
  stdfs::copy_file(plain_dir + "/optimizer_shards.json", dir_.file("runs/corrupt/checkpoints/copy.json"));
  ASSERT_RAN(launch(1, args("unsharded")));
  stdfs::copy_file(dir_.file("runs/corrupt/checkpoints/copy.json"),
                   dir_.file("runs/unsharded/checkpoints/step-0000008/optimizer_shards.json"));
  r = launch(1, "train --resume runs/unsharded --set schedule.total_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("is not listed in the manifest"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/unsharded/checkpoints/step-0000004"));
}

}  // namespace
}  // namespace gradguard
