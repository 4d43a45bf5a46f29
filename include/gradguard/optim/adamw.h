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
#pragma once

#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include "gradguard/optim/optimizer.h"

namespace gradguard::optim {

enum class AdamWKernel { fused, foreach, loop };

// auto -> fused where the LibTorch in use has the kernel for `device`, else foreach;
// fused where it has none throws gradguard::Error naming optim.implementation.
AdamWKernel resolve_adamw_kernel(AdamWImplementation implementation, const c10::Device& device);
const char* to_string(AdamWKernel kernel);

class GroupAdamW : public torch::optim::AdamW {
 public:
  GroupAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
             AdamWKernel kernel);
  torch::Tensor step(LossClosure closure = nullptr) override;
  AdamWKernel kernel() const { return kernel_; }

 private:
  AdamWKernel kernel_;
};

}  // namespace gradguard::optim
