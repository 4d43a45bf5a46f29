// LARS update, read top to bottom per parameter tensor w with gradient g:
//   local_lr = trust_coefficient * ||w|| / (||g|| + wd * ||w|| + eps), 1 when either
//              norm is 0 or the group is not adaptive
//   d = lr * local_lr * (g + wd * w)
//   buf = momentum * buf + d (buf = d on the first step), w -= buf   (momentum != 0)
//   w -= d                                                            (momentum == 0)
// local_lr is a 0-dim tensor chosen with torch::where, so the zero-norm cases need no
// host-side branch and step() never syncs. Note the norms use the raw gradient g, the
// paper's form; the decay term enters the denominator as wd * ||w||. Checked against
// tests/golden/lamb_lars.json (tests/golden/make_lamb_lars_golden.py, a float64
// transcription of the formulas).
#include "gradguard/optim/lars.h"

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
using compat::state_key;

LarsOptions::LarsOptions(double lr) : lr_(lr) {}

void LarsOptions::validate() const {
  if (!(lr() >= 0) || !std::isfinite(lr()))
    throw bad_input("optim.lr", "must be a finite number >= 0, got " + format_number(lr()));
  if (!(momentum() >= 0 && momentum() < 1))
    throw bad_input("optim.momentum", "must be in [0, 1), got " + format_number(momentum()));
  if (!(weight_decay() >= 0) || !std::isfinite(weight_decay()))
    throw bad_input("optim.weight_decay",
                    "must be a finite number >= 0, got " + format_number(weight_decay()));
  if (!(trust_coefficient() > 0) || !std::isfinite(trust_coefficient()))
    throw bad_input("optim.trust_coefficient",
                    "must be a finite number > 0, got " + format_number(trust_coefficient()));
  if (!(eps() >= 0) || !std::isfinite(eps()))
    throw bad_input("optim.eps", "must be a finite number >= 0, got " + format_number(eps()));
}

void LarsOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_coefficient);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adaptive);
}

void LarsOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, trust_coefficient);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adaptive);
}

double LarsOptions::get_lr() const {
  return lr();
}

void LarsOptions::set_lr(const double lr) {
  this->lr(lr);
}

void LarsParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void LarsParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

Lars::Lars(std::vector<torch::optim::OptimizerParamGroup> param_groups, LarsOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LarsOptions>(defaults)) {
  defaults.validate();
  for (const auto& group : param_groups_)
    static_cast<const LarsOptions&>(group.options()).validate();
}

Lars::Lars(std::vector<torch::Tensor> params, LarsOptions defaults)
    : Lars(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

torch::Tensor Lars::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const LarsOptions&>(group.options());
    const double wd = options.weight_decay();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      if (grad.is_sparse()) throw runtime_error("optim", "LARS does not support sparse gradients");

      auto d = wd != 0 ? grad.add(p, wd) : grad.clone();  // g + wd * w
      if (options.adaptive()) {
        // local_lr = tc * ||w|| / (||g|| + wd ||w|| + eps); 1 where either norm is 0.
        // where() picks on the device; the discarded quotient may be inf/nan, which
        // where() does not propagate.
        auto w_norm = p.norm();
        auto g_norm = grad.norm();
        auto local_lr =
            (w_norm * options.trust_coefficient()).div_(g_norm.add(w_norm, wd).add_(options.eps()));
        local_lr = torch::where(w_norm.gt(0).logical_and(g_norm.gt(0)), local_lr,
                                torch::ones_like(local_lr));
        d.mul_(local_lr.mul_(options.lr()));
      } else {
        d.mul_(options.lr());
      }

      if (options.momentum() == 0) {
        p.sub_(d);
        continue;
      }
      auto& slot = state_[state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<LarsParamState>();
        fresh->momentum_buffer(d);  // first step: buf = d
        slot = std::move(fresh);
      } else {
        auto& buf = static_cast<LarsParamState&>(*slot).momentum_buffer();
        buf.mul_(options.momentum()).add_(d);
      }
      p.sub_(static_cast<LarsParamState&>(*slot).momentum_buffer());
    }
  }
  return loss;
}

void Lars::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
}

void Lars::load(torch::serialize::InputArchive& archive) {
  serialize(*this, archive);
}

}  // namespace gradguard::optim
