// The run directory's exclusive lock (core/run_lock.h).
#include "gradguard/core/run_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "test_util.h"

namespace gradguard {
namespace {

TEST(RunLock, SecondHolderIsRefusedWithThePidAndReleaseFreesIt) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  {
    RunLock first(run);
    EXPECT_TRUE(first.held());
    EXPECT_EQ(fs::read_file(run + "/.lock"), std::to_string(::getpid()) + "\n");
    try {
      RunLock second(run);  // flock conflicts between two open files, also in one process
      FAIL() << "the second lock was granted";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("pid " + std::to_string(::getpid())));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(run));
    }
    RunLock moved = std::move(first);
    EXPECT_TRUE(moved.held());
    EXPECT_FALSE(first.held());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  }
  RunLock again(run);  // released with its last holder
  EXPECT_TRUE(again.held());
}

}  // namespace
}  // namespace gradguard
