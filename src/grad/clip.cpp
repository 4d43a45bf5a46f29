// Global-norm clipping with torch's arithmetic: norms in the gradients' dtype, the
// coefficient as a float32 tensor clamped at 1, then an in-place multiply of every
// gradient (skipped when the coefficient is exactly 1, which leaves the values unchanged
// just as torch's multiply by 1 does).
#include "gradguard/grad/clip.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::grad {

void ClipOptions::validate() const {
  if (strategy != "none" && strategy != "global")
    throw bad_input("clip.strategy", "'" + strategy + "' is not valid (valid: none, global)");
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw bad_input("clip.max_norm", "must be a finite number > 0, got " + std::to_string(max_norm));
}

ClipResult clip_gradients(const std::vector<at::Tensor>& params, const ClipOptions& options) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  auto norms = at::_foreach_norm(grads, 2);
  auto total = torch::stack(norms).norm(2);  // global L2 norm, float32
  auto coef = torch::clamp(options.max_norm / (total + 1e-6), c10::nullopt, 1.0);
  auto host = torch::stack({total.to(torch::kFloat), coef.to(torch::kFloat)}).to(torch::kCPU);  // one sync
  ClipResult result;
  result.grad_norm = host[0].item<float>();
  result.clip_coef = options.strategy == "global" ? host[1].item<float>() : 1.0;
  if (options.strategy == "global" && result.clip_coef < 1.0)
    for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  return result;
}

}  // namespace gradguard::grad
