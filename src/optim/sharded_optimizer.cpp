// The sharded optimizer's step: gather this rank's segments into AdamW lists bucketed by
// update count, step them with optim::adamw_update, write back, all-gather.
#include "gradguard/optim/sharded_optimizer.h"

#include <algorithm>
#include <map>

#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::optim {
namespace {

// The flat view of a contiguous tensor's storage, outside autograd.
at::Tensor flat(const at::Tensor& t) { return t.detach().view({-1}); }

}  // namespace

ShardLayout ShardLayout::make(std::vector<int64_t> numels, int64_t world_size) {
  if (world_size < 1) throw bad_input("dist.world_size", "must be >= 1, got " + std::to_string(world_size));
  ShardLayout l;
  l.world_size = world_size;
  l.numels = std::move(numels);
  for (const int64_t n : l.numels) {
    TORCH_INTERNAL_ASSERT(n >= 0);
    l.offsets.push_back(l.total);
    l.total += n;
  }
  l.shard_size = (l.total + world_size - 1) / world_size;
  return l;
}

int64_t ShardLayout::begin(int64_t rank) const { return std::min(total, rank * shard_size); }
int64_t ShardLayout::end(int64_t rank) const { return std::min(total, (rank + 1) * shard_size); }

std::vector<std::pair<size_t, int64_t>> ShardLayout::cuts() const {
  std::vector<std::pair<size_t, int64_t>> out;
  for (int64_t r = 1; r < world_size; ++r) {
    const int64_t at = begin(r);
    for (size_t t = 0; t < numels.size(); ++t)
      if (at > offsets[t] && at < offsets[t] + numels[t]) out.emplace_back(t, at - offsets[t]);
  }
  return out;
}

std::vector<ShardLayout::Segment> ShardLayout::segments(int64_t rank) const {
  std::vector<Segment> out;
  const int64_t b = begin(rank), e = end(rank);
  for (size_t t = 0; t < numels.size(); ++t) {
    const int64_t lo = std::max(b, offsets[t]), hi = std::min(e, offsets[t] + numels[t]);
    if (lo < hi) out.push_back({t, lo - offsets[t], hi - lo, lo - b});
  }
  return out;
}

ShardedOptimizer::ShardedOptimizer(const NamedParameters& params, const OptimOptions& options,
                                   const ShardingOptions& sharding, AllGather all_gather)
    : torch::optim::Optimizer(
          [&] {
            // The same two groups as make_optimizer: the learning rate is set on them
            // (optim::set_learning_rate) and read back at every step.
            std::vector<at::Tensor> decay, no_decay;
            for (const auto& [name, p] : params) (decays(name, p, options) ? decay : no_decay).push_back(p);
            auto base = torch::optim::AdamWOptions(options.lr)
                            .betas({options.betas[0], options.betas[1]})
                            .eps(options.eps);
            std::vector<torch::optim::OptimizerParamGroup> groups;
            groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                           torch::optim::AdamWOptions(base).weight_decay(options.weight_decay)));
            groups.emplace_back(no_decay,
                                std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0)));
            return groups;
          }(),
          std::make_unique<torch::optim::AdamWOptions>(options.lr)),
      sharding_(sharding),
      variant_(adamw_variant(options)),
      all_gather_(std::move(all_gather)) {
  if (options.name != OptimizerKind::kAdamW && options.name != OptimizerKind::kAdamAtan2)
    throw bad_input("optim.name", "the sharded optimizer (memory.zero_stage, memory.master_weights, "
                                  "memory.offload_optimizer) runs adamw and adam_atan2 only: LAMB's and LARS's trust "
                                  "ratios need whole tensors");
  TORCH_CHECK(sharding_.world_size >= 1 && sharding_.rank >= 0 && sharding_.rank < sharding_.world_size,
              "ShardedOptimizer: rank ", sharding_.rank, " of ", sharding_.world_size);
  TORCH_CHECK(sharding_.world_size == 1 || all_gather_, "ShardedOptimizer: several ranks need an all-gather");
  TORCH_CHECK(sharding_.gather_chunk_bytes > 0, "ShardedOptimizer: gather_chunk_bytes must be > 0");
  if (variant_.update_clipping && sharding_.world_size > 1)
    throw bad_input("optim.update_clipping", "needs each tensor whole on one rank; with memory.zero_stage 1 on " +
                                                 std::to_string(sharding_.world_size) +
                                                 " ranks tensors are split: turn one of them off");
  if (sharding_.offload) sharding_.master_weights = true;
  decay_embeddings_ = options.decay_embeddings;
  std::vector<int64_t> numels;
  for (const auto& [name, p] : params) {
    TORCH_CHECK(p.is_contiguous(), "ShardedOptimizer: ", name, " is not contiguous");
    TORCH_CHECK(params_.empty() || (p.scalar_type() == params_[0].scalar_type() && p.device() == params_[0].device()),
                "ShardedOptimizer: every parameter must have one dtype and device; ", name, " differs");
    params_.push_back(p);
    names_.push_back(name);
    group_of_.push_back(decays(name, p, options) ? 0 : 1);
    numels.push_back(p.numel());
  }
  steps_.assign(params_.size(), 0);
  layout_ = ShardLayout::make(std::move(numels), sharding_.world_size);
  segments_ = layout_.segments(sharding_.rank);
  const auto device = params_.empty() ? c10::Device(c10::kCPU) : params_[0].device();
  const auto work_dtype = params_.empty() ? torch::kFloat : params_[0].scalar_type();
  const auto state_device = sharding_.offload ? c10::Device(c10::kCPU) : device;
  // Moments are float32 with masters; without them they are in the weights' dtype, as
  // torch.optim.AdamW keeps them for low-precision parameters.
  const auto state_dtype = sharding_.master_weights ? torch::kFloat : work_dtype;
  const auto state_opts = torch::TensorOptions().dtype(state_dtype).device(state_device);
  exp_avg_ = torch::zeros({layout_.shard_size}, state_opts);
  exp_avg_sq_ = torch::zeros({layout_.shard_size}, state_opts);
  if (sharding_.master_weights) {
    master_ = torch::zeros({layout_.shard_size}, state_opts);
    params_to_masters();
  }
  if (sharding_.world_size > 1) {
    for (int64_t r = 0; r < sharding_.world_size; ++r) rank_segments_.push_back(layout_.segments(r));
  }
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t bytes = exp_avg_.numel() * exp_avg_.element_size() + exp_avg_sq_.numel() * exp_avg_sq_.element_size();
  if (master_.defined()) bytes += master_.numel() * master_.element_size();
  return bytes;
}

