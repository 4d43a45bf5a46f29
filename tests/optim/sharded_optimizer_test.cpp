// The sharded optimizer against the replicated one. References: GroupAdamW (itself checked
// against torch.optim.AdamW in adamw_test.cpp) for the arithmetic -- a shard's update must
// equal the whole tensor's on those elements, bit for bit -- and the ZeRO paper's
// arithmetic (arXiv 1910.02054 §5.1) for what each rank holds: 8 S bytes of moments,
// S = ceil(P / W). Several ranks run as threads of this process, joined by an in-memory
// all-gather, so the layout logic is tested without sockets (tests/e2e/zero_cli_test.cpp
// runs real Gloo ranks).
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/sharded_optimizer.h"

namespace gradguard::optim {
namespace {

// Tensors of awkward sizes so shards cut through them: a matrix, a vector, a matrix.
NamedParameters make_params(int64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  NamedParameters p = {{"a.weight", torch::randn({7, 5}) * 0.02},
                       {"a.norm", torch::ones({5})},
                       {"b.weight", torch::randn({3, 11}) * 0.02}};
  for (auto& [name, t] : p) t = t.to(dtype).set_requires_grad(true);
  return p;
}

// The same gradients for every copy: step s, tensor i.
at::Tensor grad_for(int64_t s, size_t i, const at::Tensor& like) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + static_cast<int64_t>(i));
  return at::randn(like.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat)).to(like.scalar_type());
}

void set_grads(NamedParameters& p, int64_t s) {
  for (size_t i = 0; i < p.size(); ++i) p[i].second.mutable_grad() = grad_for(s, i, p[i].second);
}

OptimOptions adamw(double lr = 1e-2) {
  OptimOptions o;
  o.lr = lr;
  o.weight_decay = 0.1;
  o.implementation = AdamWImplementation::kForeach;
  return o;
}

// An all-gather between threads of this process: every rank deposits its input, waits
// for all, then copies everyone's.
class LocalGroup {
 public:
  explicit LocalGroup(int64_t world) : inputs_(world) {}
  AllGather gather_for(int64_t rank) {
    return [this, rank](const at::Tensor& mine, std::vector<at::Tensor>& all) {
      std::unique_lock<std::mutex> lock(mu_);
      const int64_t round = round_;
      inputs_[rank] = mine.clone();
      if (++arrived_ == static_cast<int64_t>(inputs_.size())) {
        snapshot_ = inputs_;
        arrived_ = 0;
        ++round_;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&] { return round_ != round; });
      }
      for (size_t r = 0; r < all.size(); ++r) all[r].copy_(snapshot_[r]);
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<at::Tensor> inputs_, snapshot_;
  int64_t arrived_ = 0, round_ = 0;
};

// `steps` steps of W ranks (threads), each with its own copy of the parameters; returns
// every rank's parameters.
std::vector<NamedParameters> run_ranks(int64_t world, int steps, const OptimOptions& o, bool masters = false,
                                       bool offload = false, int64_t chunk_bytes = int64_t{32} << 20) {
  LocalGroup group(world);
  std::vector<NamedParameters> params;
  for (int64_t r = 0; r < world; ++r) params.push_back(make_params(1));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ShardingOptions sh;
      sh.rank = r, sh.world_size = world, sh.master_weights = masters, sh.offload = offload;
      sh.gather_chunk_bytes = chunk_bytes;
      ShardedOptimizer opt(params[r], o, sh, group.gather_for(r));
      for (int s = 0; s < steps; ++s) {
        set_grads(params[r], s);
        opt.step();
      }
    });
  }
  for (auto& t : threads) t.join();
  return params;
}

NamedParameters run_replicated(int steps, const OptimOptions& o) {
  auto p = make_params(1);
  auto opt = make_optimizer(p, o);
  for (int s = 0; s < steps; ++s) {
    set_grads(p, s);
    opt->step();
  }
  return p;
}

