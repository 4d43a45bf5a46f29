// The guard's statistics and AGC on a gradient sharded over ranks (ZeRO-2), against the
// same computation on the whole gradient (GradStatsComputer + Clipper's device hook, the
// unsharded path). W ranks are W threads here, each holding its parts of a flat layout
// (optim::ShardLayout) and meeting the others in one summing collective: a mutex, a
// condition variable and a float64 accumulator. Shapes are chosen so that boundaries cut
// weight rows, and the gradient has rows far above AGC's limit so the clip does work.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "gradguard/core/host_read.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/optim/sharded_optimizer.h"

namespace gradguard::grad {
namespace {

// Sums each rank's vector over `ranks` threads, in place, once per call on every rank.
class ThreadSum {
 public:
  explicit ThreadSum(int ranks) : ranks_(ranks) {}
  void operator()(at::Tensor& v) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = round_;
    sum_ = sum_.defined() ? sum_ + v : v.clone();
    if (++arrived_ == ranks_) {
      result_ = sum_, sum_ = at::Tensor(), arrived_ = 0, ++round_, ++calls_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    v.copy_(result_);
  }
  int64_t calls() const { return calls_; }

 private:
  int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  at::Tensor sum_, result_;
  int arrived_ = 0;
  int64_t round_ = 0, calls_ = 0;
};

struct Model {
  std::vector<at::Tensor> params, grads;
  std::vector<std::string> names = {"layers.0.q.weight", "layers.0.norm.weight", "layers.1.up.weight",
                                    "layers.1.down.weight", "lm_head.weight"};
  Model() {
    torch::manual_seed(7);
    const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {5}, {9, 6}, {6, 9}, {4, 5}};
    for (const auto& s : shapes) {
      params.push_back(torch::randn(s) * 0.1);
      auto g = torch::randn(s) * 0.01;
      if (g.dim() == 2) g[1].mul_(100.0f);  // one row per matrix far above agc_lambda x ||W_row||
      grads.push_back(g);
    }
  }
};

struct Whole {
  GradStats stats;
  std::vector<at::Tensor> clipped;
};

// The unsharded path: .grad whole, AGC (if asked) as the device hook.
Whole whole(const Model& m, const ClipOptions& clip, double inv_scale, const at::Tensor& side) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < m.params.size(); ++i) {
    params.push_back(m.params[i].clone());
    params.back().mutable_grad() = m.grads[i].clone();
  }
  GradStatsComputer stats(params, m.names);
  Clipper clipper(clip, params, m.names);
  Whole out;
  out.stats = stats.compute(inv_scale, side, clipper.device_hook());
  for (const auto& p : params) out.clipped.push_back(p.grad());
  return out;
}

struct Sharded {
  std::vector<GradStats> stats;   // [rank]
  std::vector<at::Tensor> whole;  // [tensor] the ranks' clipped parts put back together
  int64_t collectives = 0;
  std::vector<int64_t> reads;  // [rank] device->host reads of its compute()
};

Sharded sharded(const Model& m, const ClipOptions& clip, int ranks, double inv_scale, const at::Tensor& side,
                int inf_rank = -1) {
  std::vector<int64_t> numels;
  for (const auto& p : m.params) numels.push_back(p.numel());
  const auto layout = optim::ShardLayout::make(numels, ranks);
  // Each rank's shard of the gradient: its segments copied out of the whole one.
  std::vector<at::Tensor> shards;
  std::vector<ShardedGradients> inputs(ranks);
  ThreadSum sum(ranks);
  for (int r = 0; r < ranks; ++r) {
    shards.push_back(torch::zeros({layout.shard_size}));
    auto& in = inputs[r];
    in.parts.assign(m.params.size(), torch::empty({0}));
    in.offsets.assign(m.params.size(), 0);
    for (const auto& s : layout.segments(r)) {
      in.parts[s.tensor] = shards[r].narrow(0, s.shard_offset, s.length);
      in.parts[s.tensor].copy_(m.grads[s.tensor].reshape({-1}).narrow(0, s.offset, s.length));
      in.offsets[s.tensor] = s.offset;
    }
    in.cuts = layout.cuts();
    in.sum_over_ranks = [&sum](at::Tensor& v) { sum(v); };
    if (r == inf_rank && layout.end(r) > layout.begin(r)) shards[r][0] = std::numeric_limits<float>::infinity();
  }
  Sharded out;
  out.stats.resize(ranks);
  out.reads.assign(ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      GradStatsComputer stats(m.params, m.names);
      Clipper clipper(clip, m.params, m.names);
      stats.use_sharded(inputs[r]);
      clipper.use_gradients(inputs[r].parts);
      HostReadCounter reads;  // counts this thread's reads
      out.stats[r] = stats.compute(inv_scale, side, {}, clipper.row_clip());
      out.reads[r] = reads.count();
    });
  for (auto& t : threads) t.join();
  out.collectives = sum.calls();
  for (size_t t = 0; t < m.params.size(); ++t) {
    auto flat = torch::zeros({m.params[t].numel()});
    for (int r = 0; r < ranks; ++r)
      for (const auto& s : layout.segments(r))
        if (s.tensor == t) flat.narrow(0, s.offset, s.length).copy_(inputs[r].parts[t]);
    out.whole.push_back(flat.view(m.params[t].sizes()));
  }
  return out;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(a), 1e-30); }

