// LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685):
// a frozen projection W [out, in] gains a trainable low-rank update, and the layer computes
//
//   y = x W^T (+ bias) + (alpha / r) * dropout(x) A^T B^T,   A [r, in], B [out, r]
//
// A starts as Kaiming-uniform with a = sqrt(5) (uniform in +-1/sqrt(in), as nn.Linear and
// PEFT initialise it) and B at zero, so the adapted model's first forward is the base
// model's, bit for bit. Only A and B train: the base weights have requires_grad off, get
// no gradient and no optimizer state, and the guard (norms, clipping, the detector) sees
// the adapters alone.
//
// The adapters are registered inside the projection they adapt, as PEFT names them without
// its "base_model.model." prefix: model.layers.0.self_attn.q_proj.lora_A.weight [r, in] and
// ...q_proj.lora_B.weight [out, r]. A checkpoint of a LoRA run therefore holds the base
// weights and the adapters in one model.safetensors, with the adapter settings beside it in
// a PEFT adapter_config.json (checkpoint/hf_checkpoint.h); `gradguard export` writes the
// merged model W + (alpha / r) B A and, separately, the adapter as PEFT files.
//
// Dropout draws random numbers in every forward; activation checkpointing recomputes each
// layer in backward and would draw a different mask, so the two are refused together.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/modules/linear.h>

#include "gradguard/core/choice.h"

namespace gradguard::model {

class LlamaForCausalLMImpl;

// The projections an adapter may sit on (their HF names, PEFT's target_modules).
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr std::array<Choice<LoraTarget>, 7> choices(LoraTarget) {
  return {{{LoraTarget::kQ, "q_proj"},
           {LoraTarget::kK, "k_proj"},
           {LoraTarget::kV, "v_proj"},
           {LoraTarget::kO, "o_proj"},
           {LoraTarget::kGate, "gate_proj"},
           {LoraTarget::kUp, "up_proj"},
           {LoraTarget::kDown, "down_proj"}}};
}

struct LoraOptions {
  int64_t rank = 0;  // 0 = no adapters: the whole model trains
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<LoraTarget> targets = {LoraTarget::kQ, LoraTarget::kV};

  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
  bool targets_has(LoraTarget t) const;
  // Throws gradguard::Error (bad input) naming the key ("lora.rank", ...). `activation_checkpointing`
  // is model.activation_checkpointing (dropout cannot be replayed by its recomputation).
  void validate(bool activation_checkpointing) const;

  template <class Field>
  void fields(Field&& field) {
    field("rank", rank,
          "LoRA rank r: > 0 freezes the model and trains adapters A [r, in], B [out, r] on the targets; 0 = full "
          "fine-tuning; <= 4096");
    field("alpha", alpha, "LoRA alpha: the update is scaled by alpha / rank; finite, > 0");
    field("dropout", dropout, "dropout on the adapters' input in training; in [0, 1); 0 with activation checkpointing");
    field("targets", targets,
          "projections that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (PEFT's "
          "target_modules); at least one");
  }
};

// The adapter of one projection; empty (a{nullptr}) where the projection has none.
struct LoraAdapter {
  torch::nn::Linear a{nullptr};  // weight [r, in]
  torch::nn::Linear b{nullptr};  // weight [out, r]
  double scale = 0.0;            // alpha / r
  double dropout = 0.0;

  bool active() const { return !a.is_empty(); }
};

// base(x) plus the adapter's update when it has one (dropout only when `training`).
torch::Tensor project(const torch::nn::Linear& base, const LoraAdapter& lora, const torch::Tensor& x, bool training);

// Puts adapters on the model's target projections (options.validate()d first, against
// the model's activation checkpointing) and freezes every other parameter. Call it after
// the base weights are loaded and before the model moves to its device or an optimizer
// is made; a model holds at most one set of adapters (a second call is an error).
// Initialisation draws from the default CPU generator.
void add_lora(LlamaForCausalLMImpl& model, const LoraOptions& options);

// True for the name of an adapter tensor (".lora_A.weight" / ".lora_B.weight").
bool is_lora_name(const std::string& name);

// The model's weights as a plain model of the same architecture holds them: every
// parameter but the adapters, each adapted projection's weight replaced by
// W + (alpha / r) B A (computed in float32 from the parameters, stored in W's dtype).
// Without adapters, the parameters themselves.
std::vector<std::pair<std::string, torch::Tensor>> merged_weights(LlamaForCausalLMImpl& model);

// The adapter tensors under PEFT's names ("base_model.model." + name).
std::vector<std::pair<std::string, torch::Tensor>> peft_adapter_tensors(LlamaForCausalLMImpl& model);

// PEFT's adapter_config.json for these options (peft_type LORA, task_type CAUSAL_LM, r,
// lora_alpha, lora_dropout, target_modules, bias "none", ...); base is
// base_model_name_or_path (the directory the base came from, "" when trained from scratch).
nlohmann::ordered_json peft_adapter_config(const LoraOptions& options, const std::string& base);
// The options an adapter_config.json describes. Throws gradguard::Error (bad input) naming
// `where` and the key when it is not a LoRA config gradguard can apply (another peft_type,
// bias other than "none", rslora, DoRA, fan_in_fan_out, a target it has no projection for).
LoraOptions lora_from_peft_config(const nlohmann::json& config, const std::string& where);

}  // namespace gradguard::model
