// Learning-rate schedule: linear warmup, then linear / cosine / constant decay to a
// floor. The formula (docs/design.md), for 0-based step s, peak lr, warmup W, total N:
//   s < W       : lr * (s + 1) / W
//   W <= s < N  : p = (s - W) / (N - W);  cosine: min + (lr - min) * (1 + cos(pi p)) / 2
//                                          linear: lr - (lr - min) * p;  constant: lr
//   wsd         : warmup-stable-decay: lr until the last `wsd_decay_fraction` of the
//                 post-warmup steps, then linear to min_lr at N
//   s >= N      : min_lr (constant: lr)
// and never below min_lr. Computed from the step alone, so resume needs no state. It equals torch.optim's LinearLR warmup followed by
// CosineAnnealingLR / LinearLR (tests/golden/schedule.json).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "gradguard/core/choice.h"

namespace gradguard::optim {

enum class Decay { kCosine, kLinear, kConstant, kWsd };
constexpr std::array<Choice<Decay>, 4> choices(Decay) {
  return {{{Decay::kCosine, "cosine"}, {Decay::kLinear, "linear"}, {Decay::kConstant, "constant"}, {Decay::kWsd, "wsd"}}};
}

// The batch-size rule of optim.lr_scaling (scaled_lr below).
enum class LrScaling { kNone, kLinear, kSqrt };
constexpr std::array<Choice<LrScaling>, 3> choices(LrScaling) {
  return {{{LrScaling::kNone, "none"}, {LrScaling::kLinear, "linear"}, {LrScaling::kSqrt, "sqrt"}}};
}

struct ScheduleOptions {
  int64_t warmup_steps = 20;
  int64_t total_steps = 200;
  Decay decay = Decay::kCosine;
  double min_lr = 3e-4;
  double wsd_decay_fraction = 0.2;
  void validate() const;  // throws gradguard::Error (bad input) naming schedule.<key>

  template <class Field>
  void fields(Field&& field) {
    field("warmup_steps", warmup_steps, "W: optimizer steps of linear warmup from lr/W to lr; 0 disables warmup");
    field("total_steps", total_steps, "N: optimizer steps of the run (training stops there); >= 1");
    field("decay", decay,
          "after warmup: cosine | linear (to min_lr at N) | constant (lr) | wsd (warmup-stable-decay: lr, then "
          "linear to min_lr over the last wsd_decay_fraction)");
    field("min_lr", min_lr, "learning-rate floor, absolute (before optim.lr_scaling, which scales it too); <= optim.lr");
    field("wsd_decay_fraction", wsd_decay_fraction, "wsd: share of the post-warmup steps spent decaying; in (0, 1]");
  }
};

// The peak learning rate after the batch-size scaling rule: `none` keeps lr, `linear`
// multiplies it by global_batch / base_batch (Goyal et al. 2017), `sqrt` by the square
// root of that ratio (the rule for adaptive optimizers, e.g. Malladi et al. 2022).
// base_batch 0 means "the batch lr was tuned for is this one" (no change).
double scaled_lr(double lr, LrScaling rule, int64_t base_batch, int64_t global_batch);

class LrSchedule {
 public:
  LrSchedule(double peak_lr, const ScheduleOptions& options);
  double lr_at(int64_t step) const;  // learning rate used at 0-based optimizer step `step`

 private:
  double peak_;
  ScheduleOptions options_;
};

}  // namespace gradguard::optim
