// Hostile and broken inputs, end to end (docs/robustness.md): the `gradguard` executable
// as a separate process on files nested a million levels deep, state files with wrong
// but well-formed values, a disk that fills up, two processes on one run directory,
// SIGTERM/SIGINT preemption, nonsense numbers, interrupted dataset preparation, and
// malformed report input. Every case must end in a documented exit code (never a
// signal) with the file or key named, and good checkpoints must stay byte-identical.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/crc32c.h"
#include "test_util.h"

namespace gradguard {
namespace {
namespace stdfs = std::filesystem;
using ::testing::HasSubstr;
using test::run_cli;

const std::string kDeep = std::string(1000000, '[') + std::string(1000000, ']');

// A gradguard process started in the background (its output into `log`).
struct Proc {
  pid_t pid = -1;
  std::string log;
  Proc(const std::string& args, const std::string& cwd, std::string log_path) : log(std::move(log_path)) {
    const std::string cmd = "cd '" + cwd + "' && exec '" GRADGUARD_CLI_PATH "' " + args + " >'" + log + "' 2>&1";
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  int wait_status() {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
    return status;
  }
  ~Proc() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      wait_status();
    }
  }
};

// Waits (up to 60 s) until `done()`.
template <class F>
bool wait_for(F done) {
  for (int i = 0; i < 600; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

int step_lines(const std::string& metrics) {
  std::ifstream in(metrics);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"loss\"") != std::string::npos && line.find("\"event\"") == std::string::npos) ++n;
  return n;
}

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ostringstream text;
    for (int i = 0; i < 600; ++i) text << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string train_args(const std::string& extra = "") const {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin --set log.progress=lines "
           "--set telemetry.enabled=false " +
           extra;
  }
  std::string path(const std::string& rel) const { return dir_.file(rel); }
  // Replaces a file of a checkpoint and makes its manifest agree, so that the content
  // itself is what is tested (not the checksum).
  void rewrite_in_checkpoint(const std::string& ckpt, const std::string& name, const std::string& text) {
    test::write_text(ckpt + "/" + name, text);
    auto manifest = nlohmann::json::parse(test::read_text(ckpt + "/manifest.json"));
    uint64_t size = 0;
    const uint32_t crc = crc32c_file(ckpt + "/" + name, &size);
    manifest["files"][name] = {{"size", size}, {"crc32c", crc}};
    test::write_text(ckpt + "/manifest.json", manifest.dump(1));
  }
  test::TempDir dir_;
};

// ---- 1. crashes on input files ---------------------------------------------------------

TEST_F(Hostile, DeepJsonInAnHfConfigIsBadInput) {
  ASSERT_EQ(run_cli(train_args("--name src"), dir_.path()).exit_code, 0);
  ASSERT_EQ(run_cli("export runs/src --out hf", dir_.path()).exit_code, 0);
  for (const std::string& config : {kDeep, "{\"hidden_size\": " + kDeep + "}"}) {
    test::write_text(path("hf/config.json"), config);
    auto r = run_cli(train_args("--name deep --set run.overwrite=true --set model.init_from=hf"), dir_.path());
    EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 2000);
    EXPECT_THAT(r.output, HasSubstr("hf/config.json"));
    EXPECT_THAT(r.output, HasSubstr("nested more than 64 levels"));
    EXPECT_LT(r.output.size(), 4000u) << "the message quotes a bounded excerpt";
  }
}

