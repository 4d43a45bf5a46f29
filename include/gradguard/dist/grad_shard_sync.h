// Gradient synchronisation of ZeRO stage 2 (Rajbhandari et al. 2019, arXiv 1910.02054
// §5.2): at the end of a step each rank holds only its shard of the summed gradient --
// the flat range of optim::ShardLayout its optimizer steps -- in one buffer of S elements
// in the weights' dtype, instead of the whole gradient in every rank's .grad.
//
// Every micro-batch's gradients leave .grad as soon as autograd has produced them. A post
// hook on each parameter's AccumulateGrad node copies the gradient, widened to float32,
// into its bucket and drops .grad; buckets follow the reverse parameter order (the order
// backward produces gradients). A bucket's buffer is split by owner: the pieces of its
// tensors that fall in rank r's range, end to end. When a bucket is complete, each owner's
// part is reduced (summed, in float32) onto that owner -- c10d's reduce, which Gloo and
// NCCL both have; together the reduces of a bucket are a reduce-scatter with uneven parts
// (Gloo in LibTorch 1.13 has no reduce-scatter, and the parts are uneven anyway because a
// bucket usually lies inside one or two ranks' ranges). The owner adds what it receives
// into its shard (rounded there once to a bf16/fp16 shard) and the buffer goes back to a
// pool of kInFlight + 1 buffers allocated once, so gradient memory is the shard, those
// buffers and one parameter's gradient at a time (autograd's, before the hook copies it).
//
// Accumulation: the micro-batches are summed into the shard after their reduce, so a step
// with k micro-batches reduces k times (ZeRO-2's price for not keeping the whole local
// gradient between micro-batches). Buckets launch in index order on every rank.
//
// The guard reads the shard: GuardedStep::use_sharded_gradients takes tensor_views() and
// combines the per-tensor partial norms of every rank in one all-reduce
// (grad/grad_stats.h). The optimizer steps from shard() (optim/sharded_optimizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/TensorOptions.h>

#include "gradguard/dist/communicator.h"
#include "gradguard/optim/sharded_optimizer.h"

namespace gradguard::dist {

class GradShardSync {
 public:
  // `params` [tensor]: the trainable tensors in the layout's order (float32, bfloat16 or
  // float16; one device). `layout` spreads them over comm's ranks. `bucket_bytes`: the
  // float32 bytes a bucket collects before it is reduced.
  GradShardSync(std::vector<at::Tensor> params, Communicator& comm, const optim::ShardLayout& layout,
                int64_t bucket_bytes);
  ~GradShardSync();
  GradShardSync(const GradShardSync&) = delete;
  GradShardSync& operator=(const GradShardSync&) = delete;

  // Before the step's first backward: zeroes the shard and drops every .grad. With
  // `measure_first`, first_sq_norm() is this rank's squared gradient norm of micro-batch 0.
  void begin_step(int64_t step, bool measure_first);
  // After each micro-batch's backward: reduces what has not been reduced (tensors that got
  // no gradient count as zero), waits and adds this rank's parts into the shard. Throws
  // gradguard::Error naming the failed rank when a collective fails.
  void end_micro_batch();

  at::Tensor shard() const { return shard_; }  // [S] weights' dtype: this rank's part of the summed gradient
  // [tensor] 1-D views of shard() holding this rank's part of each tensor (numel 0: none),
  // with their offsets within the tensors and the layout's boundaries inside tensors: what
  // the guard needs to measure and clip the shards (grad/grad_stats.h's ShardedGradients).
  const std::vector<at::Tensor>& tensor_views() const { return views_; }
  const std::vector<int64_t>& tensor_offsets() const { return view_offsets_; }
  std::vector<std::pair<size_t, int64_t>> cuts() const { return layout_.cuts(); }
  at::Tensor first_sq_norm() const { return first_sq_; }  // float32 0-dim; undefined when not measured
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

  struct Bucket;
  struct Hook;
  static constexpr size_t kInFlight = 2;  // bucket buffers reduced but not yet consumed

 private:
  void on_gradient(size_t tensor);
  void fill(size_t bucket);
  void launch(size_t bucket);
  void consume(size_t bucket);

  std::vector<at::Tensor> params_;
  Communicator& comm_;
  optim::ShardLayout layout_;
  int64_t rank_ = 0;
  at::Tensor shard_;
  at::TensorOptions bucket_opts_;  // float32 on the parameters' device
  std::vector<at::Tensor> views_;
  std::vector<int64_t> view_offsets_;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // [bucket] in launch order
  std::vector<size_t> bucket_of_;                 // [tensor]
  std::vector<int64_t> pending_;                  // [bucket] tensors not yet copied this micro-batch
  std::vector<char> ready_;                       // [tensor] copied this micro-batch
  std::vector<size_t> in_flight_;                 // launched buckets not yet consumed, oldest first
  std::vector<at::Tensor> pool_;                  // [kInFlight + 1] float32 buffers of the largest bucket
  std::vector<bool> pool_free_;
  size_t next_launch_ = 0;
  int64_t step_ = 0, micro_ = 0;
  bool active_ = false, measure_first_ = false;
  at::Tensor first_sq_;
  std::shared_ptr<GradShardSync*> self_;  // the hooks' way back here; nulled by the destructor
  std::vector<std::shared_ptr<void>> accumulators_;
};

}  // namespace gradguard::dist
