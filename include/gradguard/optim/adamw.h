// AdamW with torch.optim.AdamW's update (decoupled weight decay, bias correction per
// parameter), applied to a whole parameter group at a time instead of one tensor at a
// time:
//   fused    one kernel for the group (at::_fused_adamw_: LibTorch >= 2.0 on CUDA,
//            >= 2.4 on the CPU), as torch.optim.AdamW(fused=True);
//   foreach  multi-tensor ops (_foreach_*), as torch.optim.AdamW(foreach=True), in the
//            order of LibTorch's per-tensor AdamW, so the result is bit-identical to it;
//   loop     LibTorch's own torch::optim::AdamW::step.
// The state is LibTorch's AdamWParamState, so checkpoints, optim::moments_of() and
// optim::reset_moments() work unchanged; a parameter whose state was reset restarts its
// own bias correction (tensors are grouped by step count). amsgrad is not supported.
//
// Two stabilising variants share that state and run per tensor on the device (no host
// read), with m-hat = m / (1 - beta1^t) and v-hat = v / (1 - beta2^t) after the moments
// took the current gradient g:
//   AdamWRule::kAtan2  Adam-atan2 (Everett et al. 2024, arXiv 2407.05872):
//                      p -= lr * (a * atan2(m-hat, b * sqrt(v-hat))) with a = 1.27, b = 1,
//                      no epsilon: the update is unchanged when every gradient is scaled
//                      by the same c > 0.
//   update_clipping    StableAdamW's update clipping (Wortsman et al. 2023, arXiv
//                      2304.13013, Algorithm 2): each tensor's learning rate, for the
//                      update and the weight decay, is lr / max(1, RMS) with
//                      RMS = sqrt(mean(g^2 / max(v-hat, eps^2))): a gradient far above what
//                      its second moment expects (a spike) moves the tensor no more than
//                      a typical one. At step 1 v-hat = g^2, so RMS = 1 and nothing changes.
//   SpamRule           SPAM (Huang et al. 2025, arXiv 2501.06842), per coordinate, with
//                      t the tensor's update count after this step:
//                      momentum reset: when t is a multiple of reset_every, m = v = 0
//                      before the step (the bias correction keeps counting t);
//                      spike-aware clipping: once t >= clip_delay and t mod reset_every
//                      >= clip_delay (v has history again), a coordinate with
//                      g^2 > threshold * v (v before this step) takes
//                      g = sign(g) sqrt(threshold * v); one whose v is 0 (no history: an
//                      embedding row seen for the first time) is left alone, where the
//                      paper's code would clip it to 0 and freeze it;
//                      warmup: the k-th update after a reset (k = t mod reset_every,
//                      t >= reset_every) is scaled by 1 - 0.99 (1 + cos(pi k / (warmup + 1))) / 2
//                      while k < warmup (0.01 at the reset itself), as the paper's cosine
//                      decay of 0.99 over `warmup` steps.
// Decoupled weight decay as AdamW's: p *= 1 - lr * weight_decay, before the update (not
// scaled by SPAM's warmup).
#pragma once

#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include "gradguard/optim/optimizer.h"

namespace gradguard::optim {

enum class AdamWKernel { fused, foreach, loop };
enum class AdamWRule { kAdam, kAtan2 };

// Adam-atan2's constants (the paper's a and b).
inline constexpr double kAtan2A = 1.27;
inline constexpr double kAtan2B = 1.0;

struct SpamRule {
  double threshold = 0;     // theta; 0 = SPAM off
  int64_t reset_every = 0;  // moments reset every this many updates; 0 = never
  int64_t warmup = 0;       // updates of cosine warmup after a reset
  int64_t clip_delay = 0;   // updates after the start and after a reset without clipping
  bool enabled() const { return threshold > 0; }
  bool resets_at(int64_t t) const { return enabled() && reset_every > 0 && t % reset_every == 0; }
  bool clips_at(int64_t t) const {
    return enabled() && t >= clip_delay && (reset_every == 0 || t % reset_every >= clip_delay);
  }
  double lr_factor(int64_t t) const;  // the warmup's factor for update t (1 outside a warmup)
};

// Which AdamW: the rule, update clipping and SPAM (all optional).
struct AdamWVariant {
  AdamWRule rule = AdamWRule::kAdam;
  bool update_clipping = false;
  SpamRule spam;
  bool plain() const { return rule == AdamWRule::kAdam && !update_clipping && !spam.enabled(); }
  std::string describe() const;  // "adam_atan2", "optim.update_clipping", "optim.spam_threshold", ...
};

// auto -> fused where the LibTorch in use has the kernel for `device`, else foreach;
// fused where it has none throws gradguard::Error naming optim.implementation.
AdamWKernel resolve_adamw_kernel(AdamWImplementation implementation, const c10::Device& device);
const char* to_string(AdamWKernel kernel);

// One AdamW update (with the variant as above) of parallel lists of tensors that have
// all taken `step` updates, this one included; the moments are updated in place.
// GroupAdamW and the sharded optimizer (optim/sharded_optimizer.h) both step through
// here, so their arithmetic is the same op for op. Update clipping's RMS is over each
// list entry: entries must be whole tensors for it to be StableAdamW's (SPAM is
// elementwise: any part of a tensor will do). fused where the kernel exists for the
// tensors' device and the variant is plain, else foreach.
struct AdamWLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;  // [entry]
};
void adamw_update(AdamWLists& lists, int64_t step, const torch::optim::AdamWOptions& options, AdamWKernel kernel,
                  const AdamWVariant& variant);

class GroupAdamW : public torch::optim::AdamW {
 public:
  // The variants (rule kAtan2, update_clipping, SPAM) have no fused kernel and are not
  // LibTorch's loop: they take `kernel` foreach, and fused or loop is refused here
  // (gradguard::Error naming optim.implementation).
  GroupAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
             AdamWKernel kernel, AdamWVariant variant = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
  AdamWKernel kernel() const { return kernel_; }
  AdamWRule rule() const { return variant_.rule; }
  bool update_clipping() const { return variant_.update_clipping; }
  const AdamWVariant& variant() const { return variant_; }

 private:
  AdamWKernel kernel_;
  AdamWVariant variant_;
};

}  // namespace gradguard::optim
