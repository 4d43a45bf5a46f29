// The buckets of ZeRO-2's gradient path (see grad_shard_sync.h for the why). A bucket's
// plan -- which pieces of which tensors go to which owner, at which offsets -- is fixed by
// the parameters and the layout, so it is made once; only the buffers come and go.
#include "gradguard/dist/grad_shard_sync.h"

#include <algorithm>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::dist {

struct GradShardSync::Bucket {
  struct Piece {
    size_t tensor = 0;
    int64_t offset = 0;        // first element within the tensor
    int64_t length = 0;
    int64_t at = 0;            // first element within the owner's part of the buffer
    int64_t shard_offset = 0;  // first element within the owner's shard
  };
  struct Part {
    int64_t owner = 0;
    int64_t numel = 0;
    std::vector<Piece> pieces;
    at::Tensor buffer;  // float32 [numel] while the bucket is in use
    Communicator::Work work;
  };
  std::vector<size_t> tensors;
  std::vector<Part> parts;  // by owner, ascending
  int64_t numel = 0;        // all parts
  bool allocated = false;
  int64_t slot = -1;        // the pool buffer its parts are views of (-1: its own allocation)
};

struct GradShardSync::Hook : torch::autograd::FunctionPostHook {
  Hook(std::shared_ptr<GradShardSync*> self, size_t index) : self(std::move(self)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (*self != nullptr) (*self)->on_gradient(index);
    return outputs;
  }
  std::shared_ptr<GradShardSync*> self;
  size_t index;
};

GradShardSync::GradShardSync(std::vector<at::Tensor> params, Communicator& comm, const optim::ShardLayout& layout,
                             int64_t bucket_bytes)
    : params_(std::move(params)), comm_(comm), layout_(layout), rank_(comm.rank()),
      self_(std::make_shared<GradShardSync*>(this)) {
  TORCH_INTERNAL_ASSERT(!params_.empty());
  TORCH_INTERNAL_ASSERT(layout_.world_size == comm_.world_size() && layout_.numels.size() == params_.size());
  // The shard in the weights' dtype (a bf16 model's gradients are bf16, as in .grad
  // without sharding); the buckets in float32, so the sum over the ranks is float32 and
  // is rounded once into the shard.
  const auto opts = params_[0].options().requires_grad(false);
  shard_ = torch::zeros({layout_.shard_size}, opts);
  bucket_opts_ = opts.dtype(torch::kFloat);
  views_.assign(params_.size(), torch::empty({0}, opts));
  view_offsets_.assign(params_.size(), 0);
  for (const auto& s : layout_.segments(rank_)) {
    views_[s.tensor] = shard_.narrow(0, s.shard_offset, s.length);
    view_offsets_[s.tensor] = s.offset;
  }

  // Buckets in reverse parameter order, closed once they reach bucket_bytes of float32.
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
  std::vector<std::vector<size_t>> groups(1);
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    if (filled >= cap) groups.emplace_back(), filled = 0;
    groups.back().push_back(k);
    filled += params_[k].numel();
  }
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < groups.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->tensors = groups[b];
    std::vector<Bucket::Part> by_owner(static_cast<size_t>(layout_.world_size));
    for (size_t k : bucket->tensors) {
      bucket_of_[k] = b;
      const int64_t lo = layout_.offsets[k], hi = lo + layout_.numels[k];
      for (int64_t r = 0; r < layout_.world_size; ++r) {
        const int64_t from = std::max(lo, layout_.begin(r)), to = std::min(hi, layout_.end(r));
        if (from >= to) continue;
        auto& part = by_owner[static_cast<size_t>(r)];
        part.owner = r;
        part.pieces.push_back({k, from - lo, to - from, part.numel, from - layout_.begin(r)});
        part.numel += to - from;
      }
    }
    for (auto& part : by_owner)
      if (part.numel > 0) bucket->numel += part.numel, bucket->parts.push_back(std::move(part));
    buckets_.push_back(std::move(bucket));
  }
  // A fixed pool of bucket buffers, allocated once: buckets come and go every micro-batch,
  // and allocating them each time churns the allocator (on the CPU, glibc then keeps
  // freed pages resident; on GPUs the caching allocator fragments).
  int64_t largest = 0;
  for (const auto& b : buckets_) largest = std::max(largest, b->numel);
  for (size_t i = 0; i < kInFlight + 1; ++i) {
    pool_.push_back(torch::empty({largest}, bucket_opts_));
    pool_free_.push_back(true);
  }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(params_.size(), 0);
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    TORCH_INTERNAL_ASSERT(acc, "a parameter without a gradient accumulator");
    acc->add_post_hook(std::make_unique<Hook>(self_, k));
    accumulators_.push_back(std::static_pointer_cast<void>(acc));
  }
}

