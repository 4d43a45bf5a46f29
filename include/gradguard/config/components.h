// From a validated Config to the options of the components built on it, in one place:
// the trainer and the Python module construct their GuardedStep from the same function,
// so the two cannot drift apart.
#pragma once

#include <cstdint>

#include "gradguard/config/config.h"
#include "gradguard/guard/guarded_step.h"

namespace gradguard::config {

// The guarded step's options: clip, amp.scaler, amp.dtype, guard, the optimizer's betas and
// eps (the diagnosis's Adam evidence); `warmup_steps` and `peak_lr` are the schedule's
// (the trainer's after its batch-size scaling rule; a Python loop's own when it says).
guard::GuardedStepOptions guarded_step_options(const Config& c, int64_t warmup_steps, double peak_lr);

}  // namespace gradguard::config
