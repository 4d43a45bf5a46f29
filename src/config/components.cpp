// Config -> component options (config/components.h).
#include "gradguard/config/components.h"

namespace gradguard::config {

guard::GuardedStepOptions guarded_step_options(const Config& c, int64_t warmup_steps, double peak_lr) {
  guard::GuardedStepOptions g;
  g.clip = c.clip;
  g.scaler = c.amp.scaler;
  g.amp_dtype = c.amp.dtype;
  g.guard = c.guard;
  g.warmup_steps = warmup_steps;
  g.peak_lr = peak_lr;
  g.adam_betas = c.optim.betas;
  g.adam_eps = c.optim.eps;
  return g;
}

}  // namespace gradguard::config
