// The CPU thread policy: usable CPUs follow the affinity mask (what `taskset` and
// container runtimes set), and ranks sharing a node split them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sched.h>

#include <thread>

#include <ATen/Parallel.h>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/threads.h"

namespace gradguard {
namespace {

TEST(Threads, UsableCpusFollowTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const int64_t all = usable_cpus();
  EXPECT_GE(all, 1);
  EXPECT_LE(all, static_cast<int64_t>(std::thread::hardware_concurrency()));
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &saved)) {
      CPU_SET(cpu, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int64_t pinned = usable_cpus();
  const int64_t threads = default_threads(0);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);  // restore before asserting
  EXPECT_EQ(pinned, 1);
  EXPECT_EQ(threads, 1);
}

TEST(Threads, APinnedRankKeepsItsWholeShare) {
  // 64 CPUs, 8 ranks. Slurm --cpus-per-task=8 pins each rank to 8: the pin is its share
  // (8 threads, not 8 / 8). Unpinned, the 64 are split: 8 each. A cgroup quota of 6.5
  // CPUs shared by all ranks caps the node first: 7 / 8 -> 1 each.
  EXPECT_EQ(thread_share(0, 8, 8, 64, 0), 8);
  EXPECT_EQ(thread_share(0, 8, 64, 64, 0), 8);
  EXPECT_EQ(thread_share(0, 8, 64, 64, 6.5), 1);
  EXPECT_EQ(thread_share(0, 1, 64, 64, 6.5), 7);
  EXPECT_EQ(thread_share(0, 4, 2, 64, 0), 2);  // taskset -c 0,1 with 4 ranks
  EXPECT_EQ(thread_share(0, 2, 4, 4, 0), 2);
  EXPECT_EQ(thread_share(3, 8, 8, 64, 0), 3);  // an explicit request wins
}

TEST(Threads, UnpinnedRanksSplitTheNode) {
  // This test process is not pinned (the whole machine): 2 ranks split it.
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  if (CPU_COUNT(&mask) < static_cast<int>(std::thread::hardware_concurrency())) GTEST_SKIP() << "process is pinned";
  const int64_t cpus = usable_cpus();
  EXPECT_EQ(default_threads(3, 2), 3);  // an explicit request wins
  EXPECT_EQ(default_threads(0, 1), cpus);
  EXPECT_EQ(default_threads(0, 2), std::max<int64_t>(1, cpus / 2));
  EXPECT_EQ(default_threads(0, 1000), 1);  // never zero
}

TEST(Threads, ConfigureThreadsGivesTheThreadsToOnePool) {
  const int before = at::get_num_threads();
  const ThreadReport aten = configure_threads(3, ThreadPool::kAten);
  EXPECT_EQ(aten.pool, ThreadPool::kAten);
  EXPECT_EQ(aten.intra_op, 3);
  EXPECT_EQ(at::get_num_threads(), 3);
  if (aten.blas != "unknown") EXPECT_EQ(aten.blas_threads, 1);  // the other pool: one thread

  const ThreadReport blas = configure_threads(3, ThreadPool::kBlas);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(blas.intra_op, 1);
  if (blas.blas == "unknown") {
    EXPECT_EQ(blas.pool, ThreadPool::kAten);  // nothing to give BLAS threads to: ATen keeps one
  } else {
    EXPECT_EQ(blas.pool, ThreadPool::kBlas);
    EXPECT_EQ(blas.blas_threads, 3);
  }
  // This test binary links the system LibTorch, which on Debian uses OpenBLAS: auto picks
  // its pool there (the measured faster split, docs/performance.md).
  const ThreadReport automatic = configure_threads(2, ThreadPool::kAuto);
  EXPECT_EQ(automatic.pool, automatic.blas == "openblas" ? ThreadPool::kBlas : ThreadPool::kAten);
  at::set_num_threads(before);
}

TEST(Threads, ResolvesThePoolPerBlasAndRejectsUnknownNames) {
  // Reference: the policy in core/threads.h.
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kAuto, "openblas"), ThreadPool::kBlas);
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kAuto, "mkl"), ThreadPool::kAten);
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kAuto, "unknown"), ThreadPool::kAten);
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kBlas, "mkl"), ThreadPool::kBlas);
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kBlas, "unknown"), ThreadPool::kAten);
  EXPECT_EQ(resolve_thread_pool(ThreadPool::kAten, "openblas"), ThreadPool::kAten);
  // An unknown pool name is rejected where the config is read.
  try {
    config::load_config("", {"run.thread_pool=both"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("run.thread_pool"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("'both' is not valid (valid: auto, aten, blas)"));
  }
}

}  // namespace
}  // namespace gradguard
