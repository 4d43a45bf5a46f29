// Gradient clipping. `global` is PyTorch's clip_grad_norm_ exactly:
//   total = || (||g_1||_2, ..., ||g_n||_2) ||_2,  coef = min(1, max_norm / (total + 1e-6))
// computed in float32 tensor arithmetic like torch, so clipped gradients are bit-equal.
// Per-tensor norms come from one foreach kernel; the total norm and coefficient reach the
// host in a single device->host copy.
#pragma once

#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::grad {

struct ClipOptions {
  std::string strategy = "global";  // none | global
  double max_norm = 1.0;            // global L2 threshold (> 0); used by `global`
  void validate() const;            // throws gradguard::Error naming clip.<key>
};

struct ClipResult {
  double grad_norm = 0.0;  // global L2 norm of the gradients before clipping
  double clip_coef = 1.0;  // factor applied to every gradient (1 = untouched)
};

// Measures the global norm of the gradients of `params` (tensors without a gradient are
// skipped) and, for strategy `global`, scales them in place by the clip coefficient.
// Syncs with the host once (reads two scalars).
ClipResult clip_gradients(const std::vector<at::Tensor>& params, const ClipOptions& options);

}  // namespace gradguard::grad
