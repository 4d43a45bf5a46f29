// How this rank's gradients become the step's gradient: the data-parallel mode as one
// object, chosen once when the run is set up (make_grad_reduction) and called the same way
// by the step (trainer_steps.cpp) whatever the mode. Private to src/train.
//
// Three modes:
//   single process     .grad is the gradient; nothing is communicated.
//   replicated         every rank ends the step with the whole summed gradient: .grad are
//                      views into buckets all-reduced during the last backward
//                      (dist/grad_sync.h), the side vector summed with the last bucket.
//   ZeRO-2 shards      every rank ends the step with its shard of the summed gradient only,
//                      reduced to it after each micro-batch (dist/grad_shard_sync.h); the
//                      side vector is summed later, in the guard's statistics all-reduce.
// The step drives a reduction as
//   begin_step -> [backward, after_backward] x micro-batches, with hand_off(side) before the
//   last backward -> finish() = the side vector (guard/side_layout.h's for_ranks layout).
// An injected inf (guard.inject.nonfinite_steps) is put where the mode needs it to travel:
// before the last backward into a bucket, after it into a shard or into .grad.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/config/config.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/optim/sharded_optimizer.h"

namespace gradguard::train {

class GradReduction {
 public:
  virtual ~GradReduction() = default;

  // Before the step's first backward. `measure_noise`: the step samples the gradient noise
  // (the squared norm after micro-batch 0); `inject_inf`: this rank puts an inf into its
  // gradient (a fault injected on purpose).
  virtual void begin_step(int64_t step, bool measure_noise, bool inject_inf) = 0;
  // Whether .grad holds the accumulating gradient after each backward, so that the
  // accumulation itself can measure micro-batch 0's norm (false: the reduction measures it).
  virtual bool grads_in_place() const { return true; }
  // After every micro-batch's backward.
  virtual void after_backward() {}
  // The noise sample of this step (0-dim float) when the reduction measures it itself.
  virtual at::Tensor noise_sample() const { return {}; }
  // Before the last micro-batch's backward: this rank's side vector (for_ranks layout,
  // its own entries filled).
  virtual void hand_off(const at::Tensor& side) = 0;
  // After the last backward: the side vector, summed over the ranks (with ZeRO-2: this
  // rank's, which the guard's statistics all-reduce sums before anything is read).
  virtual at::Tensor finish() = 0;
  // What it does, for the run's header ("" for a single process).
  virtual std::string describe() const = 0;
};

// The reduction of this run: a single process without `comm`, else ZeRO-2 shards when
// the memory layout shards gradients (and then the optimizer `sharded` steps the shard and `guarded`
// measures it), else replicated all-reduce. `params` [tensor] are the trainable tensors
// in the optimizer's layout order.
std::unique_ptr<GradReduction> make_grad_reduction(const config::Config& cfg, const std::vector<at::Tensor>& params,
                                                   dist::Communicator* comm, optim::ShardedOptimizer* sharded,
                                                   guard::GuardedStep& guarded);

}  // namespace gradguard::train
