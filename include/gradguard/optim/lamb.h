// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in
// 76 minutes", Algorithm 2): Adam's bias-corrected update plus decoupled weight decay,
// rescaled per tensor by the trust ratio ||w|| / ||update|| so every layer moves by a
// step proportional to its own norm.
//
// It is a torch::optim::Optimizer built like LibTorch's AdamW (options with TORCH_ARG
// fluent setters, a per-parameter state, save()/load() through torch::optim::serialize),
// so it works with torch::save / torch::load and with code that sets the learning rate
// through OptimizerOptions::set_lr. Norms and the trust ratio stay on the device:
// step() never copies to the host.
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

namespace gradguard::optim {

struct LambOptions : public torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3);  // NOLINT: implicit like torch::optim::AdamWOptions
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(double, lr) = 1e-3;                             // learning rate (>= 0)
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);  // moment decays, each in [0, 1)
  TORCH_ARG(double, eps) = 1e-6;                            // added to sqrt(v_hat) (> 0)
  TORCH_ARG(double, weight_decay) = 0.01;  // decoupled, inside the trust ratio (>= 0; 0 disables)
  TORCH_ARG(double, max_trust_ratio) = 10.0;  // trust ratio clamp (> 0; +inf disables)
  TORCH_ARG(bool, bias_correction) = true;    // divide moments by 1 - beta^t
  TORCH_ARG(bool, adaptive) = true;           // false: trust ratio 1 (norm weights, biases)

 public:
  // Throws gradguard::Error (bad input) naming optim.<key> and the valid range.
  void validate() const;
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct LambParamState : public torch::optim::OptimizerCloneableParamState<LambParamState> {
  TORCH_ARG(int64_t, step) = 0;          // updates applied so far
  TORCH_ARG(torch::Tensor, exp_avg);     // m, shape and dtype of the parameter
  TORCH_ARG(torch::Tensor, exp_avg_sq);  // v, shape and dtype of the parameter

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Lamb : public torch::optim::Optimizer {
 public:
  // Validates `defaults` and the options of every group (gradguard::Error on bad input).
  // Groups without options take `defaults`.
  explicit Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LambOptions defaults = {});
  explicit Lamb(std::vector<torch::Tensor> params, LambOptions defaults = {});

  // One LAMB update of every parameter that has a gradient; returns the closure's loss
  // (undefined without a closure). No host sync. Sparse gradients are rejected.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // State (step, m, v per parameter) and group options, in LibTorch's optimizer archive
  // layout; load() restores the state only, as LibTorch's own optimizers do.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Lamb);
  }
};

}  // namespace gradguard::optim