void ShardedOptimizer::params_to_masters() {
  torch::NoGradGuard no_grad;
  for (const auto& s : segments_)
    master_.narrow(0, s.shard_offset, s.length).copy_(flat(params_[s.tensor]).narrow(0, s.offset, s.length));
}

void ShardedOptimizer::masters_to_params() {
  torch::NoGradGuard no_grad;
  for (const auto& s : segments_)
    flat(params_[s.tensor]).narrow(0, s.offset, s.length).copy_(master_.narrow(0, s.shard_offset, s.length));
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Every rank counts the update of every tensor with a gradient, its own or not.
  // With a gradient shard (ZeRO-2) every tensor has one: the shard holds zeros where no
  // rank produced a gradient, as the all-reduced buckets of ZeRO-1 do.
  std::vector<bool> stepped(params_.size(), grad_shard_.defined());
  if (!grad_shard_.defined())
    for (size_t t = 0; t < params_.size(); ++t) stepped[t] = params_[t].grad().defined();
  // Lists per (group, update count after this step).
  std::map<std::pair<int, int64_t>, AdamWLists> buckets;
  for (const auto& s : segments_) {
    if (!stepped[s.tensor]) continue;
    const auto& p = params_[s.tensor];
    auto& b = buckets[{group_of_[s.tensor], steps_[s.tensor] + 1}];
    const auto g = grad_shard_.defined() ? grad_shard_.narrow(0, s.shard_offset, s.length)
                                         : p.grad().reshape({-1}).narrow(0, s.offset, s.length);
    if (master_.defined()) {
      // Float32 (and, offloaded, on the host) before the update reads it.
      b.params.push_back(master_.narrow(0, s.shard_offset, s.length));
      b.grads.push_back(g.to(master_.device(), torch::kFloat));
    } else {
      b.params.push_back(flat(p).narrow(0, s.offset, s.length));
      b.grads.push_back(g.to(p.scalar_type()));
    }
    b.exp_avgs.push_back(exp_avg_.narrow(0, s.shard_offset, s.length));
    b.exp_avg_sqs.push_back(exp_avg_sq_.narrow(0, s.shard_offset, s.length));
  }
  for (auto& [key, lists] : buckets) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(param_groups()[key.first].options());
    adamw_update(lists, key.second, options, sharding_.kernel, variant_);
  }
  for (size_t t = 0; t < params_.size(); ++t) steps_[t] += stepped[t] ? 1 : 0;
  if (master_.defined()) masters_to_params();
  gather();
  return loss;
}

