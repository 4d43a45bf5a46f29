// Data-parallel training end to end: two ranks on Gloo on this CPU, started the way
// torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by hand) or by
// `gradguard launch`. The reference for "correct" is a single process with the same
// global batch: the sum of the ranks' gradients is that batch's gradient, so the weights
// agree to float rounding (the summation order differs). Also: the compression hooks
// stay close to the uncompressed run, an inf on one rank makes every rank skip the same
// step, a rank that dies is named by the survivor, a rank that fails setup stops the
// others with its message, and (as root) two ranks in two network namespaces joined by
// a veth pair meet over the veth addresses -- the multi-host path on one machine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/compat.h"
#include "gradguard/data/token_file.h"
#include "gradguard/dist/launch.h"
#include "test_util.h"

extern char** environ;

namespace gradguard {
namespace {
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// A child `gradguard` with extra environment variables, its output in `log`.
struct Child {
  pid_t pid = -1;
  std::string log;
};

Child spawn(const std::string& cwd, const std::map<std::string, std::string>& env, const std::string& args,
            const std::string& log, const std::string& prefix = "") {
  std::string cmd = "cd '" + cwd + "' && exec " + prefix + " env";
  for (const auto& [k, v] : env) cmd += " " + k + "=" + v;
  cmd += " '" GRADGUARD_CLI_PATH "' " + args + " > '" + log + "' 2>&1";
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  Child c;
  c.log = log;
  EXPECT_EQ(posix_spawn(&c.pid, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ), 0);
  return c;
}

// Exit code of `c` (128 + signal when killed), or -1 if it is still running after
// `timeout_s` (then it is killed).
int wait_for(const Child& c, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(c.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::map<std::string, std::string> rank_env(int rank, int world, int port, const std::string& addr = "127.0.0.1") {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", addr},                {"MASTER_PORT", std::to_string(port)}};
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* words[] = {"amber", "basil", "cedar", "dune", "ember", "fern", "grove", "heath", "iris",
                           "jade",  "kelp",  "larch", "moss", "nettle", "oak", "pine", "quill", "reed"};
    std::ostringstream text;
    uint64_t x = 777;
    for (int line = 0; line < 1200; ++line) {
      for (int k = 0; k < 8; ++k) {
        x = (x * 1103515245 + 12345) % (1ULL << 31);
        text << (k ? " " : "") << words[(x >> 16) % 18];
      }
      text << ".\n";
    }
    test::write_text(dir_.file("corpus.txt"), text.str());
    auto r = test::run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // The tiny model, global batch 16 (micro 4), one thread per rank.
  std::string train_args(const std::string& run, int steps, const std::string& extra = "") const {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin --set run.name=" + run +
           " --set run.threads=1 --set batch.global_batch=16 --set schedule.total_steps=" + std::to_string(steps) +
           " --set eval.every=0 --set checkpoint.every=0 --set log.progress=lines --set log.every=1000 --set telemetry.period_ms=200 " +
           extra;
  }
  // Starts `args` as two ranks on a free port, logs in rank0.log / rank1.log.
  std::pair<Child, Child> start_two(const std::string& args, const std::string& rank1_extra = "") {
    const int port = dist::free_tcp_port("127.0.0.1");
    return {spawn(dir_.path(), rank_env(0, 2, port), args, dir_.file("rank0.log")),
            spawn(dir_.path(), rank_env(1, 2, port), args + " " + rank1_extra, dir_.file("rank1.log"))};
  }
  // Runs `args` as two ranks; returns their exit codes.
  std::pair<int, int> run_two(const std::string& args, const std::string& rank1_extra = "", double timeout_s = 120) {
    auto [r0, r1] = start_two(args, rank1_extra);
    const int c0 = wait_for(r0, timeout_s), c1 = wait_for(r1, timeout_s);
    return {c0, c1};
  }
  // Waits (up to a minute) until rank 0 has written `n` lines of metrics.
  void wait_for_steps(const std::string& run, size_t n) const {
    const std::string path = dir_.file("runs/" + run + "/metrics.jsonl");
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < until) {
      if (access(path.c_str(), R_OK) == 0 && test::read_jsonl(path).size() > n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::string logs() const {
    return "--- rank 0:\n" + test::read_text(dir_.file("rank0.log")) + "--- rank 1:\n" +
           test::read_text(dir_.file("rank1.log"));
  }
  std::vector<nlohmann::json> steps(const std::string& run) const {
    std::vector<nlohmann::json> out;
    for (auto& l : test::read_jsonl(dir_.file("runs/" + run + "/metrics.jsonl")))
      if (l.contains("loss") && !l.contains("event")) out.push_back(l);
    return out;
  }
  std::map<std::string, at::Tensor> weights(const std::string& run, int step) const {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step-%07d/model.safetensors", step);
    return checkpoint::load_safetensors(dir_.file("runs/" + run + name)).tensors;
  }
  test::TempDir dir_;
};

TEST_F(DataParallel, TwoRanksMatchOneProcessWithTheSameGlobalBatch) {
  // One process: micro 4 x accum 4 = 16. Two ranks: micro 4 x accum 2 each = 16.
  ASSERT_EQ(test::run_cli(train_args("single", 8), dir_.path()).exit_code, 0);
  auto [c0, c1] = run_two(train_args("ddp", 8, "--set dist.check_every=1"));
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  EXPECT_THAT(test::read_text(dir_.file("rank0.log")), HasSubstr("rank 0 of 2"));

  const auto a = steps("single"), b = steps("ddp");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_NEAR(b[s]["loss"].get<double>(), a[s]["loss"].get<double>(), 1e-5) << "step " << s;
    EXPECT_NEAR(b[s]["grad_norm"].get<double>(), a[s]["grad_norm"].get<double>(),
                1e-4 * a[s]["grad_norm"].get<double>())
        << "step " << s;
    EXPECT_EQ(b[s]["tokens"], a[s]["tokens"]);
  }
  const auto wa = weights("single", 8), wb = weights("ddp", 8);
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa) {
    ASSERT_TRUE(wb.count(name)) << name;
    const double diff = (wb.at(name) - t).abs().max().item<double>();
    EXPECT_LT(diff, 1e-4) << name;  // float rounding of a different summation order
  }
  // Rank 0 gathered rank 1's telemetry into the metrics.
  bool rank1_telemetry = false;
  for (auto& l : test::read_jsonl(dir_.file("runs/ddp/metrics.jsonl")))
    if (l.value("event", "") == "telemetry" && l.value("rank", -1) == 1) rank1_telemetry = true;
  EXPECT_TRUE(rank1_telemetry);
}

// Chat/SFT rows with masked prompts: every rank divides by the trained targets of the
// whole global batch (counted from the data, no collective), so two ranks take the same
// steps as one process even though the ranks' micro-batches hold different numbers of
// trained tokens.
TEST_F(DataParallel, TwoRanksMatchOneProcessOnMaskedSamples) {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> flags;
  uint32_t x = 5;
  for (int s = 0; s < 600; ++s) {
    const int length = 4 + (s * 7) % 40, prompt = 1 + (s * 11) % (length - 1);
    for (int t = 0; t < length; ++t) {
      x = x * 1103515245u + 12345u;
      tokens.push_back(97 + (x >> 16) % 26);
      flags.push_back(static_cast<uint8_t>((t == 0 ? data::kTokenSampleStart : 0) | (t >= prompt ? data::kTokenTrained : 0)));
    }
  }
  data::TokenFileMeta meta;
  meta.vocab_size = 256;
  data::write_token_file(dir_.file("sft/train.bin"), tokens, meta, flags);
  const std::string args = " --set data.train_path=sft/train.bin --set data.val_path=";
  ASSERT_EQ(test::run_cli(train_args("sft-single", 4) + args, dir_.path()).exit_code, 0);
  auto [c0, c1] = run_two(train_args("sft-ddp", 4, "--set dist.check_every=1") + args);
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  const auto a = steps("sft-single"), b = steps("sft-ddp");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_NEAR(b[s]["loss"].get<double>(), a[s]["loss"].get<double>(), 1e-5) << "step " << s;
    EXPECT_NEAR(b[s]["grad_norm"].get<double>(), a[s]["grad_norm"].get<double>(),
                1e-4 * a[s]["grad_norm"].get<double>())
        << "step " << s;
  }
  const auto wa = weights("sft-single", 4), wb = weights("sft-ddp", 4);
  for (const auto& [name, t] : wa) EXPECT_LT((wb.at(name) - t).abs().max().item<double>(), 1e-4) << name;
}

TEST_F(DataParallel, CompressionHooksStayCloseToTheUncompressedRun) {
  const int n = 30;
  auto [c0, c1] = run_two(train_args("none", n));
  ASSERT_EQ(c0 + c1, 0) << logs();
  const auto ref = steps("none");
  // Tolerances: fp16/bf16 round each rank's gradient once (bf16 to 8 bits of mantissa);
  // PowerSGD (rank 2 here, from step 5) drops most of the spectrum and leans on error
  // feedback, so it is held to a looser bound on the loss curve.
  for (auto [hook, tol] : {std::pair<std::string, double>{"fp16", 0.01}, {"bf16", 0.03}, {"powersgd", 0.08}}) {
    auto [d0, d1] = run_two(train_args(hook, n, "--set dist.hook=" + hook +
                                                     " --set dist.powersgd_rank=2 --set dist.powersgd_start_step=5"));
    ASSERT_EQ(d0 + d1, 0) << hook << "\n" << logs();
    const auto got = steps(hook);
    ASSERT_EQ(got.size(), ref.size()) << hook;
    double worst = 0;
    for (size_t s = 0; s < ref.size(); ++s)
      worst = std::max(worst, std::abs(got[s]["loss"].get<double>() - ref[s]["loss"].get<double>()) /
                                  ref[s]["loss"].get<double>());
    EXPECT_LT(worst, tol) << hook << ": worst relative loss difference " << worst;
    // And it did learn: the last loss is well below the first.
    EXPECT_LT(got.back()["loss"].get<double>(), 0.8 * got.front()["loss"].get<double>()) << hook;
  }
}

TEST_F(DataParallel, AnInfOnOneRankMakesEveryRankSkipTheSameStep) {
  // Rank 1's gradients get an inf at step 3; the weights are compared across ranks
  // after every step, so a rank that applied the step would fail the run.
  auto [c0, c1] = run_two(train_args("nan", 8,
                                     "--set guard.inject.nonfinite_steps=[3] --set guard.inject.rank=1 "
                                     "--set dist.check_every=1"));
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  const auto s = steps("nan");
  ASSERT_EQ(s.size(), 8u);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i]["skipped"].get<bool>(), i == 3) << "step " << i;
}

TEST_F(DataParallel, AKilledRankIsNamedByTheSurvivorWithinTheTimeout) {
  auto [r0, r1] = start_two(train_args("killed", 100000, "--set dist.timeout_s=20"));
  // Wait until training is under way (rank 0 has written some steps).
  wait_for_steps("killed", 5);
  ASSERT_EQ(kill(r1.pid, SIGKILL), 0);
  const auto killed_at = Clock::now();
  const int c0 = wait_for(r0, 30);
  const double took = std::chrono::duration<double>(Clock::now() - killed_at).count();
  wait_for(r1, 5);
  EXPECT_EQ(c0, 1) << logs();
  EXPECT_LT(took, 20.0) << "the survivor must stop within dist.timeout_s";
  const auto out = test::read_text(dir_.file("rank0.log"));
  EXPECT_THAT(out, HasSubstr("rank 1 stopped responding")) << out;
}

TEST_F(DataParallel, WhenRankZeroDiesTheOtherSaysTheStoreIsGone) {
  auto [r0, r1] = start_two(train_args("killed0", 100000, "--set dist.timeout_s=20"));
  wait_for_steps("killed0", 5);
  ASSERT_EQ(kill(r0.pid, SIGKILL), 0);
  const int c1 = wait_for(r1, 30);
  wait_for(r0, 5);
  EXPECT_EQ(c1, 1) << logs();
  EXPECT_THAT(test::read_text(dir_.file("rank1.log")), HasSubstr("rank 0 (it hosts the rendezvous store"));
}

TEST_F(DataParallel, ARankFailingSetupStopsTheOthersWithItsMessage) {
  auto [c0, c1] = run_two(train_args("setup", 4), "--set data.train_path=data/missing.bin", 60);
  EXPECT_EQ(c1, 2) << logs();  // bad input on rank 1
  EXPECT_EQ(c0, 1) << logs();
  const auto out0 = test::read_text(dir_.file("rank0.log"));
  EXPECT_THAT(out0, HasSubstr("another rank failed during setup"));
  EXPECT_THAT(out0, HasSubstr("rank 1: "));
  EXPECT_THAT(out0, HasSubstr("missing.bin"));
}

TEST_F(DataParallel, LaunchStartsTheRanks) {
  auto r = test::run_cli("launch --nproc 2 -- " + train_args("launched", 4), dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("via launch"));
  EXPECT_EQ(steps("launched").size(), 4u);
}

TEST_F(DataParallel, RanksRollBackTogetherAndStayEqual) {
  // A spike in rank 1's batch at step 25; the ladder's only rung is a rollback to the
  // step-20 checkpoint, which rank 0 chooses and every rank loads. The weights are
  // compared across ranks after every step.
  auto [c0, c1] = run_two(train_args("rb", 40,
                                     "--set checkpoint.every=10 --set checkpoint.keep_last=0 "
                                     "--set schedule.warmup_steps=5 --set guard.recovery.ladder=[rollback] "
                                     "--set guard.inject.spike_steps=[25] --set guard.inject.rank=1 "
                                     "--set dist.check_every=1"));
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  std::vector<nlohmann::json> rollbacks;
  for (auto& l : test::read_jsonl(dir_.file("runs/rb/metrics.jsonl")))
    if (l.value("event", "") == "rollback") rollbacks.push_back(l);
  ASSERT_EQ(rollbacks.size(), 1u) << logs();
  EXPECT_EQ(rollbacks[0]["step"], 25);
  EXPECT_EQ(rollbacks[0]["to_step"], 20);
  // The snapshot holds the whole global batch: both ranks' micro-batches.
  const auto snaps = test::read_jsonl(dir_.file("runs/rb/metrics.jsonl"));
  bool snapshot = false;
  for (const auto& l : snaps)
    if (l.value("event", "") == "recovery" && l["snapshot"].is_string()) {
      snapshot = true;
      auto batch = checkpoint::load_safetensors(dir_.file(l["snapshot"].get<std::string>() + "/batch.safetensors"));
      EXPECT_EQ(batch.tensors.at("inputs").size(0), 4);  // accum 2 per rank x 2 ranks
    }
  EXPECT_TRUE(snapshot);
}

TEST_F(DataParallel, AResumeContinuesExactlyOnEveryRank) {
  auto [a0, a1] = run_two(train_args("full", 8, "--set checkpoint.every=4 --set checkpoint.keep_last=0"));
  ASSERT_EQ(a0 + a1, 0) << logs();
  const auto reference = weights("full", 8);
  // Lose the last checkpoint, then resume both ranks from step 4.
  std::filesystem::remove_all(dir_.file("runs/full/checkpoints/step-0000008"));
  test::write_text(dir_.file("runs/full/checkpoints/latest"), "step-0000004\n");
  auto [b0, b1] = run_two("train --resume runs/full");
  ASSERT_EQ(b0, 0) << logs();
  ASSERT_EQ(b1, 0) << logs();
  EXPECT_THAT(test::read_text(dir_.file("rank0.log")), HasSubstr("resumed from"));
  for (const auto& [name, t] : weights("full", 8)) EXPECT_TRUE(torch::equal(t, reference.at(name))) << name;
}

TEST_F(DataParallel, UnderTorchrunsAgentStoreEveryRankIsAClient) {
  // torchrun (without --standalone) hosts a TCPStore on MASTER_PORT in its agent and
  // tells the workers TORCHELASTIC_USE_AGENT_STORE=True. The test plays the agent: it
  // holds the store, so a rank 0 that tried to host one too would fail to bind.
  const int port = dist::free_tcp_port("127.0.0.1");
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  compat::use_classic_tcpstore(options);  // as the communicator does
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const std::string args = train_args("agent", 4);
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r) {
    auto env = rank_env(r, 2, port);
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["TORCHELASTIC_RUN_ID"] = "job7";
    env["TORCHELASTIC_RESTART_COUNT"] = "0";
    ranks.push_back(spawn(dir_.path(), env, args, dir_.file("rank" + std::to_string(r) + ".log")));
  }
  const int c0 = wait_for(ranks[0], 120), c1 = wait_for(ranks[1], 120);
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  EXPECT_THAT(test::read_text(dir_.file("rank0.log")), HasSubstr("via torchrun"));
  EXPECT_EQ(steps("agent").size(), 4u);
  EXPECT_TRUE(agent->check({"gradguard/job7/0/hb/1"}));  // our keys, scoped to the run and restart
}

