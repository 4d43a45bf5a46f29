// AdamW whose state is split over the ranks of a data-parallel run (ZeRO stage 1,
// Rajbhandari et al. 2019, arXiv 1910.02054 §5.1), optionally with float32 master weights
// for low-precision working weights (mixed precision, Micikevicius et al. 2017) and with
// that state in host memory (ZeRO-Offload, Ren et al. 2021).
//
// The all-gather runs in chunks of at most 4 MiB per buffer (gather_chunk_bytes): its
// W + 1 buffers exist only while it runs and stay small next to what sharding saves
// (bench/results/zero_memory.md: 32 MiB chunks ate most of the saving on a 32M model).
//
// Layout. The trainable tensors, in parameter order, are laid end to end: P elements.
// Every rank owns the same number S = ceil(P / W) of them (W ranks); rank r owns the
// flat range [r S, min((r + 1) S, P)), the last rank's shard is padded up to S. A rank
// keeps, for its range only, the AdamW moments m and v (float32, S each: 8 S bytes) and,
// with master weights, a float32 copy of the weights (4 S bytes). A tensor may straddle
// two ranks; each keeps the part in its range (a "segment").
//
// Step. Gradients arrive summed over the ranks: whole in .grad (ZeRO-1: dist/grad_sync.h
// all-reduces them, so the guard measures and clips the whole gradient as without
// sharding), or as this rank's [S] shard (ZeRO-2: dist/grad_shard_sync.h reduces
// each piece to its owner; the guard measures and clips the shards, grad/grad_stats.h). Each rank updates its
// segments with the same AdamW arithmetic as GroupAdamW (optim/adamw.h: the ops are
// elementwise, so a segment's update equals the whole tensor's on those elements, bit
// for bit), copies the result into the working weights (rounded to their dtype) and an
// all-gather brings every rank's updated range to all: S working-dtype elements per rank
// and step, in chunks; with one rank there is nothing to gather.
//
// Per-tensor bookkeeping that must agree on every rank -- each tensor's update count,
// which bias correction uses -- is kept for every tensor on every rank, so a rank that
// holds none of a tensor still counts its updates.
//
// Offload. With `offload` the moments and masters live in host memory: the segment of
// the gradient is copied to the host, stepped there on the CPU's threads, and the result
// copied back. On a CPU run the copies are no-ops in effect and the path is the same.
// The host step is not overlapped with the next step's compute yet.
//
// Limits, refused where the configuration is read (config/config.cpp): LAMB and LARS
// (their trust ratio needs whole tensors), update clipping with more than one rank (its
// RMS is per tensor).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "gradguard/optim/adamw.h"
#include "gradguard/optim/memory_options.h"
#include "gradguard/optim/optimizer.h"

namespace gradguard::optim {

// The flat layout of P elements over W ranks.
struct ShardLayout {
  struct Segment {
    size_t tensor = 0;          // index into the tensor list
    int64_t offset = 0;         // first element within the tensor
    int64_t length = 0;         // elements
    int64_t shard_offset = 0;   // first element within the rank's shard
  };
  int64_t world_size = 1;
  int64_t total = 0;               // P
  int64_t shard_size = 0;          // S = ceil(P / W) (0 when P = 0)
  std::vector<int64_t> numels;     // [tensor]
  std::vector<int64_t> offsets;    // [tensor] first element in the flat order

