// TokenDataset: the sample order (sequential with wrap-around, or a seeded permutation
// per epoch), exact batch contents against hand-computed tokens, and the bad-input
// errors of DataOptions and of a file too short for one sample.
#include "gradguard/data/token_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::data {
namespace {

using ::testing::HasSubstr;

using test::bad_input_message;

// A token file holding 100, 101, ..., 100+n-1, so a token tells its own position.
std::shared_ptr<const TokenFile> counting_file(const test::TempDir& dir, int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(100 + i);
  const std::string path = dir.file("tokens.bin");
  write_token_file(path, tokens);
  return std::make_shared<const TokenFile>(path, 0);
}

// Offsets of the N samples of epoch `epoch`, in consumption order.
std::vector<int64_t> epoch_offsets(const TokenDataset& ds, int64_t epoch) {
  std::vector<int64_t> offsets;
  for (int64_t k = epoch * ds.num_samples(); k < (epoch + 1) * ds.num_samples(); ++k) {
    offsets.push_back(ds.sample_offset(k));
  }
  return offsets;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(DataOptions, DefaultsAreValid) {
  EXPECT_NO_THROW(DataOptions().validate());
}

TEST(DataOptions, SeqLenBelowOneIsBadInput) {
  DataOptions options;
  options.seq_len = 0;
  const std::string msg = bad_input_message([&] { options.validate(); });
  EXPECT_THAT(msg, HasSubstr("data.seq_len"));
  EXPECT_THAT(msg, HasSubstr("must be >= 1"));
  EXPECT_THAT(msg, HasSubstr("got 0"));
}

TEST(DataOptions, EmptyTrainPathIsBadInput) {
  DataOptions options;
  options.train_path = "";
  const std::string msg = bad_input_message([&] { options.validate(); });
  EXPECT_THAT(msg, HasSubstr("data.train_path"));
  EXPECT_THAT(msg, HasSubstr("empty path"));
}

TEST(TokenDataset, FileShorterThanOneSampleIsBadInput) {
  test::TempDir dir;
  auto file = counting_file(dir, 4);
  const std::string msg = bad_input_message([&] { TokenDataset ds(file, 4, false, 0); });
  EXPECT_THAT(msg, HasSubstr(file->path()));
  EXPECT_THAT(msg, HasSubstr("holds 4 tokens, fewer than the seq_len+1 = 5"));
  EXPECT_NO_THROW(TokenDataset(file, 3, false, 0));  // exactly T+1 tokens: one sample
}

TEST(TokenDataset, CountsWholeSamples) {
  test::TempDir dir;
  EXPECT_EQ(TokenDataset(counting_file(dir, 10), 3, false, 0).num_samples(), 3);  // (10-1)/3
  EXPECT_EQ(TokenDataset(counting_file(dir, 9), 3, false, 0).num_samples(), 2);   // (9-1)/3
  EXPECT_EQ(TokenDataset(counting_file(dir, 4), 3, false, 0).num_samples(), 1);
  EXPECT_EQ(TokenDataset(counting_file(dir, 4), 3, false, 0).seq_len(), 3);
}

TEST(TokenDataset, SequentialOrderWrapsAtTheEnd) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 10), 3, false, 0);  // N = 3
  const std::vector<int64_t> expected = {0, 3, 6, 0, 3, 6, 0, 3};
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(ds.sample_offset(k), expected[k]) << "k=" << k;
  EXPECT_EQ(ds.sample_offset(3000001), 3);
}

TEST(TokenDataset, BatchHoldsTheHandComputedTokens) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 10), 3, false, 0);  // tokens 100..109, N = 3
  const Batch b = ds.batch(2, 2);                        // samples 2, 3 -> offsets 6, 0
  EXPECT_EQ(b.inputs.dtype(), torch::kInt64);
  EXPECT_EQ(b.targets.dtype(), torch::kInt64);
  EXPECT_TRUE(b.inputs.device().is_cpu());
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_vector(b.inputs), (std::vector<int64_t>{106, 107, 108, 100, 101, 102}));
  EXPECT_EQ(to_vector(b.targets), (std::vector<int64_t>{107, 108, 109, 101, 102, 103}));
}

