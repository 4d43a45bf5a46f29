// Learning-rate schedule: linear warmup, then linear / cosine / constant decay to a
// floor. The formula (DESIGN.md), for 0-based step s, peak lr, warmup W, total N:
//   s < W       : lr * (s + 1) / W
//   W <= s < N  : p = (s - W) / (N - W);  cosine: min + (lr - min) * (1 + cos(pi p)) / 2
//                                          linear: lr - (lr - min) * p;  constant: lr
//   wsd         : warmup-stable-decay: lr until the last `wsd_decay_fraction` of the
//                 post-warmup steps, then linear to min_lr at N
//   s >= N      : min_lr (constant: lr)
// and never below min_lr. Computed from the step alone, so resume needs no state. It equals torch.optim's LinearLR warmup followed by
// CosineAnnealingLR / LinearLR (tests/golden/schedule.json).
#pragma once

#include <cstdint>
#include <string>

namespace gradguard::optim {

struct ScheduleOptions {
  int64_t warmup_steps = 20;     // W, optimizer steps of linear warmup; 0 disables warmup
  int64_t total_steps = 200;     // N, optimizer steps of the run (training stops there)
  std::string decay = "cosine";  // cosine | linear | constant | wsd
  double min_lr = 3e-4;          // floor, absolute learning rate; <= optim.lr
  double wsd_decay_fraction = 0.2;  // wsd: share of the post-warmup steps spent decaying, in (0, 1]
  void validate() const;         // throws gradguard::Error (bad input) naming schedule.<key>
};

// The peak learning rate after the batch-size scaling rule: `none` keeps lr, `linear`
// multiplies it by global_batch / base_batch (Goyal et al. 2017), `sqrt` by the square
// root of that ratio (the rule for adaptive optimizers, e.g. Malladi et al. 2022).
// base_batch 0 means "the batch lr was tuned for is this one" (no change).
double scaled_lr(double lr, const std::string& rule, int64_t base_batch, int64_t global_batch);

class LrSchedule {
 public:
  LrSchedule(double peak_lr, const ScheduleOptions& options);
  double lr_at(int64_t step) const;  // learning rate used at 0-based optimizer step `step`

 private:
  double peak_;
  ScheduleOptions options_;
};

}  // namespace gradguard::optim
