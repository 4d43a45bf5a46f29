// Optimizer construction. AdamW follows PyTorch exactly (decoupled weight decay, bias
// correction) with two parameter groups: weight decay on tensors with dim >= 2
// (matrices, embeddings), none on norms and biases.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace gradguard::optim {

struct OptimOptions {
  std::string name = "adamw";                // adamw | lamb | lars
  double lr = 3e-3;                          // peak learning rate (> 0) at batch base_batch
  std::array<double, 2> betas = {0.9, 0.95}; // Adam/LAMB beta1, beta2, each in [0, 1)
  double eps = 1e-8;                         // Adam/LAMB epsilon (> 0; large-batch fine-tuning often wants 1e-6)
  double weight_decay = 0.1;                 // decay on dim >= 2 tensors (decoupled for AdamW/LAMB, L2 for LARS); 0 disables
  double max_trust_ratio = 10.0;             // LAMB: clamp of ||w|| / ||update|| (> 0)
  double momentum = 0.9;                     // LARS: momentum in [0, 1)
  double trust_coefficient = 0.001;          // LARS: eta of the local learning rate (> 0)
  std::string implementation = "auto";       // AdamW kernel: auto (fused where available, else foreach) | fused | foreach | loop
  std::string lr_scaling = "none";           // none | linear | sqrt: scale lr by global_batch / base_batch
  int64_t base_batch = 0;                    // sequences per step lr was tuned for; 0 = no scaling
  void validate() const;                     // throws gradguard::Error naming optim.<key>
};

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Builds the optimizer over `params`; group 0 (dim >= 2) decays and is layer-adaptive
// for LAMB/LARS, group 1 (norms, biases) neither.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const NamedParameters& params,
                                                        const OptimOptions& options);

// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// The live optimizer state of one parameter (not copies). Undefined tensors where the
// optimizer keeps no such state: AdamW and LAMB have exp_avg / exp_avg_sq, LARS a
// momentum_buffer; all undefined (step 0) before the parameter's first update.
struct ParamMoments {
  at::Tensor exp_avg;          // m, first moment
  at::Tensor exp_avg_sq;       // v, second moment (un-bias-corrected)
  at::Tensor momentum_buffer;  // LARS momentum
  int64_t step = 0;            // updates applied to this parameter
};
ParamMoments moments_of(torch::optim::Optimizer& optimizer, const at::Tensor& param);

// Forgets the optimizer state of `param` (moments and step count): its next update
// starts afresh with bias correction. Returns false when it had no state.
bool reset_moments(torch::optim::Optimizer& optimizer, const at::Tensor& param);

}  // namespace gradguard::optim