TEST(TokenDataset, BatchOfExplicitSamples) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 9), 2, false, 0);      // N = 4
  const Batch b = ds.batch(std::vector<int64_t>{5, 0, 3});  // offsets 2, 0, 6
  EXPECT_EQ(to_vector(b.inputs), (std::vector<int64_t>{102, 103, 100, 101, 106, 107}));
  EXPECT_EQ(to_vector(b.targets), (std::vector<int64_t>{103, 104, 101, 102, 107, 108}));
  EXPECT_TRUE(torch::equal(ds.batch(1, 2).inputs, ds.batch(std::vector<int64_t>{1, 2}).inputs));
}

TEST(TokenDataset, ShuffleIsAPermutationInEveryEpoch) {
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 101), 2, true, 42);  // N = 50
  ASSERT_EQ(ds.num_samples(), 50);
  std::vector<int64_t> all_offsets;
  for (int64_t s = 0; s < 50; ++s) all_offsets.push_back(s * 2);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> offsets = epoch_offsets(ds, epoch);
    EXPECT_NE(offsets, all_offsets) << "epoch " << epoch << " is not shuffled";
    std::sort(offsets.begin(), offsets.end());
    EXPECT_EQ(offsets, all_offsets) << "epoch " << epoch;
  }
}

TEST(TokenDataset, ShuffleDiffersBetweenEpochsAndSeeds) {
  test::TempDir dir;
  auto file = counting_file(dir, 101);
  TokenDataset a(file, 2, true, 42);
  TokenDataset b(file, 2, true, 43);
  TokenDataset high(file, 2, true, 42 + (uint64_t{1} << 32));  // the seed's high half counts
  EXPECT_NE(epoch_offsets(a, 0), epoch_offsets(a, 1));
  EXPECT_NE(epoch_offsets(a, 1), epoch_offsets(a, 2));
  EXPECT_NE(epoch_offsets(a, 0), epoch_offsets(b, 0));
  EXPECT_NE(epoch_offsets(a, 0), epoch_offsets(high, 0));
}

TEST(TokenDataset, ShuffleIsReproducibleAndOrderIndependent) {
  test::TempDir dir;
  auto file = counting_file(dir, 101);
  TokenDataset a(file, 2, true, 7);
  TokenDataset b(file, 2, true, 7);
  const std::vector<int64_t> a0 = epoch_offsets(a, 0);
  const std::vector<int64_t> a3 = epoch_offsets(a, 3);
  // Another instance, visiting the epochs in another order (as a resumed run would).
  EXPECT_EQ(epoch_offsets(b, 3), a3);
  EXPECT_EQ(epoch_offsets(b, 0), a0);
  EXPECT_EQ(epoch_offsets(a, 3), a3);
  // Within the batch, rows follow sample_offset.
  const Batch batch = a.batch(48, 4);  // spans the epoch 0 / epoch 1 boundary
  std::vector<int64_t> expected;
  for (int64_t k = 48; k < 52; ++k) {
    expected.push_back(100 + a.sample_offset(k));
    expected.push_back(101 + a.sample_offset(k));
  }
  EXPECT_EQ(to_vector(batch.inputs), expected);
}

TEST(TokenDataset, ShuffleOrderIsFrozen) {
  // The permutation for seed 42, N = 10, epochs 0 and 1, as this implementation (mt19937_64,
  // seed_seq, Fisher-Yates with rejection draws) produces it on every platform. A change
  // here changes the data order of every existing run and breaks exact resume.
  test::TempDir dir;
  TokenDataset ds(counting_file(dir, 11), 1, true, 42);
  ASSERT_EQ(ds.num_samples(), 10);
  EXPECT_EQ(epoch_offsets(ds, 0), (std::vector<int64_t>{0, 6, 5, 1, 3, 9, 7, 8, 4, 2}));
  EXPECT_EQ(epoch_offsets(ds, 1), (std::vector<int64_t>{3, 8, 9, 4, 7, 2, 1, 0, 5, 6}));
}

}  // namespace
}  // namespace gradguard::data