  // Throws gradguard::Error (bad input, "dist.world_size") for world_size < 1.
  static ShardLayout make(std::vector<int64_t> numels, int64_t world_size);
  int64_t begin(int64_t rank) const;  // first flat element of `rank` (clamped to P)
  int64_t end(int64_t rank) const;    // one past its last (clamped to P)
  std::vector<Segment> segments(int64_t rank) const;  // in flat order
  // The rank boundaries that fall inside a tensor (not at its start), as (tensor, element
  // within it), in flat order: where a tensor is cut between two ranks.
  std::vector<std::pair<size_t, int64_t>> cuts() const;
};

// Sends this rank's `mine` and fills all[r] (each shaped like `mine`) with rank r's.
using AllGather = std::function<void(const at::Tensor& mine, std::vector<at::Tensor>& all)>;

struct ShardingOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  bool master_weights = false;  // float32 masters (forced on with offload: the host keeps the weights)
  bool offload = false;         // moments and masters in host memory
  AdamWKernel kernel = AdamWKernel::foreach;
  int64_t gather_chunk_bytes = int64_t{4} << 20;  // largest all-gather buffer (send; receive per rank)
};

class ShardedOptimizer : public torch::optim::Optimizer {
 public:
  // `params` are the trainable tensors (contiguous, one dtype, one device); `options`
  // must be adamw or adam_atan2 (gradguard::Error naming optim.name otherwise).
  // `all_gather` is required when world_size > 1.
  ShardedOptimizer(const NamedParameters& params, const OptimOptions& options, const ShardingOptions& sharding,
                   AllGather all_gather = {});

  // ZeRO stage 2: from now on step from `shard` ([S], this rank's part of the summed
  // gradient, dist/grad_shard_sync.h) instead of the parameters' .grad.
  void use_gradient_shard(const at::Tensor& shard);

  // Steps this rank's segments of every tensor with a gradient, then all-gathers.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // The state is saved per rank (checkpoint/optimizer_shards.h); the LibTorch archive
  // holds only a marker, and loading one is refused.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  const ShardLayout& layout() const { return layout_; }
  const ShardingOptions& sharding() const { return sharding_; }
  const std::vector<std::string>& names() const { return names_; }
  bool decay_embeddings() const { return decay_embeddings_; }  // optim.decay_embeddings it was built with
  bool has_masters() const { return master_.defined(); }
  // Bytes of optimizer state this rank holds: moments (8 S) plus masters (4 S).
  int64_t state_bytes() const;

  // This rank's flat state ([S] float32 each; master undefined without masters) and every
  // tensor's update count ([tensor]), for checkpoints; writable.
  at::Tensor& exp_avg() { return exp_avg_; }
  at::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  at::Tensor& master() { return master_; }
  std::vector<int64_t>& steps() { return steps_; }
  // Copies the masters of this rank's range into the working weights (after a load).
  void masters_to_params();
  // Copies the working weights of this rank's range into the masters.
  void params_to_masters();

  // Writes `values` (1-D, any float dtype) into the working weights at flat positions
  // [begin, begin + numel) of the layout: a checkpoint's masters of any rank.
  void set_flat_params(int64_t begin, const at::Tensor& values);

  // `tensor`'s moments (views shaped like it) when this rank holds the whole tensor,
  // undefined when it holds a part or none; its update count either way.
  ParamMoments moments(size_t tensor);
  // Zeroes this rank's part of `tensor`'s moments and its update count (every rank makes
  // the same call, so the count stays equal). False when the tensor had no update yet.
  bool reset_moments(size_t tensor);

 private:
  void gather();

  ShardingOptions sharding_;
  AdamWVariant variant_;
  bool decay_embeddings_ = false;
  AllGather all_gather_;
  std::vector<at::Tensor> params_;    // [tensor]
  std::vector<std::string> names_;    // [tensor]
  std::vector<int> group_of_;         // [tensor] 0 = decays, 1 = does not
  std::vector<int64_t> steps_;        // [tensor] updates applied
  ShardLayout layout_;
  std::vector<ShardLayout::Segment> segments_;  // this rank's, in flat order
  at::Tensor exp_avg_, exp_avg_sq_, master_;    // [S] float32 on the state device
  at::Tensor grad_shard_;                       // [S] with ZeRO-2; undefined: .grad
  std::vector<std::vector<ShardLayout::Segment>> rank_segments_;  // [rank] its segments (several ranks)
};

}  // namespace gradguard::optim
