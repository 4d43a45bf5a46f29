// The three data-parallel modes behind one interface (grad_reduction.h). Each keeps the
// order of operations the mode needs; the step that drives them has no branch on the mode.
#include "grad_reduction.h"

#include <limits>

#include <torch/torch.h>

#include "gradguard/dist/grad_shard_sync.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/guard/side_layout.h"

namespace gradguard::train {
namespace {

void put_inf(const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  if (flat.numel() > 0) flat[0].fill_(std::numeric_limits<float>::infinity());
}

// One process: .grad is the gradient, dropped before each step (set_to_none: fresh buffers).
class SingleProcess final : public GradReduction {
 public:
  explicit SingleProcess(std::vector<at::Tensor> params) : params_(std::move(params)) {}
  void begin_step(int64_t, bool, bool inject_inf) override {
    inject_ = inject_inf;
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
  void hand_off(const at::Tensor& side) override { side_ = side; }
  at::Tensor finish() override {
    if (inject_) put_inf(params_[0].grad().view(-1));
    return std::move(side_);
  }
  std::string describe() const override { return ""; }

 private:
  std::vector<at::Tensor> params_;
  bool inject_ = false;
  at::Tensor side_;
};

// Replicated: buckets all-reduced during the last backward, the side vector in the last one.
class Replicated final : public GradReduction {
 public:
  Replicated(const std::vector<at::Tensor>& params, dist::Communicator& comm, const dist::DistOptions& options,
             int64_t side_size)
      : params_(params), comm_(comm), hook_(options.hook), sync_(params, comm, options, side_size) {}
  void begin_step(int64_t step, bool, bool inject_inf) override {
    inject_ = inject_inf;
    sync_.begin_step(step);  // .grad are views into the all-reduce buckets, zeroed
  }
  void hand_off(const at::Tensor& side) override {
    if (inject_) put_inf(params_[0].grad().view(-1));  // before the last backward: the inf travels with the all-reduce
    sync_.arm(side);                                   // summed with the gradients' last bucket
  }
  at::Tensor finish() override { return sync_.finish(); }
  std::string describe() const override {
    return "backend " + std::string(name_of(comm_.backend())) + ", " + std::to_string(sync_.num_buckets()) +
           " gradient buckets, hook " + name_of(hook_);
  }

 private:
  std::vector<at::Tensor> params_;
  dist::Communicator& comm_;
  dist::CommHook hook_;
  dist::GradSync sync_;
  bool inject_ = false;
};

// ZeRO-2: each micro-batch's gradients reduced to their shard owners; the shard is what
// the optimizer steps and the guard measures, its statistics (and the side vector) summed
// over the ranks in the guard's one all-reduce.
class Sharded final : public GradReduction {
 public:
  Sharded(const std::vector<at::Tensor>& params, dist::Communicator& comm, optim::ShardedOptimizer& optimizer,
          guard::GuardedStep& guarded, int64_t bucket_bytes)
      : comm_(comm), sync_(params, comm, optimizer.layout(), bucket_bytes) {
    optimizer.use_gradient_shard(sync_.shard());
    auto* c = &comm;
    guarded.use_sharded_gradients({sync_.tensor_views(), sync_.tensor_offsets(), sync_.cuts(),
                                   [c](at::Tensor& v) { c->allreduce_sum(v, "the guard's statistics all-reduce"); }});
  }
  void begin_step(int64_t step, bool measure_noise, bool inject_inf) override {
    inject_ = inject_inf;
    sync_.begin_step(step, measure_noise);  // the shard zeroed, every .grad dropped
  }
  bool grads_in_place() const override { return false; }  // .grad is empty after each backward
  void after_backward() override { sync_.end_micro_batch(); }
  at::Tensor noise_sample() const override { return sync_.first_sq_norm(); }
  void hand_off(const at::Tensor& side) override { side_ = side; }
  at::Tensor finish() override {
    if (inject_) put_inf(sync_.shard());  // into this rank's shard of the summed gradient
    return std::move(side_);
  }
  std::string describe() const override {
    return "backend " + std::string(name_of(comm_.backend())) + ", " + std::to_string(sync_.num_buckets()) +
           " gradient buckets reduced to their shard owners (ZeRO-2)";
  }

 private:
  dist::Communicator& comm_;
  dist::GradShardSync sync_;
  bool inject_ = false;
  at::Tensor side_;
};

}  // namespace

std::unique_ptr<GradReduction> make_grad_reduction(const config::Config& cfg, const std::vector<at::Tensor>& params,
                                                   dist::Communicator* comm, optim::ShardedOptimizer* sharded,
                                                   guard::GuardedStep& guarded) {
  if (comm == nullptr) return std::make_unique<SingleProcess>(params);
  if (cfg.memory.resolve(comm->world_size(), comm->rank()).shards_gradients) {
    TORCH_INTERNAL_ASSERT(sharded != nullptr, "ZeRO-2 without a sharded optimizer");
    return std::make_unique<Sharded>(params, *comm, *sharded, guarded,
                                     static_cast<int64_t>(cfg.dist.bucket_mb * 1024 * 1024));
  }
  const auto layout = guard::SideLayout::for_ranks(comm->world_size(), cfg.batch.accum_steps);
  return std::make_unique<Replicated>(params, *comm, cfg.dist, layout.size());
}

}  // namespace gradguard::train