TEST(ShardedStats, EveryRankGetsTheWholeGradientsStatisticsInOneCollective) {
  const Model m;
  ClipOptions none;
  none.strategy = ClipStrategy::kNone;
  const auto side = torch::tensor({2.5f, -1.0f});
  const auto ref = whole(m, none, 0.5, side);
  for (int ranks : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const auto got = sharded(m, none, ranks, 0.5, side);
    EXPECT_EQ(got.collectives, 1);
    EXPECT_EQ(got.reads, std::vector<int64_t>(ranks, 1));  // one host read per rank
    for (const auto& s : got.stats) {
      EXPECT_LT(rel(ref.stats.global_norm, s.global_norm), 1e-6);
      EXPECT_EQ(s.norm_after_device_clip, s.global_norm);
      for (size_t i = 0; i < m.params.size(); ++i) EXPECT_LT(rel(ref.stats.tensor_norms[i], s.tensor_norms[i]), 1e-6);
      for (size_t k = 0; k < ref.stats.layer_norms.size(); ++k)
        EXPECT_LT(rel(ref.stats.layer_norms[k], s.layer_norms[k]), 1e-6);
      // The side values are summed over the ranks.
      ASSERT_EQ(s.side.size(), 2u);
      EXPECT_DOUBLE_EQ(s.side[0], 2.5 * ranks);
      EXPECT_DOUBLE_EQ(s.side[1], -1.0 * ranks);
      EXPECT_FALSE(s.nonfinite);
    }
    // Unscaled in place, on each rank's parts.
    for (size_t i = 0; i < m.params.size(); ++i) EXPECT_TRUE(torch::allclose(got.whole[i], m.grads[i] * 0.5));
  }
}

TEST(ShardedStats, AgcOnShardsClipsEveryRowAsTheWholeGradientIsClipped) {
  const Model m;
  ClipOptions agc;
  agc.strategy = ClipStrategy::kAgc;
  agc.agc_lambda = 0.05;
  const auto ref = whole(m, agc, 1.0, {});
  ASSERT_LT(ref.stats.norm_after_device_clip, 0.5 * ref.stats.global_norm);  // the clip did work
  for (int ranks : {2, 3, 4, 7}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::vector<int64_t> numels;
    for (const auto& p : m.params) numels.push_back(p.numel());
    // The cases cut weight rows (what the collective's cut-row slots are for).
    int64_t cut_rows = 0;
    for (const auto& [t, at] : optim::ShardLayout::make(numels, ranks).cuts())
      cut_rows += m.params[t].dim() == 2 && at % m.params[t].size(1) != 0 ? 1 : 0;
    EXPECT_GT(cut_rows, 0);
    const auto got = sharded(m, agc, ranks, 1.0, {});
    EXPECT_EQ(got.collectives, 1);
    for (const auto& s : got.stats) {
      EXPECT_LT(rel(ref.stats.global_norm, s.global_norm), 1e-6);
      EXPECT_LT(rel(ref.stats.norm_after_device_clip, s.norm_after_device_clip), 1e-6);
    }
    for (size_t i = 0; i < m.params.size(); ++i)
      EXPECT_TRUE(torch::allclose(got.whole[i], ref.clipped[i], 1e-6, 1e-9)) << m.names[i];
  }
}

TEST(ShardedStats, AnInfOnOneRanksPartIsSeenByEveryRank) {
  const Model m;
  ClipOptions clip;
  for (int inf_rank : {0, 2}) {
    const auto got = sharded(m, clip, 3, 1.0, {}, inf_rank);
    for (const auto& s : got.stats) EXPECT_TRUE(s.nonfinite) << "inf on rank " << inf_rank;
  }
}

}  // namespace
}  // namespace gradguard::grad