TEST(ShardLayout, EveryElementBelongsToExactlyOneRank) {
  // P = 35 + 5 + 33 = 73 over 3 ranks: S = 25, the last rank 23 + 2 padding.
  const auto l = ShardLayout::make({35, 5, 33}, 3);
  EXPECT_EQ(l.total, 73);
  EXPECT_EQ(l.shard_size, 25);
  EXPECT_EQ(l.begin(2), 50);
  EXPECT_EQ(l.end(2), 73);
  std::vector<int> owners(73, 0);
  for (int64_t r = 0; r < 3; ++r) {
    int64_t in_shard = 0;
    for (const auto& s : l.segments(r)) {
      EXPECT_EQ(s.shard_offset, in_shard);
      in_shard += s.length;
      for (int64_t k = 0; k < s.length; ++k) ++owners[l.offsets[s.tensor] + s.offset + k];
    }
    EXPECT_EQ(in_shard, l.end(r) - l.begin(r));
  }
  for (int n : owners) EXPECT_EQ(n, 1);
  // Rank 0 ends inside tensor 0; rank 1 (25..49) holds its tail, all of tensor 1 and
  // the head of tensor 2 (which starts at 40).
  const auto mid = l.segments(1);
  ASSERT_EQ(mid.size(), 3u);
  const int64_t want[3][3] = {{0, 25, 10}, {1, 0, 5}, {2, 0, 10}};  // tensor, offset, length
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(static_cast<int64_t>(mid[k].tensor), want[k][0]);
    EXPECT_EQ(mid[k].offset, want[k][1]);
    EXPECT_EQ(mid[k].length, want[k][2]);
  }
  EXPECT_EQ(mid[2].shard_offset, 15);
  // More ranks than elements: the late ranks own nothing.
  const auto tiny = ShardLayout::make({2}, 4);
  EXPECT_EQ(tiny.shard_size, 1);
  EXPECT_TRUE(tiny.segments(3).empty());
  EXPECT_THROW(ShardLayout::make({2}, 0), Error);
}

TEST(ShardedOptimizer, OneRankEqualsGroupAdamWBitForBit) {
  for (auto name : {OptimizerKind::kAdamW, OptimizerKind::kAdamAtan2}) {
    auto o = adamw();
    o.name = name;
    const auto want = run_replicated(5, o);
    const auto got = run_ranks(1, 5, o);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[0][i].second, want[i].second)) << i;
  }
  // Update clipping is per tensor: with one rank every tensor is whole, so it applies.
  auto o = adamw();
  o.update_clipping = true;
  const auto want = run_replicated(5, o);
  const auto got = run_ranks(1, 5, o);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[0][i].second, want[i].second)) << i;
}

TEST(ShardedOptimizer, TwoAndThreeRanksEqualTheReplicatedRunOnEveryRank) {
  const auto o = adamw();
  const auto want = run_replicated(6, o);
  for (int64_t world : {2, 3}) {
    // One all-gather of the whole shard, and chunks of 3 elements (12 bytes) that cut
    // through segments.
    for (int64_t chunk : {int64_t{32} << 20, int64_t{12}}) {
      const auto got = run_ranks(world, 6, o, false, false, chunk);
      for (int64_t r = 0; r < world; ++r)
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_TRUE(torch::equal(got[r][i].second, want[i].second))
              << "world " << world << " rank " << r << " tensor " << i << " chunk " << chunk;
    }
  }
}

TEST(ShardedOptimizer, OffloadAndMastersEqualTheRunWithout) {
  // On the CPU offloading is the same arithmetic on a host copy: exactly equal.
  const auto o = adamw();
  const auto want = run_ranks(2, 5, o);
  const auto got = run_ranks(2, 5, o, /*masters=*/false, /*offload=*/true);
  for (size_t i = 0; i < want[0].size(); ++i) EXPECT_TRUE(torch::equal(got[0][i].second, want[0][i].second)) << i;
}

TEST(ShardedOptimizer, EachRankHoldsItsShardOfTheState) {
  auto p = make_params(1);  // P = 73
  for (int64_t world : {1, 2, 3}) {
    for (int64_t r = 0; r < world; ++r) {
      ShardingOptions sh;
      sh.rank = r, sh.world_size = world;
      auto gather = [](const at::Tensor&, std::vector<at::Tensor>&) {};
      ShardedOptimizer opt(p, adamw(), sh, gather);
      const int64_t S = (73 + world - 1) / world;
      EXPECT_EQ(opt.state_bytes(), S * 8) << world;  // m and v, float32, padding included
      sh.master_weights = true;
      ShardedOptimizer with_masters(p, adamw(), sh, gather);
      EXPECT_EQ(with_masters.state_bytes(), S * 12) << world;
    }
  }
}