void ShardedOptimizer::use_gradient_shard(const at::Tensor& shard) {
  TORCH_INTERNAL_ASSERT(shard.dim() == 1 && shard.numel() == layout_.shard_size);
  grad_shard_ = shard;
}

void ShardedOptimizer::gather() {
  if (sharding_.world_size == 1) return;
  torch::NoGradGuard no_grad;
  // In chunks of the shard, so the buffers stay small next to what sharding saves: the
  // send buffer and one receive buffer per rank, each at most gather_chunk_bytes. They
  // live for this call only: after backward, when the activations are gone, so they do
  // not add to the step's peak.
  const int64_t S = layout_.shard_size;
  if (S == 0) return;
  const auto& p0 = params_[0];
  const int64_t chunk =
      std::max<int64_t>(1, std::min(S, sharding_.gather_chunk_bytes / static_cast<int64_t>(p0.element_size())));
  const at::Tensor send = torch::empty({chunk}, p0.options().requires_grad(false));
  std::vector<at::Tensor> gathered;
  for (int64_t r = 0; r < sharding_.world_size; ++r) gathered.push_back(torch::empty_like(send));
  for (int64_t c = 0; c < S; c += chunk) {
    const int64_t n = std::min(chunk, S - c);
    // Copies between rank `r`'s segments and a buffer holding its shard's [c, c + n).
    auto each_piece = [&](int64_t r, auto&& copy) {
      for (const auto& s : rank_segments_[r]) {
        const int64_t lo = std::max(c, s.shard_offset), hi = std::min(c + n, s.shard_offset + s.length);
        if (lo < hi) copy(flat(params_[s.tensor]).narrow(0, s.offset + (lo - s.shard_offset), hi - lo), lo - c, hi - lo);
      }
    };
    auto part = send.narrow(0, 0, n);
    each_piece(sharding_.rank, [&](const at::Tensor& w, int64_t at, int64_t len) { part.narrow(0, at, len).copy_(w); });
    std::vector<at::Tensor> outputs;
    for (auto& g : gathered) outputs.push_back(g.narrow(0, 0, n));
    all_gather_(part, outputs);
    for (int64_t r = 0; r < sharding_.world_size; ++r) {
      if (r == sharding_.rank) continue;
      each_piece(r, [&](at::Tensor w, int64_t at, int64_t len) { w.copy_(outputs[r].narrow(0, at, len)); });
    }
  }
}

ParamMoments ShardedOptimizer::moments(size_t tensor) {
  ParamMoments out;
  out.step = steps_.at(tensor);
  for (const auto& s : segments_)
    if (s.tensor == tensor && out.step > 0 && s.length == layout_.numels[tensor]) {
      out.exp_avg = exp_avg_.narrow(0, s.shard_offset, s.length).view(params_[tensor].sizes());
      out.exp_avg_sq = exp_avg_sq_.narrow(0, s.shard_offset, s.length).view(params_[tensor].sizes());
    }
  return out;
}

void ShardedOptimizer::set_flat_params(int64_t begin, const at::Tensor& values) {
  torch::NoGradGuard no_grad;
  const int64_t end = begin + values.numel();
  for (size_t t = 0; t < params_.size(); ++t) {
    const int64_t lo = std::max(begin, layout_.offsets[t]), hi = std::min(end, layout_.offsets[t] + layout_.numels[t]);
    if (lo < hi) flat(params_[t]).narrow(0, lo - layout_.offsets[t], hi - lo).copy_(values.narrow(0, lo - begin, hi - lo));
  }
}

bool ShardedOptimizer::reset_moments(size_t tensor) {
  const bool had = steps_.at(tensor) > 0;
  steps_[tensor] = 0;
  for (const auto& s : segments_)
    if (s.tensor == tensor) {
      exp_avg_.narrow(0, s.shard_offset, s.length).zero_();
      exp_avg_sq_.narrow(0, s.shard_offset, s.length).zero_();
    }
  return had;
}

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("gradguard_sharded_optimizer", torch::tensor({sharding_.world_size, layout_.total}, torch::kLong));
}

void ShardedOptimizer::load(torch::serialize::InputArchive&) {
  TORCH_CHECK(false, "ShardedOptimizer: the state is loaded from the shard files (checkpoint/optimizer_shards.h)");
}

}  // namespace gradguard::optim
