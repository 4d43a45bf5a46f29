// LAMB update, read top to bottom per parameter tensor w with gradient g at step t:
//   m = b1 m + (1-b1) g,  v = b2 v + (1-b2) g^2          (moments, in place)
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * w       (bc = 1 - beta^t, or 1 when off)
//   trust = clamp(||w|| / ||u||, 0, max_trust_ratio), 1 when either norm is 0 or the
//           group is not adaptive
//   w -= lr * trust * u
// The trust ratio is a 0-dim tensor chosen with torch::where, so the zero-norm cases
// need no host-side branch and step() never syncs. The bias corrections are host doubles
// computed from the host step counter. Checked against tests/golden/lamb_lars.json
// (tests/golden/make_lamb_lars_golden.py, a float64 transcription of the formulas).
#include "gradguard/optim/lamb.h"

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
using compat::state_key;

LambOptions::LambOptions(double lr) : lr_(lr) {}

void LambOptions::validate() const {
  if (!(lr() >= 0) || !std::isfinite(lr()))
    throw bad_input("optim.lr", "must be a finite number >= 0, got " + format_number(lr()));
  for (double beta : {std::get<0>(betas()), std::get<1>(betas())})
    if (!(beta >= 0 && beta < 1))
      throw bad_input("optim.betas", "each beta must be in [0, 1), got " + format_number(beta));
  if (!(eps() > 0) || !std::isfinite(eps()))
    throw bad_input("optim.eps", "must be a finite number > 0, got " + format_number(eps()));
  if (!(weight_decay() >= 0) || !std::isfinite(weight_decay()))
    throw bad_input("optim.weight_decay",
                    "must be a finite number >= 0, got " + format_number(weight_decay()));
  if (!(max_trust_ratio() > 0))
    throw bad_input("optim.max_trust_ratio",
                    "must be > 0 (inf disables the clamp), got " + format_number(max_trust_ratio()));
}

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_trust_ratio);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adaptive);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_trust_ratio);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adaptive);
}

double LambOptions::get_lr() const {
  return lr();
}

void LambOptions::set_lr(const double lr) {
  this->lr(lr);
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LambOptions>(defaults)) {
  defaults.validate();
  for (const auto& group : param_groups_)
    static_cast<const LambOptions&>(group.options()).validate();
}

Lamb::Lamb(std::vector<torch::Tensor> params, LambOptions defaults)
    : Lamb(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const LambOptions&>(group.options());
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      if (grad.is_sparse()) throw runtime_error("optim", "LAMB does not support sparse gradients");

      auto& slot = state_[state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<LambParamState>();
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<LambParamState&>(*slot);
      state.step(state.step() + 1);

      auto& m = state.exp_avg();
      auto& v = state.exp_avg_sq();
      m.mul_(beta1).add_(grad, 1 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);

      // Bias corrections on the host: t is a host counter, so no sync.
      const auto t = static_cast<double>(state.step());
      const double bc1 = options.bias_correction() ? 1 - std::pow(beta1, t) : 1.0;
      const double bc2 = options.bias_correction() ? 1 - std::pow(beta2, t) : 1.0;
      auto update = (m / bc1).div_((v / bc2).sqrt_().add_(options.eps()));
      if (options.weight_decay() != 0) update.add_(p, options.weight_decay());

      if (options.adaptive()) {
        // trust = ||w|| / ||u|| clamped to max_trust_ratio; 1 where either norm is 0
        // (a zero-initialised tensor, or nothing to do). where() picks the branch on the
        // device; the discarded division may be inf/nan, which where() does not propagate.
        auto w_norm = p.norm();
        auto u_norm = update.norm();
        auto ratio = (w_norm / u_norm).clamp_max(options.max_trust_ratio());
        auto trust =
            torch::where(w_norm.gt(0).logical_and(u_norm.gt(0)), ratio, torch::ones_like(ratio));
        update.mul_(trust);
      }
      p.add_(update, -options.lr());
    }
  }
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  serialize(*this, archive);
}

}  // namespace gradguard::optim
