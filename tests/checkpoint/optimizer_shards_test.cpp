// Shard files of the sharded optimizer: a state saved by W ranks reloads, bit for bit,
// into any other number of ranks (each rank's new range cut out of the old shards); a
// layout of another model, a missing or malformed shard and an unlisted layout file are
// refused naming the file. The ranks are ShardedOptimizer objects of one process: loading
// needs no collective, so no process group is involved.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <torch/torch.h>

#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "test_util.h"

namespace gradguard::checkpoint {
namespace {
using ::testing::HasSubstr;

optim::NamedParameters params(int64_t extra = 0) {
  torch::manual_seed(5);
  return {{"a.weight", torch::randn({7, 5}).set_requires_grad(true)},
          {"a.norm", torch::randn({5}).set_requires_grad(true)},
          {"b.weight", torch::randn({3, 11 + extra}).set_requires_grad(true)}};
}

std::unique_ptr<optim::ShardedOptimizer> rank_of(optim::NamedParameters& p, int64_t rank, int64_t world,
                                                 bool masters = false) {
  optim::ShardingOptions sh;
  sh.rank = rank, sh.world_size = world, sh.master_weights = masters;
  return std::make_unique<optim::ShardedOptimizer>(p, optim::OptimOptions(), sh,
                                                   [](const at::Tensor&, std::vector<at::Tensor>&) {});
}

// Saves a W-rank state whose flat element k holds k (m), -k (v) and 1000 + k (masters),
// with update counts {3, 3, 2}.
void save_state(const std::string& dir, int64_t world, bool masters) {
  auto p = params();
  for (int64_t r = 0; r < world; ++r) {
    auto opt = rank_of(p, r, world, masters);
    const auto& l = opt->layout();
    const auto k = torch::arange(l.begin(r), l.begin(r) + l.shard_size, torch::kFloat);
    opt->exp_avg().copy_(k);
    opt->exp_avg_sq().copy_(-k);
    if (masters) opt->master().copy_(k + 1000);
    opt->steps() = {3, 3, 2};
    save_optimizer_shard(dir + "/" + optimizer_shard_file(r, world), *opt);
    if (r == 0) test::write_text(dir + "/" + kOptimizerShardsLayout, optimizer_shards_layout(*opt).dump());
  }
}

TEST(OptimizerShards, ReloadIntoAnyWorldSizeBitForBit) {
  for (int64_t saved : {1, 2, 3}) {
    for (int64_t loaded : {1, 2, 3, 4}) {
      test::TempDir dir;
      save_state(dir.path(), saved, true);
      auto p = params();
      for (int64_t r = 0; r < loaded; ++r) {
        auto opt = rank_of(p, r, loaded, true);
        load_optimizer_shards(dir.path(), *opt);
        const auto& l = opt->layout();
        const int64_t n = l.end(r) - l.begin(r);
        const auto k = torch::arange(l.begin(r), l.end(r), torch::kFloat);
        EXPECT_TRUE(torch::equal(opt->exp_avg().narrow(0, 0, n), k)) << saved << " -> " << loaded << " rank " << r;
        EXPECT_TRUE(torch::equal(opt->exp_avg_sq().narrow(0, 0, n), -k));
        EXPECT_TRUE(torch::equal(opt->master().narrow(0, 0, n), k + 1000));
        EXPECT_EQ(opt->steps(), (std::vector<int64_t>{3, 3, 2}));
      }
    }
  }
}

TEST(OptimizerShards, MastersGoIntoTheWeightsOfARunWithoutThem) {
  // A run that kept float32 masters (bf16 weights, or offload) resumed with plain fp32
  // weights: the masters are the weights to continue from, every element of them.
  test::TempDir dir;
  save_state(dir.path(), 2, true);
  auto p = params();
  auto opt = rank_of(p, 0, 3, /*masters=*/false);
  load_optimizer_shards(dir.path(), *opt);
  const auto flat = torch::cat({p[0].second.detach().flatten(), p[1].second.detach().flatten(),
                                p[2].second.detach().flatten()});
  EXPECT_TRUE(torch::equal(flat, torch::arange(0, 73, torch::kFloat) + 1000));
  // And the reverse: a state without masters takes them from the weights.
  test::TempDir plain;
  save_state(plain.path(), 2, false);
  auto q = params();
  auto with = rank_of(q, 0, 1, /*masters=*/true);
  with->master().zero_();
  load_optimizer_shards(plain.path(), *with);
  EXPECT_TRUE(torch::equal(with->master().narrow(0, 0, 35), q[0].second.detach().flatten()));
}

TEST(OptimizerShards, MasterWeightsAreGatheredFromEveryShardByName) {
  for (int64_t world : {1, 3}) {
    test::TempDir dir;
    save_state(dir.path(), world, true);
    const auto masters = load_master_weights(dir.path());
    ASSERT_EQ(masters.size(), 3u);
    // Flat element k of the whole state holds 1000 + k: a.weight [0, 35), a.norm [35, 40), b.weight [40, 73).
    EXPECT_EQ(masters[0].first, "a.weight");
    EXPECT_TRUE(torch::equal(masters[0].second, torch::arange(0, 35, torch::kFloat) + 1000)) << world;
    EXPECT_EQ(masters[1].first, "a.norm");
    EXPECT_TRUE(torch::equal(masters[1].second, torch::arange(35, 40, torch::kFloat) + 1000)) << world;
    EXPECT_EQ(masters[2].first, "b.weight");
    EXPECT_TRUE(torch::equal(masters[2].second, torch::arange(40, 73, torch::kFloat) + 1000)) << world;
  }
  // A state without masters, or no sharded state at all: none.
  test::TempDir plain, empty;
  save_state(plain.path(), 2, false);
  EXPECT_TRUE(load_master_weights(plain.path()).empty());
  EXPECT_TRUE(load_master_weights(empty.path()).empty());
  // A missing shard is named.
  test::TempDir broken;
  save_state(broken.path(), 2, true);
  std::filesystem::remove(broken.file(optimizer_shard_file(1, 2)));
  EXPECT_THAT(test::bad_input_message([&] { load_master_weights(broken.path()); }),
              HasSubstr(optimizer_shard_file(1, 2) + ": missing"));
}

TEST(OptimizerShards, AnotherModelOrABrokenShardIsRefusedNamingTheFile) {
  test::TempDir dir;
  save_state(dir.path(), 2, false);
  auto other = params(/*extra=*/1);  // b.weight is [3, 12]
  auto opt = rank_of(other, 0, 2);
  auto message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *opt); });
  EXPECT_THAT(message, HasSubstr(kOptimizerShardsLayout));
  EXPECT_THAT(message, HasSubstr("another model"));

  auto p = params();
  auto mine = rank_of(p, 1, 2);
  std::filesystem::remove(dir.file(optimizer_shard_file(1, 2)));
  message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *mine); });
  EXPECT_THAT(message, HasSubstr(optimizer_shard_file(1, 2)));
  EXPECT_THAT(message, HasSubstr("missing"));

  // A shard of the wrong length.
  save_safetensors(dir.file(optimizer_shard_file(1, 2)), {{"exp_avg", torch::zeros({5})}, {"exp_avg_sq", torch::zeros({5})}});
  message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *mine); });
  EXPECT_THAT(message, HasSubstr("37 elements"));

  // A layout whose shard size does not follow from its total.
  auto layout = read_json_file(dir.file(kOptimizerShardsLayout));
  layout["shard_size"] = 36;
  test::write_text(dir.file(kOptimizerShardsLayout), layout.dump());
  message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *mine); });
  EXPECT_THAT(message, HasSubstr("shard_size"));
}

