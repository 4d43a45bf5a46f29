// GroupAdamW: tensors of a parameter group are bucketed by (step count, device, dtype)
// and each bucket is updated with one fused kernel or one sequence of multi-tensor ops.
#include "gradguard/optim/adamw.h"

#include <cmath>
#include <map>
#include <tuple>

#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
namespace {

using Bucket = AdamWLists;

// LibTorch's AdamW update, op for op, over lists of tensors.
void foreach_update(Bucket& b, int64_t step, const torch::optim::AdamWOptions& o) {
  const double lr = o.lr(), beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  if (o.weight_decay() != 0) at::_foreach_mul_(b.params, 1 - lr * o.weight_decay());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  at::_foreach_mul_(b.exp_avgs, beta1);
  at::_foreach_add_(b.exp_avgs, b.grads, 1 - beta1);
  at::_foreach_mul_(b.exp_avg_sqs, beta2);
  at::_foreach_addcmul_(b.exp_avg_sqs, b.grads, b.grads, 1 - beta2);
  auto denom = at::_foreach_sqrt(b.exp_avg_sqs);
  at::_foreach_div_(denom, std::sqrt(bias_correction2));
  at::_foreach_add_(denom, o.eps());
  at::_foreach_addcdiv_(b.params, b.exp_avgs, denom, -lr / bias_correction1);
}

void fused_update(Bucket& b, int64_t step, const torch::optim::AdamWOptions& o) {
  // The kernel reads each tensor's step count (already incremented, as torch.optim does
  // before calling it) and never writes it, so one tensor serves the whole bucket.
  auto steps_tensor = torch::full({}, static_cast<double>(step),
                                  torch::TensorOptions().dtype(torch::kFloat).device(b.params[0].device()));
  std::vector<at::Tensor> steps(b.params.size(), steps_tensor);
  compat::fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, steps, o.lr(), std::get<0>(o.betas()),
                       std::get<1>(o.betas()), o.weight_decay(), o.eps());
}

// Adam-atan2, update clipping and/or SPAM (adamw.h), one tensor at a time. The per-tensor
// learning rate of update clipping stays a 0-dim tensor on the device: no host read.
void variant_update(Bucket& b, int64_t step, const torch::optim::AdamWOptions& o, const AdamWVariant& variant) {
  const AdamWRule rule = variant.rule;
  const bool clip = variant.update_clipping;
  const SpamRule& spam = variant.spam;
  const double lr = o.lr() * spam.lr_factor(step), beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double wd = o.weight_decay(), eps = o.eps(), decay_lr = o.lr();
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  for (size_t i = 0; i < b.params.size(); ++i) {
    auto& p = b.params[i];
    at::Tensor g = b.grads[i];
    auto& m = b.exp_avgs[i];
    auto& v = b.exp_avg_sqs[i];
    if (spam.resets_at(step)) m.zero_(), v.zero_();
    if (spam.clips_at(step)) {
      const auto bound = v * spam.threshold;  // g^2 may not exceed it
      g = torch::where((g * g > bound) & (v > 0), g.sign() * bound.sqrt(), g);
    }
    m.mul_(beta1).add_(g, 1 - beta1);
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    const auto v_hat = v / bias_correction2;
    const auto m_hat = m / bias_correction1;
    const auto direction = rule == AdamWRule::kAtan2 ? at::atan2(m_hat, v_hat.sqrt() * kAtan2B) * kAtan2A
                                                     : m_hat / (v_hat.sqrt() + eps);
    if (clip) {
      const auto rms = (g * g / v_hat.clamp_min(eps * eps)).mean().sqrt();
      const auto tensor_lr = lr / rms.clamp_min(1.0);  // 0-dim, on p's device
      if (wd != 0) p.mul_(1 - (decay_lr / rms.clamp_min(1.0)) * wd);
      p.sub_(direction * tensor_lr);
    } else {
      if (wd != 0) p.mul_(1 - decay_lr * wd);
      p.add_(direction, -lr);
    }
  }
}

}  // namespace

double SpamRule::lr_factor(int64_t t) const {
  if (!enabled() || reset_every == 0 || t < reset_every) return 1.0;
  const int64_t k = t % reset_every;
  if (k >= warmup) return 1.0;
  return 1.0 - 0.99 * (1.0 + std::cos(M_PI * static_cast<double>(k) / static_cast<double>(warmup + 1))) / 2.0;
}

