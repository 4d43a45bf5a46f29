// End-to-end: the `gradguard` executable on small prepared data. Checks the run
// directory contract of docs/design.md (config.yaml, metrics.jsonl fields, checkpoints that
// load back), `init_from`, `config show`, and that every bad-input path exits with code 2
// and a message naming the file or key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/data/token_file.h"
#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;
using test::run_cli;

// A temp dir with prepared byte-level data from a generated text.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ostringstream text;
    for (int i = 0; i < 400; ++i) text << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string train_args(const std::string& extra = "") const {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin " + extra;
  }
  std::vector<nlohmann::json> metrics(const std::string& run) const {
    return test::read_jsonl(dir_.file("runs/" + run + "/metrics.jsonl"));
  }
  test::TempDir dir_;
};

TEST_F(Cli, TrainWritesTheRunDirectory) {
  auto r = run_cli(train_args(), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("summary: 6 steps"));
  EXPECT_THAT(r.output, HasSubstr("val_loss"));
  const std::string run = dir_.file("runs/tiny");
  EXPECT_TRUE(std::filesystem::exists(run + "/config.yaml"));
  EXPECT_THAT(test::read_text(run + "/config.yaml"), HasSubstr("train_path: \"data/train.bin\""));

  int steps = 0, vals = 0;
  for (const auto& m : metrics("tiny")) {
    if (m.contains("val_loss")) {
      ++vals;
      continue;
    }
    if (m.contains("event")) continue;  // telemetry and other events
    for (const char* key : {"step", "loss", "lr", "grad_norm", "clip_coef", "loss_scale", "skipped", "tokens",
                            "tokens_per_s"})
      EXPECT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
    EXPECT_EQ(m["step"], steps);
    EXPECT_EQ(m["tokens"], 4 * 2 * 16);
    EXPECT_FALSE(m["skipped"].get<bool>());
    ++steps;
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(vals, 3);  // before training, after step 3, at the end
  // The run ends with its report (log.report), named in the summary.
  EXPECT_TRUE(std::filesystem::exists(run + "/report.html"));
  EXPECT_THAT(r.output, HasSubstr("report      runs/tiny/report.html"));
  // log.tensorboard: a live event file beside metrics.jsonl, read back by the
  // independent reader (CRC-checked) with every step's loss.
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(run))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path().string();
  ASSERT_FALSE(events.empty());
  std::FILE* pipe = ::popen(("/usr/bin/python3 '" + test::source_path("tests/telemetry/read_tfevents.py") + "' '" +
                             events + "'").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) text += buf;
  ASSERT_EQ(::pclose(pipe), 0) << text;
  int loss_points = 0, val_points = 0;
  const auto scalars = nlohmann::json::parse(text)["scalars"];
  for (const auto& sc : scalars) {
    loss_points += sc["tag"] == "train/loss";
    val_points += sc["tag"] == "val/loss";
  }
  EXPECT_EQ(loss_points, 6);
  EXPECT_EQ(val_points, 3);
  auto lines = metrics("tiny");
  EXPECT_NEAR(lines[1]["lr"].get<double>(), 3e-3 / 2, 1e-12);  // warmup step 0: lr * 1/W

  // keep_last 2: step-4 and the final step-6 remain; both load as HF checkpoints.
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints/step-0000002"));
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step-0000004/model.safetensors"));
  EXPECT_EQ(test::read_text(run + "/checkpoints/latest"), "step-0000006\n");
  auto opts = checkpoint::read_hf_config(run + "/checkpoints/step-0000006", {});
  EXPECT_EQ(opts.hidden_size, 32);
  model::LlamaForCausalLM m(opts);
  EXPECT_NO_THROW(checkpoint::load_hf_weights(run + "/checkpoints/step-0000006", *m));
}