TEST_F(DataParallel, RanksInTwoNetworkNamespacesMeetOverAVethPair) {
  // Two "hosts": namespaces gg0 (10.231.0.1) and gg1 (10.231.0.2) joined by a veth pair;
  // rank 0 in gg0 hosts the store, rank 1 in gg1 reaches it over the veth link.
  const std::string suffix = std::to_string(getpid() % 100000);
  const std::string ns0 = "gg0-" + suffix, ns1 = "gg1-" + suffix;
  const std::string veth0 = "ggv0-" + suffix, veth1 = "ggv1-" + suffix;
  auto sh = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); };
  const std::string setup = "ip netns add " + ns0 + " && ip netns add " + ns1 + " && ip link add " + veth0 +
                            " type veth peer name " + veth1 + " && ip link set " + veth0 + " netns " + ns0 +
                            " && ip link set " + veth1 + " netns " + ns1 + " && ip -n " + ns0 + " addr add 10.231.0.1/24 dev " +
                            veth0 + " && ip -n " + ns1 + " addr add 10.231.0.2/24 dev " + veth1 + " && ip -n " + ns0 +
                            " link set " + veth0 + " up && ip -n " + ns1 + " link set " + veth1 + " up && ip -n " +
                            ns0 + " link set lo up && ip -n " + ns1 + " link set lo up";
  struct Cleanup {
    std::string a, b;
    ~Cleanup() { std::system(("ip netns del " + a + " >/dev/null 2>&1; ip netns del " + b + " >/dev/null 2>&1").c_str()); }
  } cleanup{ns0, ns1};
  if (geteuid() != 0 || sh(setup) != 0)
    GTEST_SKIP() << "needs root and network namespaces (ip netns, veth) to emulate two hosts";

  const int port = 29731;
  const std::string args = train_args("netns", 4);
  auto r0 = spawn(dir_.path(), rank_env(0, 2, port, "10.231.0.1"), args, dir_.file("rank0.log"),
                  "ip netns exec " + ns0);
  auto r1 = spawn(dir_.path(), rank_env(1, 2, port, "10.231.0.1"), args, dir_.file("rank1.log"),
                  "ip netns exec " + ns1);
  const int c0 = wait_for(r0, 120), c1 = wait_for(r1, 120);
  ASSERT_EQ(c0, 0) << logs();
  ASSERT_EQ(c1, 0) << logs();
  EXPECT_THAT(test::read_text(dir_.file("rank0.log")), HasSubstr("rendezvous 10.231.0.1:29731"));
  EXPECT_EQ(steps("netns").size(), 4u);
}

}  // namespace
}  // namespace gradguard
