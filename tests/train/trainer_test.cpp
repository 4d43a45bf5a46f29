// The trainer in-process: the guarded step's host-sync budget (exactly one statistics
// copy per optimizer step) and run-to-run determinism.
#include "gradguard/train/trainer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "gradguard/data/token_file.h"
#include "gradguard/grad/grad_stats.h"
#include "test_util.h"

namespace gradguard::train {
namespace {

config::Config tiny(const test::TempDir& dir, const std::string& name) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 97 + 32));
  data::write_token_file(dir.file("train.bin"), tokens);
  auto c = config::load_config(test::source_path("configs/tiny.yaml"),
                               {"data.train_path=" + dir.file("train.bin"), "data.val_path=", "run.dir=" + dir.path(),
                                "run.name=" + name, "log.progress=none", "checkpoint.every=0"});
  return c;
}

TEST(Trainer, OneHostSyncPerGuardedStep) {
  test::TempDir dir;
  Trainer trainer(tiny(dir, "sync"));
  const int64_t before = grad::GradStatsComputer::host_syncs();
  auto r = trainer.run();
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(grad::GradStatsComputer::host_syncs() - before, r.steps);
}

TEST(Trainer, SameSeedSameLosses) {
  test::TempDir dir;
  auto a = Trainer(tiny(dir, "a")).run();
  auto b = Trainer(tiny(dir, "b")).run();
  EXPECT_EQ(a.first_loss, b.first_loss);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(test::read_text(dir.file("a/checkpoints/step-0000006/model.safetensors")),
            test::read_text(dir.file("b/checkpoints/step-0000006/model.safetensors")));
}

}  // namespace
}  // namespace gradguard::train
