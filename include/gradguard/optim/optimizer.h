// Optimizer construction. AdamW follows PyTorch exactly (decoupled weight decay, bias
// correction) with two parameter groups: weight decay on tensors with dim >= 2
// (matrices, embeddings), none on norms and biases. adam_atan2 and update clipping are
// AdamW variants with the same state (optim/adamw.h).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/core/choice.h"
#include "gradguard/optim/schedule.h"

namespace torch::optim {
class Optimizer;
}

namespace gradguard::optim {

enum class OptimizerKind { kAdamW, kLamb, kLars, kAdamAtan2 };
constexpr std::array<Choice<OptimizerKind>, 4> choices(OptimizerKind) {
  return {{{OptimizerKind::kAdamW, "adamw"},
           {OptimizerKind::kLamb, "lamb"},
           {OptimizerKind::kLars, "lars"},
           {OptimizerKind::kAdamAtan2, "adam_atan2"}}};
}

// Which AdamW kernel (optim/adamw.h); auto is resolved once the device is known.
enum class AdamWImplementation { kAuto, kFused, kForeach, kLoop };
constexpr std::array<Choice<AdamWImplementation>, 4> choices(AdamWImplementation) {
  return {{{AdamWImplementation::kAuto, "auto"},
           {AdamWImplementation::kFused, "fused"},
           {AdamWImplementation::kForeach, "foreach"},
           {AdamWImplementation::kLoop, "loop"}}};
}

struct OptimOptions {
  OptimizerKind name = OptimizerKind::kAdamW;
  double lr = 3e-3;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_trust_ratio = 10.0;
  double momentum = 0.9;
  double trust_coefficient = 0.001;
  AdamWImplementation implementation = AdamWImplementation::kAuto;
  bool update_clipping = false;
  bool decay_embeddings = false;   // weight decay on the token embedding too
  double spam_threshold = 0;       // SPAM's theta; 0 = off (optim/adamw.h)
  int64_t spam_reset_every = 500;  // SPAM's Delta T
  int64_t spam_warmup = 150;
  int64_t spam_clip_delay = 20;
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t base_batch = 0;
  void validate() const;  // throws gradguard::Error naming optim.<key>

  template <class Field>
  void fields(Field&& field) {
    field("name", name,
          "adamw (PyTorch's AdamW) | lamb (layer-wise trust ratio, You et al. 2019) | lars (momentum SGD with a "
          "layer-wise rate, You et al. 2017) | adam_atan2 (AdamW with atan2 in place of the division by "
          "sqrt(v) + eps: no eps, gradient-scale invariant; Everett et al. 2024)");
    field("lr", lr, "peak learning rate at batch base_batch; finite, > 0");
    field("betas", betas, "[beta1, beta2] of AdamW and LAMB, each in [0, 1)");
    field("eps", eps, "epsilon of AdamW and LAMB (large-batch fine-tuning often wants 1e-6); finite, > 0");
    field("weight_decay", weight_decay,
          "decay of the weight matrices (decoupled for AdamW and LAMB, L2 for LARS); norms and biases never "
          "decay, the token embedding only with decay_embeddings; 0 disables");
    field("decay_embeddings", decay_embeddings,
          "apply weight_decay to the token embedding (embed_tokens) as well; off by default: decay shrinks the rows "
          "of rare tokens toward 0 between their sightings (runs made before this key existed decayed it)");
    field("implementation", implementation,
          "adamw kernel: auto (fused where LibTorch has it, else foreach) | fused | foreach | loop (LibTorch's own); "
          "adam_atan2, update_clipping and SPAM run foreach only");
    field("update_clipping", update_clipping,
          "adamw, adam_atan2: StableAdamW's update clipping (Wortsman et al. 2023): each tensor's lr divided by "
          "max(1, RMS(g^2 / v-hat)), so a gradient spike moves a tensor no more than a typical step");
    field("spam_threshold", spam_threshold,
          "adamw, adam_atan2: SPAM (Huang et al. 2025) when > 0: a gradient coordinate with g^2 > threshold x v "
          "is clipped to sign(g) sqrt(threshold x v); the paper uses 5000; 0 = off");
    field("spam_reset_every", spam_reset_every,
          "SPAM: zero both moments every this many updates, then warm the step back up; 0 = never; >= 0");
    field("spam_warmup", spam_warmup, "SPAM: updates of cosine warmup (0.01 -> 1) after each moment reset; >= 0");
    field("spam_clip_delay", spam_clip_delay,
          "SPAM: updates after the start and after each reset before clipping starts (v needs history); >= 0");
    field("max_trust_ratio", max_trust_ratio, "lamb: clamp of the trust ratio ||w|| / ||update||; > 0");
    field("momentum", momentum, "lars: momentum; in [0, 1)");
    field("trust_coefficient", trust_coefficient, "lars: eta of the layer-wise learning rate; > 0");
    field("lr_scaling", lr_scaling,
          "none | linear | sqrt: scale lr (and schedule.min_lr) by global_batch / base_batch, or its square root");
    field("base_batch", base_batch, "sequences per step that optim.lr was tuned for; 0 = no scaling; >= 0");
  }
};

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Whether `p` (named `name`) takes weight decay under `options`: tensors of dim >= 2
// (matrices), except the token embedding (a name with "embed_tokens") unless
// options.decay_embeddings. Norm weights and biases never do.
bool decays(const std::string& name, const at::Tensor& p, const OptimOptions& options);
bool is_token_embedding(const std::string& name);

struct AdamWVariant;
// The AdamW variant `options` asks for (rule, update clipping, SPAM); adamw.h.
AdamWVariant adamw_variant(const OptimOptions& options);

// Builds the optimizer over `params`; group 0 (what decays(): the matrices) decays and is
// layer-adaptive for LAMB/LARS, the last group (norms, biases) neither. A token embedding
// that does not decay joins the last group for AdamW, and for LAMB/LARS a middle group
// that is layer-adaptive without decay.
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
