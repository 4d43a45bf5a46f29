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
  std::string name = "adamw";                // adamw
  double lr = 3e-3;                          // peak learning rate (> 0)
  std::array<double, 2> betas = {0.9, 0.95}; // Adam beta1, beta2, each in [0, 1)
  double eps = 1e-8;                         // Adam epsilon (> 0)
  double weight_decay = 0.1;                 // decoupled decay on dim >= 2 tensors; 0 disables
  void validate() const;                     // throws gradguard::Error naming optim.<key>
};

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Builds the optimizer over `params`; group 0 decays, group 1 does not.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const NamedParameters& params,
                                                        const OptimOptions& options);

// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace gradguard::optim
