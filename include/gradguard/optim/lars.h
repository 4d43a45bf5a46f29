// LARS (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks"):
// SGD with momentum whose per-tensor learning rate is scaled by the local rate
// trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps), so the step of every
// layer is a fixed fraction of its weight norm whatever its gradient scale.
//
// It is a torch::optim::Optimizer built like LibTorch's SGD/AdamW (options with TORCH_ARG
// fluent setters, a per-parameter momentum buffer, save()/load() through
// torch::optim::serialize), so it works with torch::save / torch::load and with code that
// sets the learning rate through OptimizerOptions::set_lr. Norms and the local rate stay
// on the device: step() never copies to the host.
#pragma once

#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

namespace gradguard::optim {

struct LarsOptions : public torch::optim::OptimizerCloneableOptions<LarsOptions> {
  LarsOptions(double lr = 0.1);                  // NOLINT: implicit like torch::optim::SGDOptions
  TORCH_ARG(double, lr) = 0.1;                   // global learning rate (>= 0)
  TORCH_ARG(double, momentum) = 0.9;             // in [0, 1); 0 disables the buffer
  TORCH_ARG(double, weight_decay) = 1e-4;        // L2 added to the gradient (>= 0; 0 disables)
  TORCH_ARG(double, trust_coefficient) = 0.001;  // eta of the paper (> 0)
  TORCH_ARG(double, eps) = 1e-9;                 // in the local rate's denominator (>= 0)
  TORCH_ARG(bool, adaptive) = true;              // false: local rate 1 (norm weights, biases)

 public:
  // Throws gradguard::Error (bad input) naming optim.<key> and the valid range.
  void validate() const;
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct LarsParamState : public torch::optim::OptimizerCloneableParamState<LarsParamState> {
  // lr * local_lr * (g + wd * w) accumulated with `momentum`; shape and dtype of the
  // parameter. Only kept when momentum != 0.
  TORCH_ARG(torch::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Lars : public torch::optim::Optimizer {
 public:
  // Validates `defaults` and the options of every group (gradguard::Error on bad input).
  // Groups without options take `defaults`.
  explicit Lars(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LarsOptions defaults = {});
  explicit Lars(std::vector<torch::Tensor> params, LarsOptions defaults = {});

  // One LARS update of every parameter that has a gradient; returns the closure's loss
  // (undefined without a closure). No host sync. Sparse gradients are rejected.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Momentum buffers and group options, in LibTorch's optimizer archive layout; load()
  // restores the buffers only, as LibTorch's own optimizers do.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Lars);
  }
};

}  // namespace gradguard::optim
