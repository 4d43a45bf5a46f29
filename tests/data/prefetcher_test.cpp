// BatchPrefetcher: batches taken through the prefetcher equal the ones built directly,
// for the key sequence the trainer produces (steps in order, a rollback that jumps back
// with a new data offset, a resume with a fresh prefetcher); producer exceptions reach
// get() with their type and message; a stale result is never handed out; destruction
// with a request in flight returns promptly.
#include "gradguard/data/prefetcher.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::data {
namespace {

using Clock = std::chrono::steady_clock;
using Key = BatchPrefetcher::Key;

std::shared_ptr<const TokenFile> counting_file(const test::TempDir& dir, int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7) % 256);
  const std::string path = dir.file("tokens.bin");
  write_token_file(path, tokens);
  return std::make_shared<const TokenFile>(path, 256);
}

void expect_same(const StepBatches& got, const StepBatches& expected, const std::string& where) {
  ASSERT_EQ(got.micro.size(), expected.micro.size()) << where;
  EXPECT_TRUE(torch::equal(got.sample_index, expected.sample_index)) << where;
  for (size_t m = 0; m < expected.micro.size(); ++m) {
    EXPECT_TRUE(got.micro[m].inputs.device().is_cpu()) << where;
    EXPECT_TRUE(torch::equal(got.micro[m].inputs, expected.micro[m].inputs)) << where << " m=" << m;
    EXPECT_TRUE(torch::equal(got.micro[m].targets, expected.micro[m].targets)) << where << " m=" << m;
  }
}

// The trainer's use: key {step, data_offset}; get(step), then prefetch(step + 1).
class TrainerLikeLoop : public ::testing::TestWithParam<bool> {};

TEST_P(TrainerLikeLoop, PrefetchedBatchesEqualDirectOnesThroughRollbackAndResume) {
  test::TempDir dir;
  auto ds = std::make_shared<TokenDataset>(counting_file(dir, 4001), 8, /*shuffle=*/GetParam(), 5);  // N = 500
  const BatchLayout layout{4, 3, 1};  // 12 samples per step: wraps into epoch 1 after step 41
  auto produce = [&](const Key& k) { return step_batches(*ds, layout, k[0] + k[1], 0); };
  const int64_t total = 60;

  // Runs steps [from, to) as the trainer does; at step `rollback_at` jumps back to
  // `rollback_to` and adds `skip` data steps to the offset. Returns the last offset.
  auto run = [&](BatchPrefetcher& p, int64_t from, int64_t to, int64_t offset, int64_t rollback_at,
                 int64_t rollback_to, int64_t skip) {
    bool rolled_back = false;
    for (int64_t step = from; step < to; ++step) {
      const auto got = p.get({step, offset});
      expect_same(got, step_batches(*ds, layout, step + offset, 0), "step " + std::to_string(step));
      if (step + 1 < total) p.prefetch({step + 1, offset});
      if (step == rollback_at && !rolled_back) {
        rolled_back = true;
        offset += step + 1 - rollback_to + skip;
        step = rollback_to - 1;
      }
    }
    return offset;
  };

  int64_t offset = 0;
  {
    BatchPrefetcher first(produce);
    offset = run(first, 0, 45, 0, /*rollback_at=*/30, /*rollback_to=*/20, /*skip=*/2);
    EXPECT_EQ(offset, 13);
    // Misses: the first step and the step after the rollback; the other 54 of the 56
    // gets (steps 0..30, then 20..44) were prefetched.
    EXPECT_EQ(first.misses(), 2);
    EXPECT_EQ(first.hits(), 54);
  }  // destroyed with step 45 prefetched and never asked for

  // A resume: a fresh prefetcher (and a fresh dataset, as a new process has) at step 45.
  ds = std::make_shared<TokenDataset>(counting_file(dir, 4001), 8, GetParam(), 5);
  BatchPrefetcher resumed(produce);
  run(resumed, 45, total, offset, -1, 0, 0);
  EXPECT_EQ(resumed.misses(), 1);
  EXPECT_EQ(resumed.hits(), total - 45 - 1);
}

