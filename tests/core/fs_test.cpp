// Atomic writes and error exit codes.
#include "gradguard/core/fs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard {
namespace {

TEST(Fs, AtomicFileReplacesOnlyOnCommit) {
  test::TempDir dir;
  const std::string path = dir.file("sub/a.txt");
  fs::write_file_atomic(path, "old");
  {
    fs::AtomicFile f(path);
    f.write("new but abandoned");
  }  // destroyed without commit
  EXPECT_EQ(fs::read_file(path), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.file("sub")), {}), 1);  // no temp left
  fs::write_file_atomic(path, "new");
  EXPECT_EQ(fs::read_file(path), "new");
}

TEST(Fs, ReadErrorsNameThePath) {
  test::TempDir dir;
  try {
    fs::read_file(dir.file("none"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_THAT(e.what(), ::testing::HasSubstr(dir.file("none")));
  }
  EXPECT_THROW(fs::read_file(dir.path()), Error);
}

TEST(Fs, UnwritableTargetIsARuntimeError) {
  try {
    fs::write_file_atomic("/proc/gradguard-cannot-write/x", "y");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("/proc/gradguard-cannot-write/x"));
  }
}

TEST(Error, ExitCodes) {
  EXPECT_EQ(bad_input("k", "w").exit_code(), 2);
  EXPECT_EQ(Error(ErrorKind::kHalted, "", "x").exit_code(), 3);
  EXPECT_EQ(runtime_error("", "x").exit_code(), 1);
  EXPECT_STREQ(bad_input("optim.lr", "must be > 0").what(), "optim.lr: must be > 0");
}

}  // namespace
}  // namespace gradguard
