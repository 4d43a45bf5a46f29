// data::step_batches: the docs/design.md sample order of one optimizer step for one rank and
// for every rank interleaved, against the formula written out by hand, and the
// thread-safety of a shuffled dataset read from several threads at once.
#include "gradguard/data/step_batches.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace gradguard::data {
namespace {

std::shared_ptr<const TokenFile> counting_file(const test::TempDir& dir, int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 1000);
  const std::string path = dir.file("tokens.bin");
  write_token_file(path, tokens);
  return std::make_shared<const TokenFile>(path, 0);
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(StepBatches, OneRankFollowsTheDesignOrder) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 1001), 4, false, 0);  // N = 250
  const BatchLayout layout{3, 2, 1};                       // micro 3 x accum 2
  const StepBatches b = step_batches(ds, layout, 41, 0);   // wraps: k from 246
  ASSERT_EQ(b.micro.size(), 2u);
  EXPECT_EQ(b.sample_index.sizes(), (std::vector<int64_t>{2, 3}));
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t row = 0; row < 3; ++row) {
      const int64_t k = (41 * 2 + m) * 3 + row;
      EXPECT_EQ(b.sample_index[m][row].item<int64_t>(), k);
      const auto expected = ds.batch(k, 1);
      EXPECT_TRUE(torch::equal(b.micro[m].inputs[row], expected.inputs[0])) << "m=" << m << " row=" << row;
      EXPECT_TRUE(torch::equal(b.micro[m].targets[row], expected.targets[0])) << "m=" << m << " row=" << row;
    }
}

TEST(StepBatches, EveryRankInterleavesThePerRankShards) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 1001), 4, true, 9);  // shuffled
  const BatchLayout layout{2, 3, 2};                      // micro 2 x accum 3 x 2 ranks
  const StepBatches all = step_batches(ds, layout, 7, -1);
  ASSERT_EQ(all.micro.size(), 6u);
  EXPECT_EQ(all.sample_index.sizes(), (std::vector<int64_t>{6, 2}));
  for (int64_t r = 0; r < 2; ++r) {
    const StepBatches mine = step_batches(ds, layout, 7, r);
    ASSERT_EQ(mine.micro.size(), 3u);
    for (int64_t m = 0; m < 3; ++m) {
      const int64_t g = m * 2 + r;
      EXPECT_EQ(to_vector(mine.sample_index[m]), to_vector(all.sample_index[g]));
      EXPECT_EQ(mine.sample_index[m][0].item<int64_t>(), ((7 * 3 + m) * 2 + r) * 2);
      EXPECT_TRUE(torch::equal(mine.micro[m].inputs, all.micro[g].inputs));
      EXPECT_TRUE(torch::equal(mine.micro[m].targets, all.micro[g].targets));
    }
  }
}

TEST(StepBatches, ShuffledDatasetIsSafeToReadFromSeveralThreads) {
  // Threads walking different epochs keep replacing the cached permutation; every batch
  // must still match one built alone (ThreadSanitizer builds check the locking too).
  test::TempDir dir;
  auto file = counting_file(dir, 20001);
  TokenDataset shared(file, 4, true, 3);  // N = 5000
  const BatchLayout layout{16, 2, 1};     // 32 samples per step: an epoch every ~156 steps
  std::vector<std::vector<StepBatches>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int64_t i = 0; i < 40; ++i) got[t].push_back(step_batches(shared, layout, t * 157 + i * 13, 0));
    });
  for (auto& th : threads) th.join();
  TokenDataset alone(file, 4, true, 3);
  for (int t = 0; t < 4; ++t)
    for (int64_t i = 0; i < 40; ++i) {
      const auto expected = step_batches(alone, layout, t * 157 + i * 13, 0);
      for (size_t m = 0; m < expected.micro.size(); ++m)
        ASSERT_TRUE(torch::equal(got[t][i].micro[m].inputs, expected.micro[m].inputs)) << t << " " << i;
    }
}

}  // namespace
}  // namespace gradguard::data
