// LoRA adapters on the decoder's projections (model/lora.h).
#include "gradguard/model/lora.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/model/llama.h"

namespace gradguard::model {
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// Every projection of the model with its adapter slot, its HF name and its target.
struct Slot {
  std::string name;  // "model.layers.3.self_attn.q_proj"
  torch::nn::Linear* base;
  LoraAdapter* lora;
  LoraTarget target;
};

std::vector<Slot> slots(LlamaForCausalLMImpl& model) {
  std::vector<Slot> out;
  int64_t i = 0;
  for (const auto& layer_module : *model.model->layers) {
    auto* layer = layer_module->as<DecoderLayer>();
    const std::string prefix = "model.layers." + std::to_string(i++) + ".";
    auto& at = *layer->self_attn;
    auto& mlp = *layer->mlp;
    out.push_back({prefix + "self_attn.q_proj", &at.q_proj, &at.q_lora, LoraTarget::kQ});
    out.push_back({prefix + "self_attn.k_proj", &at.k_proj, &at.k_lora, LoraTarget::kK});
    out.push_back({prefix + "self_attn.v_proj", &at.v_proj, &at.v_lora, LoraTarget::kV});
    out.push_back({prefix + "self_attn.o_proj", &at.o_proj, &at.o_lora, LoraTarget::kO});
    out.push_back({prefix + "mlp.gate_proj", &mlp.gate_proj, &mlp.gate_lora, LoraTarget::kGate});
    out.push_back({prefix + "mlp.up_proj", &mlp.up_proj, &mlp.up_lora, LoraTarget::kUp});
    out.push_back({prefix + "mlp.down_proj", &mlp.down_proj, &mlp.down_lora, LoraTarget::kDown});
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool LoraOptions::targets_has(LoraTarget t) const {
  for (auto x : targets)
    if (x == t) return true;
  return false;
}

void LoraOptions::validate(bool activation_checkpointing) const {
  if (rank < 0 || rank > 4096)
    throw bad_input("lora.rank", "must be in [0, 4096] (0 = no adapters), got " + std::to_string(rank));
  if (!enabled()) return;
  if (!(std::isfinite(alpha) && alpha > 0 && alpha <= 1e6))
    throw bad_input("lora.alpha", "must be a finite number in (0, 1e6], got " + format_number(alpha));
  if (!(std::isfinite(dropout) && dropout >= 0 && dropout < 1))
    throw bad_input("lora.dropout", "must be in [0, 1), got " + format_number(dropout));
  if (targets.empty()) throw bad_input("lora.targets", "must name at least one projection (" + choice_list<LoraTarget>() + ")");
  for (size_t i = 0; i < targets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (targets[i] == targets[j])
        throw bad_input("lora.targets", std::string("names ") + name_of(targets[i]) + " twice");
  if (dropout > 0 && activation_checkpointing)
    throw bad_input("lora.dropout",
                    "must be 0 with model.activation_checkpointing: the recomputation in backward would draw "
                    "another dropout mask, got " + format_number(dropout));
}

torch::Tensor project(const torch::nn::Linear& base, const LoraAdapter& lora, const torch::Tensor& x, bool training) {
  auto y = base.ptr()->forward(x);
  if (!lora.active()) return y;
  auto in = training && lora.dropout > 0 ? torch::dropout(x, lora.dropout, /*train=*/true) : x;
  return y + lora.b.ptr()->forward(lora.a.ptr()->forward(in)) * lora.scale;
}

void add_lora(LlamaForCausalLMImpl& model, const LoraOptions& options) {
  options.validate(model.options().activation_checkpointing);
  if (!options.enabled()) return;
  if (model.lora_.enabled()) throw bad_input("lora", "the model already has adapters");
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.requires_grad_(false);
  for (auto& slot : slots(model)) {
    if (!options.targets_has(slot.target)) continue;
    auto& base = *slot.base;
    const int64_t in = base->weight.size(1), out = base->weight.size(0);
    const auto dtype = base->weight.scalar_type();
    LoraAdapter& a = *slot.lora;
    a.a = torch::nn::Linear(torch::nn::LinearOptions(in, options.rank).bias(false));
    a.b = torch::nn::Linear(torch::nn::LinearOptions(options.rank, out).bias(false));
    // A: Kaiming-uniform with a = sqrt(5), i.e. uniform(-1/sqrt(in), 1/sqrt(in)) (what
    // nn.Linear's constructor drew already, drawn again here so the bound is explicit); B: 0.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    a.a->weight.uniform_(-bound, bound);
    a.b->weight.zero_();
    a.a->to(base->weight.device(), dtype);
    a.b->to(base->weight.device(), dtype);
    a.a->weight.set_requires_grad(true);
    a.b->weight.set_requires_grad(true);
    a.scale = options.scale();
    a.dropout = options.dropout;
    base->register_module("lora_A", a.a);
    base->register_module("lora_B", a.b);
    if (!model.is_training()) {
      a.a->eval();
      a.b->eval();
    }
  }
  model.lora_ = options;
}

bool is_lora_name(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

std::vector<std::pair<std::string, torch::Tensor>> merged_weights(LlamaForCausalLMImpl& model) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> merged;  // weight name -> W + s B A
  for (auto& slot : slots(model)) {
    if (!slot.lora->active()) continue;
    const auto& w = (*slot.base)->weight;
    auto delta = torch::matmul(slot.lora->b->weight.to(torch::kFloat), slot.lora->a->weight.to(torch::kFloat));
    merged[slot.name + ".weight"] = (w.to(torch::kFloat) + delta * slot.lora->scale).to(w.scalar_type());
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    if (is_lora_name(item.key())) continue;
    auto it = merged.find(item.key());
    out.emplace_back(item.key(), it == merged.end() ? item.value().detach() : it->second);
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> peft_adapter_tensors(LlamaForCausalLMImpl& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters())
    if (is_lora_name(item.key())) out.emplace_back(kPeftPrefix + item.key(), item.value().detach());
  return out;
}

nlohmann::ordered_json peft_adapter_config(const LoraOptions& options, const std::string& base) {
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (auto t : options.targets) targets.push_back(name_of(t));
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base},
          {"r", options.rank},
          {"lora_alpha", options.alpha},
          {"lora_dropout", options.dropout},
          {"target_modules", targets},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", false},
          {"use_dora", false},
          {"modules_to_save", nullptr},
          {"init_lora_weights", true},
          {"inference_mode", true}};
}

LoraOptions lora_from_peft_config(const nlohmann::json& c, const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& what) -> void { throw bad_input(where, "\"" + key + "\" " + what); };
  if (!c.is_object()) throw bad_input(where, "is not a JSON object");
  auto string_is = [&](const char* key, const char* want, bool required) {
    if (!c.contains(key)) {
      if (required) fail(key, std::string("is missing (must be \"") + want + "\")");
      return;
    }
    if (!c[key].is_string() || c[key].get<std::string>() != want)
      fail(key, std::string("must be \"") + want + "\", got " + c[key].dump());
  };
  string_is("peft_type", "LORA", true);
  string_is("bias", "none", false);
  for (const char* key : {"fan_in_fan_out", "use_rslora", "use_dora"})
    if (c.contains(key) && !(c[key].is_boolean() && !c[key].get<bool>()))
      fail(key, "must be false (gradguard applies plain LoRA), got " + c[key].dump());
  if (c.contains("modules_to_save") && !c["modules_to_save"].is_null() &&
      !(c["modules_to_save"].is_array() && c["modules_to_save"].empty()))
    fail("modules_to_save", "must be null: gradguard trains adapters only, got " + c["modules_to_save"].dump());
  LoraOptions o;
  if (!c.contains("r") || !c["r"].is_number_integer()) fail("r", "must be an integer rank");
  o.rank = c["r"].get<int64_t>();
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number()) fail("lora_alpha", "must be a number");
  o.alpha = c["lora_alpha"].get<double>();
  if (c.contains("lora_dropout")) {
    if (!c["lora_dropout"].is_number()) fail("lora_dropout", "must be a number");
    o.dropout = c["lora_dropout"].get<double>();
  }
  if (!c.contains("target_modules") || !c["target_modules"].is_array())
    fail("target_modules", "must be a list of projection names (" + choice_list<LoraTarget>() + ")");
  o.targets.clear();
  for (const auto& t : c["target_modules"]) {
    if (!t.is_string()) fail("target_modules", "must hold names, got " + t.dump());
    o.targets.push_back(parse_choice<LoraTarget>(t.get<std::string>(), where + " \"target_modules\""));
  }
  try {
    o.validate(false);
    if (!o.enabled()) fail("r", "must be > 0, got " + std::to_string(o.rank));
  } catch (const Error& e) {
    if (e.where() == where) throw;
    throw bad_input(where, std::string("describes adapters gradguard cannot apply: ") + e.what());
  }
  return o;
}

}  // namespace gradguard::model
