// Learning-rate schedule: linear warmup, then linear / cosine / constant decay to a
// floor. The formula (DESIGN.md), for 0-based step s, peak lr, warmup W, total N:
//   s < W       : lr * (s + 1) / W
//   W <= s < N  : p = (s - W) / (N - W);  cosine: min + (lr - min) * (1 + cos(pi p)) / 2
//                                          linear: lr - (lr - min) * p;  constant: lr
//   s >= N      : min_lr (constant: lr)
// and never below min_lr. It equals torch.optim's LinearLR warmup followed by
// CosineAnnealingLR / LinearLR (tests/golden/schedule.json).
#pragma once

#include <cstdint>
#include <string>

namespace gradguard::optim {

struct ScheduleOptions {
  int64_t warmup_steps = 20;     // W, optimizer steps of linear warmup; 0 disables warmup
  int64_t total_steps = 200;     // N, optimizer steps of the run (training stops there)
  std::string decay = "cosine";  // cosine | linear | constant
  double min_lr = 3e-4;          // floor, absolute learning rate; <= optim.lr
  void validate() const;         // throws gradguard::Error (bad input) naming schedule.<key>
};

class LrSchedule {
 public:
  LrSchedule(double peak_lr, const ScheduleOptions& options);
  double lr_at(int64_t step) const;  // learning rate used at 0-based optimizer step `step`

 private:
  double peak_;
  ScheduleOptions options_;
};

}  // namespace gradguard::optim