TEST(OptimizerShards, ASwappedOrForeignShardIsRefused) {
  // Two shards swapped, their checksums made to agree: each records its rank and layout,
  // so loading names the file instead of stepping another rank's moments.
  test::TempDir dir;
  save_state(dir.path(), 2, false);
  const auto f0 = dir.file(optimizer_shard_file(0, 2)), f1 = dir.file(optimizer_shard_file(1, 2));
  std::filesystem::rename(f0, dir.file("x"));
  std::filesystem::rename(f1, f0);
  std::filesystem::rename(dir.file("x"), f1);
  auto p = params();
  auto mine = rank_of(p, 0, 2);
  auto message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *mine); });
  EXPECT_THAT(message, HasSubstr(optimizer_shard_file(0, 2) + ": records rank 1 where this file"));
  // A shard of another layout (a different model) in the right place.
  auto q = params(/*extra=*/1);
  auto foreign = rank_of(q, 1, 2);
  save_state(dir.path(), 2, false);
  save_optimizer_shard(f1, *foreign);
  auto second = rank_of(p, 1, 2);
  message = test::bad_input_message([&] { load_optimizer_shards(dir.path(), *second); });
  EXPECT_THAT(message, HasSubstr("records layout"));
}

TEST(OptimizerShards, OnlyShardFileNamesAreAccepted) {
  EXPECT_TRUE(is_optimizer_shard_file("optimizer-shard-00001-of-00002.safetensors"));
  EXPECT_TRUE(is_optimizer_shard_file("optimizer_shards.json"));
  EXPECT_FALSE(is_optimizer_shard_file("../optimizer-shard-00001-of-00002.safetensors"));
  EXPECT_FALSE(is_optimizer_shard_file("optimizer-shard-1-of-2.safetensors"));
  EXPECT_FALSE(is_optimizer_shard_file("model.safetensors"));
}

}  // namespace
}  // namespace gradguard::checkpoint