TEST_F(Cli, JsonModePrintsOnlyJsonLines) {
  auto r = run_cli(train_args("--json --set log.report=false"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  int steps = 0, messages = 0;
  nlohmann::json last;
  while (std::getline(lines, line)) {
    ASSERT_NO_THROW(last = nlohmann::json::parse(line)) << "not JSON: " << line;
    if (last.contains("message")) ++messages;
    if (last.contains("eta_s")) {
      EXPECT_EQ(last["step"], steps);
      for (const char* key : {"loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "anomalies", "total_steps"})
        EXPECT_TRUE(last.contains(key)) << key << " missing in " << line;
      ++steps;
    }
  }
  EXPECT_EQ(steps, 6);
  EXPECT_GE(messages, 1);  // the header line
  ASSERT_TRUE(last.contains("summary")) << last.dump();
  EXPECT_EQ(last["summary"]["steps"], 6);
  EXPECT_EQ(last["summary"]["report"], "");  // log.report=false
  EXPECT_FALSE(std::filesystem::exists(dir_.file("runs/tiny/report.html")));
}

TEST_F(Cli, QuietModePrintsOnlyTheSummary) {
  auto r = run_cli(train_args("--quiet"), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("step 1/6")));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("gradguard 0.")));  // no header
  EXPECT_THAT(r.output, HasSubstr("summary: 6 steps"));
  r = run_cli(train_args("--quiet --json"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--quiet/--json"));
  r = run_cli(train_args("--set log.progress=loud"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("log.progress"));
}

TEST_F(Cli, DynamicScalerSkipsInjectedOverflowsAndBacksOff) {
  // Steps 1 and 2 overflow: both skipped; hysteresis 2 backs off only on the second.
  auto r = run_cli(train_args("--set amp.scaler.mode=dynamic --set amp.scaler.init_scale=1024 "
                              "--set amp.scaler.hysteresis=2 --set amp.scaler.growth_interval=2 "
                              "--set guard.inject.nonfinite_steps=[1,2] --set clip.strategy=zscore "
                              "--set clip.zscore_warmup=2"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<double> scales;
  std::vector<bool> skipped;
  int skip_events = 0;
  for (const auto& m : metrics("tiny")) {
    if (m.value("event", "") == "skip") ++skip_events;
    if (!m.contains("loss_scale")) continue;
    if (m.contains("event")) continue;
    scales.push_back(m["loss_scale"]);
    skipped.push_back(m["skipped"]);
    EXPECT_TRUE(m.contains("layer_grad_norms"));
    EXPECT_TRUE(m.contains("clip_threshold"));
  }
  EXPECT_EQ(skipped, (std::vector<bool>{false, true, true, false, false, false}));
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 1024, 512, 512, 1024}));
  EXPECT_EQ(skip_events, 2);
  EXPECT_THAT(r.output, HasSubstr("2 skipped"));
}

TEST_F(Cli, StuckAtMinimumScaleHaltsWithExitThree) {
  auto r = run_cli(train_args("--set amp.scaler.mode=dynamic --set amp.scaler.init_scale=4 "
                              "--set amp.scaler.min_scale=1 --set amp.scaler.min_scale_patience=2 "
                              "--set guard.inject.nonfinite_steps=[0,1,2,3,4,5] "
                              "--set guard.recovery.ladder=[skip] --set guard.recovery.skip_budget=1"),
                   dir_.path());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("overflow even at the minimum loss scale"));
  EXPECT_THAT(r.output, HasSubstr("recovery ladder is spent"));
  EXPECT_THAT(test::read_text(dir_.file("runs/tiny/metrics.jsonl")), HasSubstr("loss_scale_stuck"));
  // Without the guard the stuck scaler halts at once.
  r = run_cli(train_args("--set amp.scaler.mode=dynamic --set amp.scaler.init_scale=4 "
                         "--set amp.scaler.min_scale=1 --set amp.scaler.min_scale_patience=2 "
                         "--set guard.inject.nonfinite_steps=[0,1,2,3,4,5] --set guard.enabled=false --name off"),
              dir_.path());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("overflow even at the minimum loss scale"));
}

TEST_F(Cli, EveryOptimizerAndStrategyTrains) {
  for (const char* args : {"--set optim.name=lamb --set optim.lr=1e-2 --set clip.strategy=agc --name lamb",
                           "--set optim.name=lars --set optim.lr=1 --set clip.strategy=layerwise --name lars",
                           "--set optim.name=adam_atan2 --set optim.update_clipping=true --name atan2",
                           "--set clip.strategy=history --set schedule.decay=wsd --name hist",
                           "--set clip.strategy=adagc --set clip.adagc_warmup=2 --name adagc",
                           "--set optim.spam_threshold=5000 --set optim.spam_reset_every=3 --set optim.spam_warmup=1 "
                           "--set optim.spam_clip_delay=1 --name spam",
                           "--set optim.lr_scaling=sqrt --set optim.base_batch=2 --name scaled"}) {
    auto r = run_cli(train_args(args), dir_.path());
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  }
  // sqrt scaling: global batch 8 vs base 2 doubles the peak lr (3e-3 -> 6e-3); warmup step 0 is half of it.
  EXPECT_NEAR(metrics("scaled")[1]["lr"].get<double>(), 3e-3, 1e-12);
}

TEST_F(Cli, ResumeContinuesARun) {
  ASSERT_EQ(run_cli(train_args("--set schedule.total_steps=4 --set schedule.warmup_steps=1"), dir_.path()).exit_code, 0);
  // The same run extended to 6 steps; its config.yaml is the base, --set still applies.
  auto r = run_cli("train --resume auto --set schedule.total_steps=6", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000004"));
  EXPECT_THAT(r.output, HasSubstr("resumed at step 4"));
  int steps = 0;
  for (const auto& m : metrics("tiny"))
    if (m.contains("loss") && !m.contains("event")) EXPECT_EQ(m["step"], steps++);
  EXPECT_EQ(steps, 6);
  r = run_cli("train --resume runs/nope", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("runs/nope"));
  r = run_cli("train --resume runs/tiny --set model.num_layers=3", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("model.num_layers = 2 but the configuration asks for 3"));
}

TEST_F(Cli, EpochsAndWarmupRatioSetTheRunsLengthFromTheData) {
  // Hugging Face Trainer's arithmetic: steps = ceil(epochs x rows / global batch), warmup
  // ceil(ratio x steps); a --set epochs replaces the preset's total_steps.
  const int64_t rows = (data::TokenFile(dir_.file("data/train.bin"), 0).size() - 1) / 16;  // seq_len 16
  const auto steps = static_cast<int64_t>(std::ceil(0.1 * static_cast<double>(rows) / 8.0));
  const auto warmup = static_cast<int64_t>(std::ceil(0.25 * static_cast<double>(steps)));
  ASSERT_GT(steps, 6);  // not tiny.yaml's 6
  auto r = run_cli(train_args("--set schedule.epochs=0.1 --set schedule.warmup_ratio=0.25 --set eval.every=0"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("schedule.epochs 0.1: " + std::to_string(rows) + " rows of data/train.bin at 8 per "
                                  "step = " + std::to_string(steps) + " steps (warmup " + std::to_string(warmup) + ")"));
  EXPECT_THAT(r.output, HasSubstr("summary: " + std::to_string(steps) + " steps"));
  int64_t n = 0;
  double first_lr = -1;
  for (const auto& m : metrics("tiny"))
    if (m.contains("loss") && !m.contains("event")) {
      if (n == 0) first_lr = m["lr"].get<double>();
      ++n;
    }
  EXPECT_EQ(n, steps);
  EXPECT_NEAR(first_lr, 3e-3 / static_cast<double>(warmup), 1e-12);  // lr / W at step 0
  // The run's config.yaml keeps epochs and shows the derived keys commented out, so a
  // resume derives the same length.
  const auto yaml = test::read_text(dir_.file("runs/tiny/config.yaml"));
  EXPECT_THAT(yaml, HasSubstr("# total_steps: " + std::to_string(steps)));
  EXPECT_THAT(yaml, HasSubstr("# warmup_steps: " + std::to_string(warmup)));
  r = run_cli("train --resume auto", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("is complete (step " + std::to_string(steps) + " of " + std::to_string(steps) + ")"));
  // A warmup longer than the run the epochs make: exit 2 naming the key and the numbers.
  r = run_cli(train_args("--name long --set schedule.epochs=0.01 --set schedule.warmup_steps=50"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("schedule.warmup_steps: 50 is longer than the run: schedule.epochs 0.01 of "
                                  "data/train.bin make"));
}

TEST_F(Cli, ExportWritesALoadableHfDirectory) {
  ASSERT_EQ(run_cli(train_args(), dir_.path()).exit_code, 0);
  auto r = run_cli("export runs/tiny --out exported", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("runs/tiny/checkpoints/step-0000006 -> exported"));
  auto opts = checkpoint::read_hf_config(dir_.file("exported"), {});
  model::LlamaForCausalLM m(opts);
  EXPECT_NO_THROW(checkpoint::load_hf_weights(dir_.file("exported"), *m));
  r = run_cli("export runs/tiny --out exported", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--force"));
  test::write_text(dir_.file("runs/tiny/checkpoints/step-0000004/config.json"), "{}");
  r = run_cli("export runs/tiny/checkpoints/step-0000004 --out other", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("step-0000004/config.json"));
}

// --dtype auto writes the weights the run computed with; fp32 the optimizer's float32
// masters (here bf16 weights with master_weights, and ZeRO-style shards of one rank).
TEST_F(Cli, ExportWritesTheWorkingWeightsOrTheFloat32Masters) {
  const std::string bf16 = "--set memory.weights_dtype=bf16 --set amp.dtype=bf16";
  ASSERT_EQ(run_cli(train_args("--name masters " + bf16), dir_.path()).exit_code, 0);
  auto r = run_cli("export runs/masters --out working", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("export runs/masters --out full --dtype fp32", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("float32 master weights of"));
  const auto working = checkpoint::load_safetensors(dir_.file("working/model.safetensors")).tensors;
  const auto full = checkpoint::load_safetensors(dir_.file("full/model.safetensors")).tensors;
  const auto masters = checkpoint::load_master_weights(dir_.file("runs/masters/checkpoints/step-0000006"));
  ASSERT_FALSE(masters.empty());
  ASSERT_EQ(working.size(), full.size());
  for (const auto& [name, flat] : masters) {
    ASSERT_TRUE(full.count(name)) << name;
    EXPECT_EQ(working.at(name).scalar_type(), torch::kBFloat16) << name;
    EXPECT_EQ(full.at(name).scalar_type(), torch::kFloat) << name;
    // The masters bit for bit, and the working weights are the masters rounded.
    EXPECT_TRUE(torch::equal(full.at(name).flatten(), flat)) << name;
    EXPECT_TRUE(torch::equal(full.at(name).to(torch::kBFloat16), working.at(name))) << name;
  }
  EXPECT_THAT(test::read_text(dir_.file("full/config.json")), HasSubstr("\"torch_dtype\": \"float32\""));
  // bf16 weights without masters have no float32 weights to write: exit 2 naming --dtype.
  ASSERT_EQ(run_cli(train_args("--name bare " + bf16 + " --set memory.master_weights=false"), dir_.path()).exit_code, 0);
  r = run_cli("export runs/bare --out bare --dtype fp32", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--dtype: fp32 writes the optimizer's float32 master weights"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("bare/model.safetensors")));
  // fp32 weights are written as they are.
  ASSERT_EQ(run_cli(train_args("--name plain"), dir_.path()).exit_code, 0);
  r = run_cli("export runs/plain --out plain --dtype fp32", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("float32 weights"));
  r = run_cli("export runs/plain --out other --dtype fp16", dir_.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--dtype"));
}

TEST_F(Cli, InitFromContinuesFromACheckpoint) {
  ASSERT_EQ(run_cli(train_args(), dir_.path()).exit_code, 0);
  auto r = run_cli(train_args("--name second --set model.init_from=runs/tiny/checkpoints/step-0000006 "
                              "--set model.hidden_size=64"),
                   dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The checkpoint's architecture wins over the config's, and the effective config says so.
  EXPECT_THAT(test::read_text(dir_.file("runs/second/config.yaml")), HasSubstr("hidden_size: 32"));
  // A trained model starts far below ln(256) = 5.55.
  EXPECT_LT(metrics("second")[0]["val_loss"].get<double>(), metrics("tiny")[0]["val_loss"].get<double>() - 0.3);
}

TEST_F(Cli, InitFromRefusesDataOfAnotherTokenizer) {
  ASSERT_EQ(run_cli(train_args(), dir_.path()).exit_code, 0);
  // The checkpoint gets a tokenizer (printable ASCII, one id per character, 95 < the
  // model's 256): the byte-level data is no longer the model's.
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 32;
  const nlohmann::json tokenizer = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  const std::string ckpt = "runs/tiny/checkpoints/step-0000006";
  test::write_text(dir_.file(ckpt + "/tokenizer.json"), tokenizer.dump());
  auto r = run_cli(train_args("--name second --set model.init_from=" + ckpt), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("data/train.bin: was not made with the model's tokenizer (it has no tokenizer "
                                  "recorded"));
  EXPECT_THAT(r.output, HasSubstr("gradguard prepare --tokenizer " + ckpt));
  // Prepared with that tokenizer, the same text trains.
  r = run_cli("prepare corpus.txt --out data2 --val-fraction 0.2 --tokenizer " + ckpt, dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tokenizer fnv1a64:"));
  r = run_cli("train --config '" + test::source_path("configs/tiny.yaml") +
                  "' --set data.train_path=data2/train.bin --set data.val_path=data2/val.bin --name third "
                  "--set model.init_from=" + ckpt,
              dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Cli, RefusesToOverwriteARun) {
  ASSERT_EQ(run_cli(train_args(), dir_.path()).exit_code, 0);
  const std::string before = test::read_text(dir_.file("runs/tiny/metrics.jsonl"));
  auto r = run_cli(train_args(), dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("run.name: run directory 'runs/tiny' already holds a run"));
  EXPECT_EQ(test::read_text(dir_.file("runs/tiny/metrics.jsonl")), before);  // nothing lost
  EXPECT_EQ(run_cli(train_args("--set run.overwrite=true"), dir_.path()).exit_code, 0);
}

TEST_F(Cli, BadConfigExitsTwoNamingTheKey) {
  struct Case {
    std::string args, needle;
  };
  std::vector<Case> cases = {
      {"--set optim.lrr=1", "did you mean 'optim.lr'"},
      {"--set optim.lr=-1", "optim.lr: must be a finite number > 0"},
      {"--set schedule.warmup_steps=100", "schedule.warmup_steps"},
      {"--set batch.micro_batch=0", "batch.micro_batch: must be >= 1, got 0"},
      {"--set batch.micro_batch=abc", "expected integer, got 'abc'"},
      {"--set amp.dtype=fp16", "amp.dtype: fp16 autocast needs a GPU"},
      {"--set run.device=cuda", "run.device"},
      {"--set data.train_path=nope.bin", "nope.bin"},
      {"--set model.vocab_size=100", "outside the vocabulary"},
      {"--set model.init_from=missing_dir", "missing_dir/config.json"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(train_args(c.args), dir_.path());
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.needle)) << c.args;
  }
  auto r = run_cli("train --config missing.yaml", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("missing.yaml: cannot open"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("runs")));  // nothing created on bad input
}

TEST_F(Cli, BareOverridesWorkAsSetAndCommandsAreSpellChecked) {
  // torchtune's habit: `train optim.lr=2e-3` is `train --set optim.lr=2e-3`; --set wins.
  const std::string rest = " --config '" + test::source_path("configs/tiny.yaml") +
                           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin";
  auto first_lr = [&](const std::string& run) {
    for (const auto& j : metrics(run))
      if (j.contains("lr")) return j["lr"].get<double>();
    return -1.0;
  };
  auto r = run_cli("train optim.lr=2e-3 schedule.warmup_steps=0 schedule.min_lr=0 run.name=bare" + rest, dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(first_lr("bare"), 2e-3);  // no warmup: step 0 runs at the peak
  r = run_cli("train optim.lr=2e-3 schedule.warmup_steps=0 schedule.min_lr=0 run.name=bare2" + rest +
                  " --set optim.lr=1e-3",
              dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(first_lr("bare2"), 1e-3);
  // A bare word that is not key=value says what it would have to be.
  r = run_cli("train my.yaml" + rest, dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("train my.yaml: an argument without a dash is an override key.path=value"));
  r = run_cli("train optim.lrr=1" + rest, dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("did you mean 'optim.lr'"));
  // A misspelled command is named with its nearest one.
  r = run_cli("trian --set optim.lr=1", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("'trian' is not a gradguard command; did you mean 'train'?"));
  EXPECT_THAT(r.output, HasSubstr("commands: train, prepare"));
  // A misspelled option: its nearest name and the command's usage line.
  r = run_cli("train --confg my.yaml", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("gradguard train has no option --confg; did you mean --config?"));
  EXPECT_THAT(r.output, HasSubstr("Usage:"));
  r = run_cli("plan --gpu 2", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("gradguard plan has no option --gpu; did you mean --gpus?"));
}

TEST_F(Cli, BadDataExitsTwoNamingTheFile) {
  test::write_text(dir_.file("data/garbage.bin"), std::string(2048, 'x'));
  auto r = run_cli(train_args("--set data.train_path=data/garbage.bin"), dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("data/garbage.bin"));
  EXPECT_THAT(r.output, HasSubstr("magic"));
  data::write_token_file(dir_.file("data/short.bin"), {1, 2, 3});
  r = run_cli(train_args("--set data.train_path=data/short.bin"), dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("data/short.bin"));
}

TEST_F(Cli, ConfigShowPrintsEffectiveConfig) {
  auto r = run_cli("config show --set optim.lr=0.01 --set optim.betas=[0.9,0.95]", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lr: 0.01"));
  EXPECT_THAT(r.output, HasSubstr("betas: [0.9, 0.95]"));
  r = run_cli("config show --set clip.max=1", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("did you mean 'clip.max_norm'"));
}

TEST_F(Cli, PrepareErrorsExitTwo) {
  auto r = run_cli("prepare corpus.txt --out data", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--force"));
  r = run_cli("prepare nothing.txt --out data2", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("nothing.txt"));
  test::write_text(dir_.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"txt\": 1}\n");
  r = run_cli("prepare bad.jsonl --out data3", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("bad.jsonl:2"));
  r = run_cli("train --bogus-flag", dir_.path());
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace gradguard