INSTANTIATE_TEST_SUITE_P(Shuffle, TrainerLikeLoop, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Shuffled" : "FileOrder"; });

TEST(BatchPrefetcher, AStaleResultIsNeverHandedOut) {
  // Key {0} is slow and prefetched; get({1}) must wait it out and return {1}'s batches.
  std::atomic<int> calls{0};
  BatchPrefetcher p([&](const Key& k) {
    ++calls;
    if (k[0] == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    StepBatches b;
    b.sample_index = torch::full({1, 1}, k[0], torch::kLong);
    return b;
  });
  p.prefetch({0});
  EXPECT_EQ(p.get({1}).sample_index.item<int64_t>(), 1);
  EXPECT_EQ(p.misses(), 1);
  // Asking again for what the slot already holds or builds starts nothing new.
  p.prefetch({2});
  p.prefetch({2});
  EXPECT_EQ(p.get({2}).sample_index.item<int64_t>(), 2);
  EXPECT_EQ(p.hits(), 1);
  EXPECT_LE(calls.load(), 3);
}

TEST(BatchPrefetcher, AnExceptionInTheBackgroundReachesTheCallerUnchanged) {
  // A corrupt token file opened by the producer on the prefetcher's thread.
  test::TempDir dir;
  const std::string bad = dir.file("corrupt.bin");
  test::write_text(bad, std::string(2048, 'x'));  // header-sized, wrong magic
  std::string direct;
  try {
    TokenFile f(bad, 256);
  } catch (const Error& e) {
    direct = e.what();
  }
  ASSERT_NE(direct.find("bad magic number"), std::string::npos) << direct;

  auto good = counting_file(dir, 1001);
  BatchPrefetcher p([&](const Key& k) {
    if (k[0] == 1) TokenFile(bad, 256);  // throws
    return step_batches(TokenDataset(good, 4, false, 0), {2, 2, 1}, k[0], 0);
  });
  p.prefetch({1});
  try {
    p.get({1});
    ADD_FAILURE() << "expected the producer's gradguard::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(std::string(e.what()), direct);
  }
  // Not prefetched: the same error through the miss path.
  const std::string msg = test::bad_input_message([&] { p.get({1}); });
  EXPECT_EQ(msg, direct);
  // The prefetcher stays usable, and an error of a request nobody asks for is dropped.
  p.prefetch({1});
  EXPECT_NO_THROW(p.get({2}));
  EXPECT_EQ(p.get({3}).sample_index[0][0].item<int64_t>(), 3 * 2 * 2);
}

TEST(BatchPrefetcher, OtherExceptionTypesKeepTheirType) {
  BatchPrefetcher p([](const Key&) -> StepBatches { throw std::out_of_range("step out of range"); });
  p.prefetch({0});
  EXPECT_THROW(
      {
        try {
          p.get({0});
        } catch (const std::out_of_range& e) {
          EXPECT_STREQ(e.what(), "step out of range");
          throw;
        }
      },
      std::out_of_range);
}

TEST(BatchPrefetcher, DestructionWithARequestInFlightDoesNotHang) {
  // Run on another thread so that a hang fails the test instead of blocking the suite.
  auto done = std::async(std::launch::async, [] {
    std::promise<void> started;
    auto started_f = started.get_future();
    std::atomic<bool> signalled{false};
    const auto t0 = Clock::now();
    {
      BatchPrefetcher p([&](const Key&) {
        if (!signalled.exchange(true)) started.set_value();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return StepBatches();
      });
      p.prefetch({0});
      started_f.wait();  // the producer is running
      p.prefetch({1});   // and another request is queued behind it
    }                    // destroyed: waits for {0} to return, never starts {1}
    {
      BatchPrefetcher idle([](const Key&) { return StepBatches(); });  // never asked: exits at once
      BatchPrefetcher queued([](const Key&) { return StepBatches(); });
      queued.prefetch({0});  // destroyed right after a request, maybe before it started
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "destruction hangs";
  const double seconds = done.get();
  EXPECT_LT(seconds, 5.0);
}

TEST(BatchPrefetcher, CpuDeviceLeavesBatchesWhereTheyAre) {
  // On the CPU move_to_device is a no-op: no pinning (CPU-only builds have no pinned allocator).
  StepBatches b;
  b.micro.push_back({torch::ones({2, 3}, torch::kLong), torch::ones({2, 3}, torch::kLong)});
  const void* before = b.micro[0].inputs.data_ptr();
  move_to_device(b, c10::Device(c10::kCPU));
  EXPECT_EQ(b.micro[0].inputs.data_ptr(), before);
  EXPECT_FALSE(b.micro[0].inputs.is_pinned());
}

TEST(BatchPrefetcher, CudaDeviceGetsPinnedAsyncCopies) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  auto ds = std::make_shared<TokenDataset>(counting_file(dir, 4001), 8, false, 5);
  const BatchLayout layout{4, 2, 1};
  BatchPrefetcher p([&](const Key& k) { return step_batches(*ds, layout, k[0], 0); }, c10::Device(c10::kCUDA));
  for (int64_t step = 0; step < 5; ++step) {
    auto got = p.get({step});
    p.prefetch({step + 1});
    const auto expected = step_batches(*ds, layout, step, 0);
    EXPECT_TRUE(got.sample_index.device().is_cpu());
    for (size_t m = 0; m < expected.micro.size(); ++m) {
      ASSERT_TRUE(got.micro[m].inputs.is_cuda());
      EXPECT_TRUE(torch::equal(got.micro[m].inputs.cpu(), expected.micro[m].inputs));
      EXPECT_TRUE(torch::equal(got.micro[m].targets.cpu(), expected.micro[m].targets));
    }
  }
  EXPECT_EQ(p.hits(), 4);
}

}  // namespace
}  // namespace gradguard::data
