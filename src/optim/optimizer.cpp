// AdamW via torch::optim::AdamW, whose C++ update matches torch.optim.AdamW (checked by
// tests/optim/optimizer_test.cpp against tests/golden/adamw.json).
#include "gradguard/optim/optimizer.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::optim {

void OptimOptions::validate() const {
  if (name != "adamw") throw bad_input("optim.name", "'" + name + "' is not valid (valid: adamw)");
  if (!(lr > 0) || !std::isfinite(lr))
    throw bad_input("optim.lr", "must be a finite number > 0, got " + std::to_string(lr));
  for (int i = 0; i < 2; ++i)
    if (!(betas[i] >= 0 && betas[i] < 1))
      throw bad_input("optim.betas", "each beta must be in [0, 1), got " + std::to_string(betas[i]));
  if (!(eps > 0)) throw bad_input("optim.eps", "must be > 0, got " + std::to_string(eps));
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
    throw bad_input("optim.weight_decay", "must be >= 0, got " + std::to_string(weight_decay));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const NamedParameters& params,
                                                        const OptimOptions& options) {
  options.validate();
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, p] : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto base = torch::optim::AdamWOptions(options.lr)
                  .betas({options.betas[0], options.betas[1]})
                  .eps(options.eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(base).weight_decay(options.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(base).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), base);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups())
    group.options().set_lr(lr);
}

}  // namespace gradguard::optim