GradShardSync::~GradShardSync() {
  *self_ = nullptr;  // hooks outlive us on the accumulators: make them inert
}

void GradShardSync::begin_step(int64_t step, bool measure_first) {
  torch::NoGradGuard no_grad;
  step_ = step;
  micro_ = 0;
  measure_first_ = measure_first;
  shard_.zero_();
  first_sq_ = measure_first ? torch::zeros({}, bucket_opts_) : at::Tensor();
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int64_t>(buckets_[b]->tensors.size());
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  active_ = true;
}

void GradShardSync::fill(size_t b) {
  auto& B = *buckets_[b];
  if (B.allocated) return;
  B.slot = -1;
  for (size_t i = 0; i < pool_.size() && B.slot < 0; ++i)
    if (pool_free_[i]) B.slot = static_cast<int64_t>(i), pool_free_[i] = false;
  // Out of pool slots only when buckets complete out of order: then a buffer of its own.
  const at::Tensor buffer =
      B.slot >= 0 ? pool_[B.slot].narrow(0, 0, B.numel).zero_() : torch::zeros({B.numel}, bucket_opts_);
  int64_t at = 0;
  for (auto& part : B.parts) part.buffer = buffer.narrow(0, at, part.numel), at += part.numel;
  B.allocated = true;
}

void GradShardSync::on_gradient(size_t k) {
  if (!active_ || ready_[k]) return;
  torch::NoGradGuard no_grad;
  auto& p = params_[k];
  const size_t b = bucket_of_[k];
  if (p.grad().defined()) {
    fill(b);
    const auto g = p.grad().reshape({-1});
    if (measure_first_ && micro_ == 0) first_sq_.add_(g.to(torch::kFloat).square().sum());
    for (auto& part : buckets_[b]->parts)
      for (const auto& piece : part.pieces)
        if (piece.tensor == k) part.buffer.narrow(0, piece.at, piece.length).copy_(g.narrow(0, piece.offset, piece.length));
    p.mutable_grad() = at::Tensor();  // its values are in the bucket now
  }
  ready_[k] = 1;
  --pending_[b];
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
}

void GradShardSync::launch(size_t b) {
  auto& B = *buckets_[b];
  fill(b);  // a bucket none of whose tensors got a gradient reduces zeros: every rank must take part
  const std::string what = "gradient reduce to the shard owners (bucket " + std::to_string(b) + " of " +
                           std::to_string(buckets_.size()) + ", step " + std::to_string(step_) + ", micro-batch " +
                           std::to_string(micro_) + ")";
  for (auto& part : B.parts) part.work = comm_.reduce_sum_async(part.buffer, part.owner, what);
  in_flight_.push_back(b);
  while (in_flight_.size() > kInFlight) {
    consume(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
  }
}

void GradShardSync::consume(size_t b) {
  torch::NoGradGuard no_grad;
  auto& B = *buckets_[b];
  for (auto& part : B.parts) {
    part.work.wait();
    if (part.owner == rank_)
      for (const auto& piece : part.pieces)
        shard_.narrow(0, piece.shard_offset, piece.length).add_(part.buffer.narrow(0, piece.at, piece.length));
    part.buffer = at::Tensor();
    part.work = Communicator::Work();
  }
  if (B.slot >= 0) pool_free_[B.slot] = true;
  B.slot = -1;
  B.allocated = false;
}

void GradShardSync::end_micro_batch() {
  TORCH_INTERNAL_ASSERT(active_, "end_micro_batch() without begin_step()");
  for (size_t k = 0; k < params_.size(); ++k)
    if (!ready_[k]) on_gradient(k);  // no gradient this micro-batch (or one left in .grad)
  for (size_t b : in_flight_) consume(b);
  in_flight_.clear();
  ++micro_;
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int64_t>(buckets_[b]->tensors.size());
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
}

}  // namespace gradguard::dist
