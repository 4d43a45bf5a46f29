// The guard's part of one optimizer step, for loops other than the trainer's (the
// benchmarks that time a guarded step and the tests that count its host syncs): after
// accumulate(), the gradient statistics in their one device-to-host copy, clipping,
// the loss-scaler update, the anomaly verdict, and the optimizer step unless the scaler
// skipped it or the verdict is critical. No recovery actions, snapshots or metrics:
// those belong to the trainer (train/trainer.cpp), which makes the same calls in the
// same order around them.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/amp/loss_scaler.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/guard/detector.h"

namespace torch::optim {
class Optimizer;
}

namespace gradguard::train {

struct GuardedUpdate {
  grad::GradStats stats;      // extras[0] is the loss
  grad::ClipResult clip;
  amp::ScalerUpdate scaler;
  guard::Verdict verdict;
  bool applied = false;       // the optimizer stepped
};

// `extras` go to the statistics' host copy after the loss, which is extras[0];
// `loss_scale` is the scale the gradients were accumulated with.
GuardedUpdate guarded_update(int64_t step, double loss_scale, const std::vector<at::Tensor>& extras,
                             grad::GradStatsComputer& stats, grad::Clipper& clipper, amp::LossScaler& scaler,
                             guard::AnomalyDetector& detector, torch::optim::Optimizer& optimizer);

}  // namespace gradguard::train