TEST(ShardedOptimizer, Bf16MastersTrackFloat32WherePureBf16LosesTheUpdates) {
  // Mixed precision's reason to exist (Micikevicius et al. 2017): at lr 1e-5 an Adam
  // update (~lr per step) is below half the bf16 spacing of every weight above 2^-8 in
  // magnitude (bf16 spaces [2^e, 2^(e+1)) by 2^(e-7): 1.2e-4 near 0.02), so pure bf16
  // weights round most updates away; float32 masters keep them all.
  const auto o = adamw(1e-5);
  const int steps = 20;
  auto fp32 = make_params(1);
  auto pure = make_params(1, torch::kBFloat16);
  auto mixed = make_params(1, torch::kBFloat16);
  const auto start = make_params(1, torch::kBFloat16);
  auto opt32 = make_optimizer(fp32, o);
  auto opt_pure = make_optimizer(pure, o);  // torch.optim.AdamW on bf16 parameters
  ShardingOptions sh;
  sh.master_weights = true;
  ShardedOptimizer opt_mixed(mixed, o, sh);
  for (int s = 0; s < steps; ++s) {
    set_grads(fp32, s), set_grads(pure, s), set_grads(mixed, s);
    opt32->step(), opt_pure->step(), opt_mixed.step();
  }
  // The matrices (|w| ~ 0.02); the norm weights at 1.0 are coarser still. How far each
  // run moved from its start, against how far the float32 run moved.
  const auto fp32_start = make_params(1);
  for (size_t i : {0u, 2u}) {
    const auto moved32 = (fp32[i].second - fp32_start[i].second).flatten();
    EXPECT_TRUE((moved32 != 0).all().item<bool>());  // float32 moves every weight
    auto error = [&](const at::Tensor& now) {
      const auto moved = (now.flatten().to(torch::kFloat) - start[i].second.flatten().to(torch::kFloat));
      return (moved - moved32).norm().item<double>() / moved32.norm().item<double>();
    };
    const double changed = (pure[i].second != start[i].second).to(torch::kFloat).mean().item<double>();
    EXPECT_LT(changed, 0.25) << "pure bf16 kept most updates of tensor " << i;
    EXPECT_GT(error(pure[i].second), 0.5) << "tensor " << i;
    // The masters follow the float32 run (same gradients up to their bf16 rounding).
    const auto master = opt_mixed.master().narrow(0, opt_mixed.layout().offsets[i], fp32[i].second.numel());
    EXPECT_LT(error(master), 0.02) << "tensor " << i;
    // And the bf16 working weights are the masters rounded.
    EXPECT_TRUE(torch::equal(mixed[i].second.flatten(), master.to(torch::kBFloat16)));
  }
}

TEST(ShardedOptimizer, ResetMomentsRestartsOneTensorOnEveryRank) {
  auto p = make_params(1);
  ShardedOptimizer opt(p, adamw(), {});
  set_grads(p, 0);
  opt.step();
  EXPECT_EQ(opt.moments(0).step, 1);
  EXPECT_TRUE(opt.moments(0).exp_avg.defined());
  EXPECT_EQ(opt.moments(0).exp_avg.sizes(), p[0].second.sizes());
  EXPECT_TRUE(opt.reset_moments(0));
  EXPECT_EQ(opt.moments(0).step, 0);
  EXPECT_EQ(opt.exp_avg().narrow(0, 0, 35).abs().sum().item<double>(), 0.0);
  EXPECT_GT(opt.exp_avg().narrow(0, 35, 5).abs().sum().item<double>(), 0.0);  // tensor 1 untouched
  EXPECT_FALSE(opt.reset_moments(0));
}

TEST(ShardedOptimizer, RefusesWhatNeedsWholeTensors) {
  auto p = make_params(1);
  auto gather = [](const at::Tensor&, std::vector<at::Tensor>&) {};
  ShardingOptions two;
  two.world_size = 2;
  for (auto name : {OptimizerKind::kLamb, OptimizerKind::kLars}) {
    auto o = adamw();
    o.name = name;
    try {
      ShardedOptimizer opt(p, o, two, gather);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "optim.name");
    }
  }
  auto o = adamw();
  o.update_clipping = true;
  try {
    ShardedOptimizer opt(p, o, two, gather);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "optim.update_clipping");
  }
  MemoryOptions m;
  m.zero_stage = 3;
  try {
    m.validate();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "memory.zero_stage");
  }
}

}  // namespace
}  // namespace gradguard::optim