std::string AdamWVariant::describe() const {
  std::string out;
  auto add = [&](const char* what) { out += (out.empty() ? "" : ", ") + std::string(what); };
  if (rule == AdamWRule::kAtan2) add("adam_atan2");
  if (update_clipping) add("optim.update_clipping");
  if (spam.enabled()) add("optim.spam_threshold");
  return out;
}

void adamw_update(AdamWLists& b, int64_t step, const torch::optim::AdamWOptions& options, AdamWKernel kernel,
                  const AdamWVariant& variant) {
  if (b.params.empty()) return;
  // The fused kernel needs every tensor of the bucket on one device of a kind it
  // supports; a bucket elsewhere (e.g. a CPU tensor in a CUDA run) takes foreach.
  if (!variant.plain())
    variant_update(b, step, options, variant);
  else if (kernel == AdamWKernel::fused && compat::fused_adamw_available(b.params[0].device().type()))
    fused_update(b, step, options);
  else
    foreach_update(b, step, options);
}

AdamWKernel resolve_adamw_kernel(AdamWImplementation implementation, const c10::Device& device) {
  if (implementation == AdamWImplementation::kForeach) return AdamWKernel::foreach;
  if (implementation == AdamWImplementation::kLoop) return AdamWKernel::loop;
  const bool fused = compat::fused_adamw_available(device.type());
  if (implementation == AdamWImplementation::kAuto) return fused ? AdamWKernel::fused : AdamWKernel::foreach;
  if (!fused)  // "fused" asked for
    throw bad_input("optim.implementation", "'fused' AdamW is not available for " + device.str() + " in LibTorch " +
                                                std::to_string(TORCH_VERSION_MAJOR) + "." +
                                                std::to_string(TORCH_VERSION_MINOR) +
                                                " (CUDA needs >= 2.0, the CPU >= 2.4); use auto or foreach");
  return AdamWKernel::fused;
}

const char* to_string(AdamWKernel kernel) {
  switch (kernel) {
    case AdamWKernel::fused: return "fused";
    case AdamWKernel::foreach: return "foreach";
    case AdamWKernel::loop: return "loop";
  }
  return "?";
}

GroupAdamW::GroupAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
                       AdamWKernel kernel, AdamWVariant variant)
    : torch::optim::AdamW(std::move(groups), defaults), kernel_(kernel), variant_(std::move(variant)) {
  TORCH_CHECK(!defaults.amsgrad(), "GroupAdamW does not implement amsgrad");
  if (!variant_.plain() && kernel_ != AdamWKernel::foreach)
    throw bad_input("optim.implementation", std::string("'") + to_string(kernel_) + "' has no kernel for " +
                                                variant_.describe() + "; use auto or foreach");
}

torch::Tensor GroupAdamW::step(LossClosure closure) {
  if (kernel_ == AdamWKernel::loop) return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "GroupAdamW does not implement amsgrad");
    using Key = std::tuple<int64_t, int, int, int>;  // step, device type, device index, dtype
    std::map<Key, Bucket> buckets;
    std::map<Key, std::vector<torch::optim::AdamWParamState*>> bucket_states;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "AdamW does not support sparse gradients");
      auto key = compat::state_key(p);
      auto it = states.find(key);
      if (it == states.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = states.emplace(key, std::move(fresh)).first;
      }
      auto* st = static_cast<torch::optim::AdamWParamState*>(it->second.get());
      auto& b = buckets[Key{st->step(), static_cast<int>(p.device().type()), p.device().index(),
                            static_cast<int>(p.scalar_type())}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(st->exp_avg());
      b.exp_avg_sqs.push_back(st->exp_avg_sq());
      bucket_states[Key{st->step(), static_cast<int>(p.device().type()), p.device().index(),
                        static_cast<int>(p.scalar_type())}]
          .push_back(st);
    }
    for (auto& [key, b] : buckets) {
      const int64_t step = std::get<0>(key) + 1;
      for (auto* st : bucket_states[key]) st->step(step);
      adamw_update(b, step, options, kernel_, variant_);
    }
  }
  return loss;
}

}  // namespace gradguard::optim
