// The optimizer factory. AdamW is GroupAdamW (adamw.h): torch::optim::AdamW's update,
// which matches torch.optim.AdamW (tests/golden/adamw.json), one group at a time, or its
// adam_atan2 / update-clipping variants; LAMB and LARS are gradguard's own
// (lamb.h, lars.h). All get the same two groups: matrices and embeddings decay and are
// layer-adaptive, norm weights and biases neither.
#include "gradguard/optim/optimizer.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/lamb.h"
#include "gradguard/optim/lars.h"

namespace gradguard::optim {

void OptimOptions::validate() const {
  if (!(lr > 0) || !std::isfinite(lr))
    throw bad_input("optim.lr", "must be a finite number > 0, got " + std::to_string(lr));
  for (int i = 0; i < 2; ++i)
    if (!(betas[i] >= 0 && betas[i] < 1))
      throw bad_input("optim.betas", "each beta must be in [0, 1), got " + std::to_string(betas[i]));
  // eps = inf (or anything near 1) divides every update into nothing: the model stops
  // learning without a word. 1e-6 is already large for fine-tuning.
  if (!(eps > 0 && eps <= 1e-2))
    throw bad_input("optim.eps", "must be in (0, 0.01] (1e-8 by default, 1e-6 is common for fine-tuning), got " +
                                     format_number(eps));
  if (!(weight_decay >= 0 && weight_decay <= 10))
    throw bad_input("optim.weight_decay", "must be in [0, 10], got " + format_number(weight_decay));
  if (!(max_trust_ratio > 0) || !std::isfinite(max_trust_ratio))
    throw bad_input("optim.max_trust_ratio", "must be a finite number > 0, got " + format_number(max_trust_ratio));
  if (!(momentum >= 0 && momentum < 1))
    throw bad_input("optim.momentum", "must be in [0, 1), got " + std::to_string(momentum));
  if (base_batch < 0) throw bad_input("optim.base_batch", "must be >= 0, got " + std::to_string(base_batch));
  if (!(trust_coefficient > 0) || !std::isfinite(trust_coefficient))
    throw bad_input("optim.trust_coefficient", "must be a finite number > 0, got " + std::to_string(trust_coefficient));
  if (!(spam_threshold >= 0) || !std::isfinite(spam_threshold))
    throw bad_input("optim.spam_threshold", "must be a finite number >= 0 (0 = off; the paper uses 5000), got " +
                                                format_number(spam_threshold));
  if (spam_reset_every < 0)
    throw bad_input("optim.spam_reset_every", "must be >= 0 (0 = never), got " + std::to_string(spam_reset_every));
  if (spam_warmup < 0) throw bad_input("optim.spam_warmup", "must be >= 0, got " + std::to_string(spam_warmup));
  if (spam_clip_delay < 0)
    throw bad_input("optim.spam_clip_delay", "must be >= 0, got " + std::to_string(spam_clip_delay));
  if (spam_threshold > 0 && spam_reset_every > 0 && spam_clip_delay >= spam_reset_every)
    throw bad_input("optim.spam_clip_delay", "must be below optim.spam_reset_every (" +
                                                 std::to_string(spam_reset_every) + ") or SPAM never clips, got " +
                                                 std::to_string(spam_clip_delay));
  if (spam_threshold > 0 && name != OptimizerKind::kAdamW && name != OptimizerKind::kAdamAtan2)
    throw bad_input("optim.spam_threshold", std::string("SPAM is an AdamW variant; optim.name is ") +
                                                (name == OptimizerKind::kLamb ? "lamb" : "lars"));
  if (update_clipping && name != OptimizerKind::kAdamW && name != OptimizerKind::kAdamAtan2)
    throw bad_input("optim.update_clipping", std::string("applies to adamw and adam_atan2, not to ") +
                                                 (name == OptimizerKind::kLamb ? "lamb" : "lars") +
                                                 " (their trust ratio already bounds each tensor's step)");
}

AdamWVariant adamw_variant(const OptimOptions& options) {
  AdamWVariant v;
  v.rule = options.name == OptimizerKind::kAdamAtan2 ? AdamWRule::kAtan2 : AdamWRule::kAdam;
  v.update_clipping = options.update_clipping;
  v.spam = {options.spam_threshold, options.spam_reset_every, options.spam_warmup, options.spam_clip_delay};
  return v;
}

bool is_token_embedding(const std::string& name) { return name.find("embed_tokens") != std::string::npos; }

bool decays(const std::string& name, const at::Tensor& p, const OptimOptions& options) {
  return p.dim() >= 2 && (options.decay_embeddings || !is_token_embedding(name));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const NamedParameters& params,
                                                        const OptimOptions& options) {
  options.validate();
  const bool adamw = options.name == OptimizerKind::kAdamW || options.name == OptimizerKind::kAdamAtan2;
  // embedding: matrices kept out of the decay (the token embedding); AdamW has no layer
  // adaptation to keep, so there they simply do not decay.
  std::vector<torch::Tensor> decay, embedding, no_decay;
  for (const auto& [name, p] : params)
    (decays(name, p, options) ? decay : p.dim() >= 2 && !adamw ? embedding : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto add_groups = [&](const auto& base, auto with) {
    using Options = std::decay_t<decltype(base)>;
    groups.emplace_back(decay, std::make_unique<Options>(with(Options(base), options.weight_decay, true)));
    if (!embedding.empty()) groups.emplace_back(embedding, std::make_unique<Options>(with(Options(base), 0.0, true)));
    groups.emplace_back(no_decay, std::make_unique<Options>(with(Options(base), 0.0, false)));
  };
  if (adamw) {
    auto base = torch::optim::AdamWOptions(options.lr).betas({options.betas[0], options.betas[1]}).eps(options.eps);
    add_groups(base, [](torch::optim::AdamWOptions o, double wd, bool) { return o.weight_decay(wd); });
    const auto device = params.empty() ? c10::Device(c10::kCPU) : params.front().second.device();
    const auto variant = adamw_variant(options);
    // The variants run foreach: auto resolves to it, an explicit fused or loop is refused.
    const auto kernel = !variant.plain() && options.implementation == AdamWImplementation::kAuto
                            ? AdamWKernel::foreach
                            : resolve_adamw_kernel(options.implementation, device);
    return std::make_unique<GroupAdamW>(std::move(groups), base, kernel, variant);
  }
  if (options.name == OptimizerKind::kLamb) {
    auto base = LambOptions(options.lr)
                    .betas({options.betas[0], options.betas[1]})
                    .eps(options.eps)
                    .max_trust_ratio(options.max_trust_ratio);
    add_groups(base, [](LambOptions o, double wd, bool adaptive) { return o.weight_decay(wd).adaptive(adaptive); });
    return std::make_unique<Lamb>(std::move(groups), base);
  }
  auto base = LarsOptions(options.lr).momentum(options.momentum).trust_coefficient(options.trust_coefficient);
  add_groups(base, [](LarsOptions o, double wd, bool adaptive) { return o.weight_decay(wd).adaptive(adaptive); });
  return std::make_unique<Lars>(std::move(groups), base);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups())
    group.options().set_lr(lr);
}

ParamMoments moments_of(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  ParamMoments out;
  auto& state = optimizer.state();
  auto it = state.find(compat::state_key(param));
  if (it == state.end()) return out;
  auto* base = it->second.get();
  if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(base)) {
    out.exp_avg = a->exp_avg();
    out.exp_avg_sq = a->exp_avg_sq();
    out.step = a->step();
  } else if (auto* l = dynamic_cast<LambParamState*>(base)) {
    out.exp_avg = l->exp_avg();
    out.exp_avg_sq = l->exp_avg_sq();
    out.step = l->step();
  } else if (auto* r = dynamic_cast<LarsParamState*>(base)) {
    out.momentum_buffer = r->momentum_buffer();
  }
  return out;
}

bool reset_moments(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  // Erasing the entry is what a fresh optimizer looks like: the next step() recreates
  // zero moments with step 0.
  return optimizer.state().erase(compat::state_key(param)) > 0;
}

}  // namespace gradguard::optim
