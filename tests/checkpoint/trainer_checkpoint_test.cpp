// Trainer checkpoints: bit-exact resume, manifest verification with fallback to the
// previous good checkpoint, and the refusal of a resume whose model changed.
#include "gradguard/checkpoint/trainer_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gradguard/core/crc32c.h"
#include "gradguard/core/error.h"
#include "gradguard/data/token_file.h"
#include "gradguard/train/trainer.h"
#include "test_util.h"

namespace gradguard::checkpoint {
namespace {
namespace stdfs = std::filesystem;
using ::testing::HasSubstr;

class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint16_t> tokens;
    for (int i = 0; i < 5000; ++i) tokens.push_back(static_cast<uint16_t>((i * 31 + i / 7) % 90 + 32));
    data::write_token_file(dir_.file("train.bin"), tokens);
  }
  config::Config cfg(const std::string& name, std::vector<std::string> extra = {}) const {
    std::vector<std::string> sets = {"data.train_path=" + dir_.file("train.bin"), "data.val_path=",
                                     "run.dir=" + dir_.path(), "run.name=" + name, "log.progress=none",
                                     "checkpoint.every=2", "checkpoint.keep_last=0",
                                     // Exercise every piece of resumable state.
                                     "amp.scaler.mode=dynamic", "amp.scaler.growth_interval=2",
                                     "clip.strategy=zscore", "clip.zscore_warmup=2", "data.shuffle=true",
                                     "guard.inject.nonfinite_steps=[3]"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return config::load_config(test::source_path("configs/tiny.yaml"), sets);
  }
  // A copy of run `from` as it was when the checkpoint at `step` was the newest.
  std::string crashed_copy(const std::string& from, const std::string& to, int64_t step) {
    stdfs::copy(dir_.file(from), dir_.file(to), stdfs::copy_options::recursive);
    for (const auto& e : stdfs::directory_iterator(dir_.file(to + "/checkpoints")))
      if (e.is_directory() && e.path().filename().string() > "step-" + pad(step)) stdfs::remove_all(e.path());
    test::write_text(dir_.file(to + "/checkpoints/latest"), "step-" + pad(step) + "\n");
    return dir_.file(to);
  }
  static std::string pad(int64_t step) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%07lld", static_cast<long long>(step));
    return buf;
  }
  std::vector<double> losses(const std::string& run) const {
    std::vector<double> out;
    std::istringstream in(test::read_text(dir_.file(run + "/metrics.jsonl")));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && !j.contains("event")) out.push_back(j["loss"]);
    }
    return out;
  }
  test::TempDir dir_;
};

TEST_F(Resume, ContinuesBitExactly) {
  train::Trainer(cfg("full")).run();
  const std::string run = crashed_copy("full", "resumed", 2);
  // The metrics of the crashed run went on past the checkpoint; resume cuts them back.
  auto r = train::Trainer(cfg("resumed"), stdout, run).run();
  EXPECT_EQ(r.resumed_from, 2);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(losses("resumed"), losses("full"));
  EXPECT_EQ(losses("full").size(), 6u);
  // Final weights bit-identical (optimizer.pt is not compared byte for byte: LibTorch
  // 1.x keys its state by parameter addresses, which differ between processes).
  EXPECT_EQ(crc32c_file(dir_.file("full/checkpoints/step-0000006/model.safetensors")),
            crc32c_file(dir_.file("resumed/checkpoints/step-0000006/model.safetensors")));
}

TEST_F(Resume, CorruptCheckpointFallsBackToThePreviousOne) {
  train::Trainer(cfg("full")).run();
  const std::string run = crashed_copy("full", "broken", 4);
  {
    std::fstream f(run + "/checkpoints/step-0000004/optimizer.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');  // one flipped byte
  }
  std::vector<std::string> rejected;
  EXPECT_EQ(find_resumable(run, &rejected), run + "/checkpoints/step-0000002");
  ASSERT_GE(rejected.size(), 1u);
  EXPECT_THAT(rejected[0], HasSubstr("step-0000004/optimizer.pt: checksum does not match"));
  auto r = train::Trainer(cfg("broken"), stdout, run).run();
  EXPECT_EQ(r.resumed_from, 2);
  EXPECT_EQ(losses("broken"), losses("full"));
}

TEST_F(Resume, TruncatedFileIsRejected) {
  train::Trainer(cfg("full")).run();
  const std::string ckpt = dir_.file("full/checkpoints/step-0000006");
  stdfs::resize_file(ckpt + "/model.safetensors", 100);
  auto msg = test::bad_input_message([&] { verify_checkpoint(ckpt); });
  EXPECT_THAT(msg, HasSubstr("model.safetensors: size 100 does not match the manifest"));
  stdfs::remove(ckpt + "/manifest.json");
  EXPECT_THAT(test::bad_input_message([&] { verify_checkpoint(ckpt); }), HasSubstr("not a complete checkpoint"));
}

TEST_F(Resume, ChangedModelIsRefusedAndNothingIsOverwritten) {
  train::Trainer(cfg("full")).run();
  const std::string run = crashed_copy("full", "changed", 4);
  const std::string before = test::read_text(run + "/metrics.jsonl");
  auto msg = test::bad_input_message([&] { train::Trainer(cfg("changed", {"model.hidden_size=64"}), stdout, run); });
  EXPECT_THAT(msg, HasSubstr("model.hidden_size = 32 but the configuration asks for 64"));
  EXPECT_EQ(test::read_text(run + "/metrics.jsonl"), before);
  EXPECT_THAT(test::bad_input_message([&] { train::Trainer(cfg("x", {"optim.name=lars"}), stdout, run); }),
              HasSubstr("optimizer.pt"));
}

TEST_F(Resume, NothingToResumeFrom) {
  stdfs::create_directories(dir_.file("empty"));
  EXPECT_THAT(test::bad_input_message([&] { find_resumable(dir_.file("empty"), nullptr); }),
              HasSubstr("has no checkpoints/ directory"));
  stdfs::create_directories(dir_.file("empty/checkpoints/step-0000002"));
  EXPECT_THAT(test::bad_input_message([&] { find_resumable(dir_.file("empty"), nullptr); }),
              HasSubstr("no checkpoint verifies"));
}

// An optimizer whose state cannot be written, standing in for a disk that fills up
// part-way through a checkpoint.
struct FailingOptimizer : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  void save(torch::serialize::OutputArchive&) const override { throw std::runtime_error("No space left on device"); }
};

TEST_F(Resume, FailedSaveLeavesNoTemporaryAndEarlierCheckpointsIntact) {
  train::Trainer(cfg("full")).run();
  const std::string root = dir_.file("full/checkpoints");
  model::LlamaForCausalLM m(cfg("full").model);
  FailingOptimizer opt(m->parameters(), torch::optim::SGDOptions(0.1));
  try {
    save_checkpoint(root, 8, *m, opt, {{"step", 8}}, "", 0);
    ADD_FAILURE() << "the failing save succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_THAT(e.what(), HasSubstr("No space left on device"));
    EXPECT_THAT(e.what(), HasSubstr("earlier checkpoints are intact"));
  }
  EXPECT_FALSE(stdfs::exists(root + "/step-0000008"));
  EXPECT_FALSE(stdfs::exists(root + "/.tmp-step-0000008"));
  EXPECT_NO_THROW(verify_checkpoint(root + "/step-0000006"));
  EXPECT_EQ(test::read_text(root + "/latest"), "step-0000006\n");
}

}  // namespace
}  // namespace gradguard::checkpoint