TEST_F(Hostile, ABigConfigBesideSmallWeightsIsRefusedBeforeAllocating) {
  // A 70B config.json (Llama-3-70B's shape) next to the tiny model's weights used to
  // allocate the 70B model (280 GB in fp32) before the first tensor was compared. The
  // weights' headers are now checked against config.json first, by train and by export.
  ASSERT_EQ(run_cli(train_args("--name src"), dir_.path()).exit_code, 0);
  ASSERT_EQ(run_cli("export runs/src --out hf", dir_.path()).exit_code, 0);
  auto cfg = nlohmann::json::parse(test::read_text(path("hf/config.json")));
  const auto small = cfg;
  cfg["hidden_size"] = 8192, cfg["intermediate_size"] = 28672, cfg["num_hidden_layers"] = 80;
  cfg["num_attention_heads"] = 64, cfg["num_key_value_heads"] = 8, cfg["vocab_size"] = 128256;
  cfg["max_position_embeddings"] = 8192;
  test::write_text(path("hf/config.json"), cfg.dump());
  auto r = run_cli(train_args("--name big --set model.init_from=hf"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("hf/model.safetensors: holds model.embed_tokens.weight of shape [256, 32], "
                                  "config.json's vocab_size x hidden_size is [128256, 8192]"));
  r = run_cli("export hf --out again", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the weights belong to another model"));
  // Only the layer count differs: named too.
  cfg = small;
  cfg["num_hidden_layers"] = 40;
  test::write_text(path("hf/config.json"), cfg.dump());
  r = run_cli(train_args("--name deeper --set model.init_from=hf"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("holds 2 decoder layers, config.json's num_hidden_layers is 40"));
}

TEST_F(Hostile, AModelLargerThanTheMachineIsRefusedBeforeAllocating) {
  // Llama-3-70B's shape in the configuration itself (no weights to compare it with): its
  // weights, gradients and AdamW state in fp32 are about 1.1 TB. The trainer refuses it
  // with what it needs and what the machine has (train/memory_estimate.h) before the
  // first tensor, and writes nothing.
  auto r = run_cli(train_args("--name huge --set model.hidden_size=8192 --set model.intermediate_size=28672 "
                              "--set model.num_layers=80 --set model.num_heads=64 --set model.num_kv_heads=8"),
                   dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model: a model of "));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("needs [0-9.]+ GiB for its weights, gradients and optimizer state, "
                                                 "and this machine has [0-9.]+ GiB available"));
  EXPECT_THAT(r.output, HasSubstr("nothing was allocated"));
  EXPECT_FALSE(std::filesystem::exists(path("runs/huge")));
}

TEST_F(Hostile, ImpossibleOptimizerStateOrWeightsFallBackToAnOlderCheckpoint) {
  // A negative second moment in a ZeRO shard, or a NaN weight, with the manifest rewritten
  // to match, used to load and train on. Both are refused like a corrupt checkpoint and
  // resume falls back to the one before.
  ASSERT_EQ(run_cli(train_args("--set memory.zero_stage=1 --set checkpoint.every=2 --set checkpoint.keep_last=0"),
                    dir_.path())
                .exit_code,
            0);
  const std::string shard = "optimizer-shard-00000-of-00001.safetensors";
  auto corrupt = [&](const std::string& ckpt, const std::string& file, const std::string& tensor, double value) {
    auto c = checkpoint::load_safetensors(ckpt + "/" + file);
    c.tensors.at(tensor).view({-1})[3] = value;
    checkpoint::NamedTensors t(c.tensors.begin(), c.tensors.end());
    checkpoint::save_safetensors(path("tmp.safetensors"), t, c.metadata);
    rewrite_in_checkpoint(ckpt, file, test::read_text(path("tmp.safetensors")));
  };
  corrupt(path("runs/tiny/checkpoints/step-0000006"), shard, "exp_avg_sq", -1.0);
  auto r = run_cli("train --resume runs/tiny --set schedule.total_steps=7", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(shard + ": exp_avg_sq of 'model.embed_tokens.weight' holds non-finite or negative"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000004"));
  // The run went on from step 4 to its new end, step 7; now a NaN weight there.
  corrupt(path("runs/tiny/checkpoints/step-0000007"), "model.safetensors", "model.norm.weight", std::nan(""));
  r = run_cli("train --resume runs/tiny --set schedule.total_steps=8", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model.safetensors: tensor 'model.norm.weight' holds non-finite values"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000006"));
}

TEST_F(Hostile, DeepJsonInTrainerStateFallsBackToAnOlderCheckpoint) {
  ASSERT_EQ(run_cli(train_args("--set checkpoint.every=2 --set checkpoint.keep_last=0"), dir_.path()).exit_code, 0);
  const std::string good = path("runs/tiny/checkpoints/step-0000004/model.safetensors");
  const std::string before = test::read_text(good);
  rewrite_in_checkpoint(path("runs/tiny/checkpoints/step-0000006"), "trainer_state.json", kDeep);
  auto r = run_cli("train --resume runs/tiny --set schedule.total_steps=8", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 3000);
  EXPECT_THAT(r.output, HasSubstr("skipped checkpoint"));
  EXPECT_THAT(r.output, HasSubstr("step-0000006/trainer_state.json"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000004"));
  EXPECT_EQ(test::read_text(good), before);
}

TEST_F(Hostile, DeepAndMistypedMetricsLinesDoNotStopReport) {
  ASSERT_EQ(run_cli(train_args(), dir_.path()).exit_code, 0);
  std::ofstream(path("runs/tiny/metrics.jsonl"), std::ios::app)
      << kDeep << "\n"
      << "{\"step\":7,\"loss\":" << kDeep << "}\n"
      << "{\"step\":8,\"event\":\"anomaly\",\"kind\":5,\"severity\":[1],\"message\":{}}\n"
      << "{\"step\":9,\"event\":\"recovery\",\"anomaly\":null,\"action\":7}\n"
      << "{\"step\":null,\"loss\":1}\n{\"step\":10,\"loss\":\"high\",\"skipped\":\"no\"}\n";
  auto r = run_cli("report runs/tiny --csv --tensorboard", dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 3000);
  EXPECT_THAT(r.output, HasSubstr("left out"));
  EXPECT_THAT(r.output, HasSubstr("metrics.jsonl:"));
  EXPECT_TRUE(stdfs::exists(path("runs/tiny/report.html")));
  EXPECT_TRUE(stdfs::exists(path("runs/tiny/steps.csv")));
}

TEST_F(Hostile, ReplayRefusesEmptyAndOutOfVocabularyBatches) {
  ASSERT_EQ(run_cli(train_args("--set guard.inject.nonfinite_steps=[2]"), dir_.path()).exit_code, 0);
  const std::string snap = path("runs/tiny/snapshots/step-0000002-nonfinite");
  ASSERT_TRUE(stdfs::exists(snap + "/batch.safetensors"));
  const auto batch = checkpoint::load_safetensors(snap + "/batch.safetensors").tensors;
  const auto inputs = batch.at("inputs"), targets = batch.at("targets"), index = batch.at("sample_index");
  struct Case {
    checkpoint::NamedTensors tensors;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{{"inputs", inputs.narrow(0, 0, 0)}, {"targets", targets.narrow(0, 0, 0)}, {"sample_index", index.narrow(0, 0, 0)}},
       "holds no tokens"},
      {{{"inputs", inputs + 1000}, {"targets", targets}, {"sample_index", index}}, "outside the vocabulary"},
      {{{"inputs", inputs}, {"targets", targets * 0 - 1}, {"sample_index", index}}, "outside the vocabulary"},
  };
  for (const auto& c : cases) {
    checkpoint::save_safetensors(snap + "/batch.safetensors", c.tensors);
    auto r = run_cli("replay " + snap, dir_.path());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("batch.safetensors"));
    EXPECT_THAT(r.output, HasSubstr(c.expected));
  }
}

// A disk that fills up: the file-size limit makes every write past it fail with EFBIG,
// as a full disk fails with ENOSPC, for every library that writes (SIGXFSZ ignored).
// The tiny model's weights fit under the limit, its optimizer state does not.
TEST_F(Hostile, AFullDiskWhileWritingTheOptimizerState) {
  auto limited = [&](const std::string& args) {
    // dash counts ulimit -f in 512-byte blocks: 400 is 200 KiB per file.
    const std::string cmd = "cd '" + dir_.path() + "' && trap '' XFSZ && ulimit -f 400 && '" GRADGUARD_CLI_PATH "' " +
                            args + " 2>&1";
    test::CliResult result;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
    const int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
  };
  // Periodic checkpoints that fail are warnings; the final one is the error.
  auto r = limited(train_args("--set checkpoint.every=2 --set log.report=false"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkpoint not written"));
  EXPECT_THAT(r.output, HasSubstr("earlier checkpoints are intact"));
  EXPECT_THAT(test::read_text(path("runs/tiny/metrics.jsonl")), HasSubstr("checkpoint_not_written"));
  for (const auto& e : stdfs::directory_iterator(path("runs/tiny/checkpoints")))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

// ---- 2. two processes on one run directory ---------------------------------------------

TEST_F(Hostile, ASecondProcessOnARunIsRefusedAndADeadOneLeavesNoLock) {
  Proc first(train_args("--set schedule.total_steps=3000 --set checkpoint.every=5 --set eval.every=0"), dir_.path(),
             path("first.log"));
  ASSERT_TRUE(wait_for([&] { return step_lines(path("runs/tiny/metrics.jsonl")) >= 10; })) << test::read_text(first.log);
  const std::string metrics_before = test::read_text(path("runs/tiny/metrics.jsonl"));
  for (const std::string& args : {std::string("train --resume runs/tiny"), train_args()}) {
    auto r = run_cli(args, dir_.path());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("is in use by another gradguard process (pid " + std::to_string(first.pid)));
  }
  // The refused processes changed nothing: the first run's metrics only grew.
  EXPECT_EQ(test::read_text(path("runs/tiny/metrics.jsonl")).rfind(metrics_before, 0), 0u);
  ::kill(first.pid, SIGKILL);
  first.wait_status();
  auto r = run_cli("train --resume runs/tiny --set schedule.total_steps=20", dir_.path());
  EXPECT_NE(r.exit_code, -1) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("in use"))) << "a SIGKILLed run leaves no stale lock";
}

// ---- 3. state files with wrong but well-formed values ----------------------------------

TEST_F(Hostile, WrongStateValuesSkipTheCheckpointLikeACorruptOne) {
  ASSERT_EQ(run_cli(train_args("--set checkpoint.every=2 --set checkpoint.keep_last=0"), dir_.path()).exit_code, 0);
  const std::string last = path("runs/tiny/checkpoints/step-0000006");
  const std::string original = test::read_text(last + "/trainer_state.json");
  const std::string good = path("runs/tiny/checkpoints/step-0000004/model.safetensors");
  const std::string good_bytes = test::read_text(good);
  struct Case {
    std::function<void(nlohmann::json&)> change;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& s) { s["step"] = -6; }, "'step'"},
      {[](nlohmann::json& s) { s["data_offset"] = -1; }, "'data_offset'"},
      {[](nlohmann::json& s) { s["rng"] = s["rng"].get<std::string>().substr(0, 64); }, "'rng'"},
      {[](nlohmann::json& s) { s["guard"]["detector"]["layer_count"] = nullptr; }, "guard.detector.layer_count"},
      {[](nlohmann::json& s) { s["guard"]["recovery"]["skips"] = "many"; }, "guard.recovery.skips"},
      {[](nlohmann::json& s) { s["clipper"]["history"] = {1.0, "x"}; }, "clipper.history"},
      {[](nlohmann::json& s) { s["scaler"]["scale"] = -1; }, "scale"},
  };
  for (const auto& c : cases) {
    auto state = nlohmann::json::parse(original);
    c.change(state);
    rewrite_in_checkpoint(last, "trainer_state.json", state.dump());
    std::filesystem::remove_all(path("runs/tiny/checkpoints/step-0000008"));
    auto r = run_cli("train --resume runs/tiny --set schedule.total_steps=8", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << c.field << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("skipped checkpoint")) << c.field;
    EXPECT_THAT(r.output, HasSubstr(c.field)) << r.output;
    EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000004")) << c.field;
    EXPECT_EQ(test::read_text(good), good_bytes) << c.field;
    rewrite_in_checkpoint(last, "trainer_state.json", original);
  }
  // A manifest entry of the wrong type, a symlink loop among the checkpoints and a null
  // step in metrics.jsonl: reported or dropped, never an exception.
  auto manifest = nlohmann::json::parse(test::read_text(last + "/manifest.json"));
  manifest["files"]["optimizer.pt"] = 5;
  test::write_text(last + "/manifest.json", manifest.dump());
  stdfs::create_directory_symlink("step-loop", path("runs/tiny/checkpoints/step-loop"));
  std::ofstream(path("runs/tiny/metrics.jsonl"), std::ios::app) << "{\"step\":null,\"loss\":1}\n";
  std::filesystem::remove_all(path("runs/tiny/checkpoints/step-0000008"));
  auto r = run_cli("train --resume runs/tiny --set schedule.total_steps=8", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("files.optimizer.pt"));
  EXPECT_THAT(r.output, HasSubstr("resumed from runs/tiny/checkpoints/step-0000004"));
  EXPECT_EQ(test::read_text(good), good_bytes);
}

// ---- 4. values that parse but make no sense --------------------------------------------

TEST_F(Hostile, NonFiniteAndNonsenseNumbersAreRefused) {
  for (const std::string& set : {"optim.eps=inf", "optim.eps=.inf", "model.rope_theta=inf", "optim.lr=1e400",
                                 "clip.max_norm=nan", "optim.eps=0.5", "model.rope_theta=1e300"}) {
    auto r = run_cli(train_args("--set " + set), dir_.path());
    EXPECT_EQ(r.exit_code, 2) << set << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(set.substr(0, set.find('=')))) << set;
  }
  // A config.json whose rope_theta is null (JSON's inf) is not taken for the default.
  ASSERT_EQ(run_cli(train_args("--name src"), dir_.path()).exit_code, 0);
  ASSERT_EQ(run_cli("export runs/src --out hf", dir_.path()).exit_code, 0);
  auto cfg = nlohmann::json::parse(test::read_text(path("hf/config.json")));
  cfg["rope_theta"] = nullptr;
  test::write_text(path("hf/config.json"), cfg.dump());
  auto r = run_cli(train_args("--name null --set model.init_from=hf"), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rope_theta"));
}

// ---- 5. interrupted prepare -------------------------------------------------------------

TEST_F(Hostile, MismatchedTrainAndValFilesAreRefused) {
  test::write_text(path("other.txt"), std::string(20000, 'z') + "\n" + std::string(20000, 'y') + "\n");
  ASSERT_EQ(run_cli("prepare other.txt --out data2", dir_.path()).exit_code, 0);
  // What a prepare killed between its two writes over `data` leaves behind.
  stdfs::copy_file(path("data2/train.bin"), path("data/train.bin"), stdfs::copy_options::overwrite_existing);
  auto r = run_cli(train_args(), dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("data/val.bin"));
  EXPECT_THAT(r.output, HasSubstr("prepared apart from data/train.bin"));
  test::write_text(path("blank.txt"), "\n\n   \n\t\n");
  r = run_cli("prepare blank.txt --out data3", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("blank.txt"));
  EXPECT_FALSE(stdfs::exists(path("data3/train.bin")));
}

// ---- 6. preemption ----------------------------------------------------------------------

TEST_F(Hostile, SigtermCheckpointsStopsAndResumesBitExactly) {
  const std::string run = train_args("--set schedule.total_steps=300 --set checkpoint.every=100 --set eval.every=0");
  ASSERT_EQ(run_cli(run + " --name reference", dir_.path()).exit_code, 0);
  Proc victim(run + " --name victim", dir_.path(), path("victim.log"));
  ASSERT_TRUE(wait_for([&] { return step_lines(path("runs/victim/metrics.jsonl")) >= 20; }));
  ::kill(victim.pid, SIGTERM);
  const int status = victim.wait_status();
  const std::string log = test::read_text(path("victim.log"));
  ASSERT_TRUE(WIFEXITED(status)) << log;
  ASSERT_EQ(WEXITSTATUS(status), 4) << log;
  EXPECT_THAT(log, HasSubstr("stopped by SIGTERM"));
  const auto lines = test::read_jsonl(path("runs/victim/metrics.jsonl"));
  const auto preempted = std::find_if(lines.begin(), lines.end(),
                                      [](const auto& l) { return l.value("event", "") == "preempted"; });
  ASSERT_NE(preempted, lines.end());
  EXPECT_TRUE(stdfs::exists((*preempted)["checkpoint"].get<std::string>() + "/model.safetensors") ||
              stdfs::exists(path((*preempted)["checkpoint"].get<std::string>() + "/model.safetensors")));
  EXPECT_TRUE(stdfs::exists(path("runs/victim/report.html")));
  auto r = run_cli("train --resume runs/victim", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_text(path("runs/victim/checkpoints/step-0000300/model.safetensors")),
            test::read_text(path("runs/reference/checkpoints/step-0000300/model.safetensors")));
}

TEST_F(Hostile, ASecondSignalStopsAtOnce) {
  // Steps of ~1 s (400 micro-batches each), so the second signal arrives while the
  // first one is still waiting for its step to finish.
  Proc victim(train_args("--set schedule.total_steps=3000 --set eval.every=0 --set batch.accum_steps=400"),
              dir_.path(), path("v.log"));
  ASSERT_TRUE(wait_for([&] { return step_lines(path("runs/tiny/metrics.jsonl")) >= 2; }));
  ::kill(victim.pid, SIGINT);
  // Two signals sent back to back can reach the process as one (a pending standard
  // signal is not queued twice): give the first time to be delivered.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(victim.pid, SIGINT);
  const int status = victim.wait_status();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << test::read_text(path("v.log"));
  // Stopped inside the step: no checkpoint of a half-done step, no "preempted" line.
  for (const auto& line : test::read_jsonl(path("runs/tiny/metrics.jsonl")))
    EXPECT_NE(line.value("event", ""), "preempted");
}

TEST_F(Hostile, LaunchedRanksStopTogether) {
  Proc launcher("launch --nproc 2 -- " + train_args("--set schedule.total_steps=3000 --set eval.every=0"),
                dir_.path(), path("launch.log"));
  ASSERT_TRUE(wait_for([&] { return step_lines(path("runs/tiny/metrics.jsonl")) >= 5; }))
      << test::read_text(path("launch.log"));
  ::kill(launcher.pid, SIGTERM);
  const int status = launcher.wait_status();
  const std::string log = test::read_text(path("launch.log"));
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 4) << log;
  const auto lines = test::read_jsonl(path("runs/tiny/metrics.jsonl"));
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const auto& l) { return l.value("event", "") == "preempted"; }))
      << log;
  // Both ranks verified equal weights when they resumed together.
  auto r = run_cli("launch --nproc 2 -- train --resume runs/tiny --set schedule.total_steps=" +
                       std::to_string(step_lines(path("runs/tiny/metrics.jsonl")) + 2),
                   dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// ---- 7. report input and config files that never end -------------------------------------

TEST_F(Hostile, ConfigFromADeviceOrHugeFileIsRefused) {
  auto r = run_cli("config show --config /dev/zero", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/dev/zero"));
  EXPECT_THAT(r.output, HasSubstr("not a regular file"));
  {
    std::ofstream big(path("big.yaml"));
    big << "run:\n  name: \"" << std::string(20 << 20, 'x') << "\"\n";
  }
  r = run_cli("config show --config big.yaml", dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 500);
  EXPECT_THAT(r.output, HasSubstr("more than the limit"));
}

}  // namespace
}  // namespace gradguard
