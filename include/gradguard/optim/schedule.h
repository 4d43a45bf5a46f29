// Learning-rate schedule: linear warmup, then linear / cosine / constant decay to a
// floor. The formula (docs/design.md), for 0-based step s, peak lr, warmup W, total N:
//   s < W       : lr * (s + 1) / W
//   W <= s < N  : p = (s - W) / (N - W);  cosine: min + (lr - min) * (1 + cos(pi p)) / 2
//                                          linear: lr - (lr - min) * p;  constant: lr
//   wsd         : warmup-stable-decay: lr until the last `wsd_decay_fraction` of the
//                 post-warmup steps, then linear to min_lr at N
//   s >= N      : min (constant: lr)
// and never below min, the floor: schedule.min_lr, or min_lr_ratio x lr (floor_lr()). Computed from the step alone, so resume needs no state. It equals torch.optim's LinearLR warmup followed by
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
  double warmup_ratio = 0.0;  // > 0: warmup_steps = its share of total_steps (resolve())
  int64_t total_steps = 200;
  double epochs = 0.0;        // > 0: total_steps from the data at the start of a run
  Decay decay = Decay::kCosine;
  double min_lr = -1.0;       // absolute floor; -1 = min_lr_ratio x the peak
  double min_lr_ratio = 0.1;  // the floor relative to the peak lr
  double wsd_decay_fraction = 0.2;
  void validate() const;  // throws gradguard::Error (bad input) naming schedule.<key>

  // warmup_steps from warmup_ratio when that is > 0: ceil(ratio x total_steps), as
  // Hugging Face's Trainer counts it. Called by Config::finalize and again once schedule.epochs has set
  // total_steps.
  void resolve();
  // Optimizer steps that make `epochs` passes over `sequences` rows at `global_batch`
  // rows per step: ceil(epochs x sequences / global_batch), at least 1.
  static int64_t steps_for_epochs(double epochs, int64_t sequences, int64_t global_batch);
  // The floor of a schedule peaking at `peak_lr`: min_lr when it is set (>= 0), scaled by
  // peak_lr / configured_lr (optim.lr_scaling moves the floor with the peak), else
  // min_lr_ratio x peak_lr.
  double floor_lr(double peak_lr, double configured_lr) const;

  template <class Field>
  void fields(Field&& field) {
    field("warmup_steps", warmup_steps, "W: optimizer steps of linear warmup from lr/W to lr; 0 disables warmup");
    field("warmup_ratio", warmup_ratio,
          "W as a share of total_steps (HF's warmup_ratio, e.g. 0.03): > 0 sets warmup_steps to "
          "ceil(ratio x total_steps); 0 = use warmup_steps; in [0, 1)");
    field("total_steps", total_steps, "N: optimizer steps of the run (training stops there); >= 1");
    field("epochs", epochs,
          "> 0: N = ceil(epochs x training rows / batch.global_batch), from the data when the run starts "
          "(fractions allowed); not together with total_steps; 0 = use total_steps");
    field("decay", decay,
          "after warmup: cosine | linear (to the floor at N) | constant (lr) | wsd (warmup-stable-decay: lr, then "
          "linear to the floor over the last wsd_decay_fraction)");
    field("min_lr", min_lr,
          "learning-rate floor, absolute (scaled with optim.lr by optim.lr_scaling); <= optim.lr; -1 = "
          "min_lr_ratio x optim.lr");
    field("min_lr_ratio", min_lr_ratio,
          "learning-rate floor as a share of the peak optim.lr (used when min_lr is -1); in [0, 1]");
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
  // `configured_lr`: optim.lr before optim.lr_scaling (0 = peak_lr), for an absolute min_lr.
  LrSchedule(double peak_lr, const ScheduleOptions& options, double configured_lr = 0);
  double lr_at(int64_t step) const;  // learning rate used at 0-based optimizer step `step`

 private:
  double peak_;
  double floor_;  // the resolved floor (ScheduleOptions::floor_lr)
  ScheduleOptions options_;
};

}  // namespace gradguard::optim
