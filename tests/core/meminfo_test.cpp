// /proc/meminfo (core/meminfo.h), checked against what the kernel reports through
// sysinfo(2) on the same machine: the same total, in bytes.
#include "gradguard/core/meminfo.h"

#include <gtest/gtest.h>
#include <sys/sysinfo.h>

namespace gradguard {
namespace {

TEST(Meminfo, FieldsAreInBytesAndAgreeWithSysinfo) {
  const auto meminfo = read_meminfo();
  ASSERT_TRUE(meminfo.has_value()) << "/proc/meminfo unreadable";
  ASSERT_TRUE(meminfo->count("MemTotal"));
  ASSERT_TRUE(meminfo->count("MemAvailable"));
  struct sysinfo info {};
  ASSERT_EQ(sysinfo(&info), 0);
  const double total = static_cast<double>(info.totalram) * info.mem_unit;
  // meminfo rounds to whole kB; sysinfo counts bytes.
  EXPECT_NEAR(meminfo->at("MemTotal"), total, 1024.0);
  EXPECT_GT(meminfo->at("MemAvailable"), 0.0);
  EXPECT_LE(meminfo->at("MemAvailable"), meminfo->at("MemTotal"));
}

}  // namespace
}  // namespace gradguard
