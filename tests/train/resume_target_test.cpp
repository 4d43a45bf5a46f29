// --resume resolution (train/resume_target.h) on hand-made run directories: which run
// auto means, what a directory brings (its config.yaml, run.dir/run.name), and the
// errors a user can hit. The end-to-end resume is in tests/e2e/cli_test.cpp.
#include "gradguard/train/resume_target.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "test_util.h"

namespace gradguard::train {
namespace {
namespace stdfs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A run directory with config.yaml and, when `checkpointed`, checkpoints/latest.
void make_run(const std::string& dir, bool checkpointed) {
  stdfs::create_directories(dir + "/checkpoints/step-0000002");
  test::write_text(dir + "/config.yaml", "run:\n  name: x\n");
  test::write_text(dir + "/metrics.jsonl", "{\"step\": 0, \"loss\": 1.0}\n");
  if (checkpointed) stdfs::create_directory_symlink("step-0000002", dir + "/checkpoints/latest");
}

TEST(ResumeTarget, NoResumeStartsARunWithTheGivenConfiguration) {
  const auto t = resolve_resume("", "my.yaml", {"optim.lr=1e-3"});
  EXPECT_EQ(t.run_dir, "");
  EXPECT_EQ(t.config_path, "my.yaml");
  EXPECT_THAT(t.overrides, ElementsAre("optim.lr=1e-3"));
}

TEST(ResumeTarget, ADirectoryIsThatRunWithItsOwnConfig) {
  test::TempDir dir;
  make_run(dir.file("runs/a"), true);
  const auto t = resolve_resume(dir.file("runs/a"), "", {"schedule.total_steps=9"});
  EXPECT_EQ(t.run_dir, dir.file("runs/a"));
  EXPECT_EQ(t.config_path, dir.file("runs/a") + "/config.yaml");
  EXPECT_THAT(t.overrides, ElementsAre("schedule.total_steps=9", "run.dir=" + dir.file("runs"), "run.name=a"));
  // A file given explicitly wins over the run's config.yaml.
  EXPECT_EQ(resolve_resume(dir.file("runs/a"), "other.yaml", {}).config_path, "other.yaml");
  const auto message = test::bad_input_message([&] { resolve_resume(dir.file("runs/none"), "", {}); });
  EXPECT_THAT(message, HasSubstr("--resume " + dir.file("runs/none")));
  EXPECT_THAT(message, HasSubstr("is not a run directory"));
}

TEST(ResumeTarget, AutoWithoutANameIsTheNewestCheckpointedRun) {
  test::TempDir dir;
  make_run(dir.file("runs/old"), true);
  make_run(dir.file("runs/new"), true);
  make_run(dir.file("runs/fresh"), false);  // newer still, but nothing to resume
  const auto now = stdfs::file_time_type::clock::now();
  stdfs::last_write_time(dir.file("runs/old/checkpoints/latest"), now - std::chrono::hours(2));
  stdfs::last_write_time(dir.file("runs/new/checkpoints/latest"), now - std::chrono::hours(1));
  const auto t = resolve_resume("auto", "", {"run.dir=" + dir.file("runs")});
  EXPECT_EQ(t.run_dir, dir.file("runs/new"));
  EXPECT_EQ(t.note, "");
  EXPECT_EQ(t.overrides.back(), "run.name=new");

  test::TempDir empty;
  stdfs::create_directories(empty.file("runs"));
  const auto message = test::bad_input_message([&] { resolve_resume("auto", "", {"run.dir=" + empty.file("runs")}); });
  EXPECT_THAT(message, HasSubstr("--resume auto"));
  EXPECT_THAT(message, HasSubstr("no run under '" + empty.file("runs") + "' has a checkpoint"));
}

TEST(ResumeTarget, AutoWithANameResumesItOrStartsIt) {
  test::TempDir dir;
  make_run(dir.file("runs/named"), true);
  auto t = resolve_resume("auto", "", {"run.dir=" + dir.file("runs"), "run.name=named"});
  EXPECT_EQ(t.run_dir, dir.file("runs/named"));
  // A run without a checkpoint is started over (it has nothing to keep), and said so.
  make_run(dir.file("runs/bare"), false);
  t = resolve_resume("auto", "", {"run.dir=" + dir.file("runs"), "run.name=bare"});
  EXPECT_EQ(t.run_dir, "");
  EXPECT_THAT(t.note, HasSubstr("run " + dir.file("runs") + "/bare has no checkpoint; starting it"));
  EXPECT_THAT(t.overrides, ElementsAre("run.dir=" + dir.file("runs"), "run.name=bare", "run.overwrite=true"));
  // A name with no directory at all: started, nothing to overwrite.
  t = resolve_resume("auto", "", {"run.dir=" + dir.file("runs"), "run.name=new"});
  EXPECT_EQ(t.run_dir, "");
  EXPECT_THAT(t.overrides, ElementsAre("run.dir=" + dir.file("runs"), "run.name=new"));
}

}  // namespace
}  // namespace gradguard::train
