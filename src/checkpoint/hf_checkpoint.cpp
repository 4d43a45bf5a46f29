// HF directory I/O. The config mapping is LlamaConfig's: hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (defaults to
// num_attention_heads when absent, as HF does), vocab_size, max_position_embeddings,
// rms_norm_eps, rope_theta (default 10000), tie_word_embeddings (default false).
#include "gradguard/checkpoint/hf_checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

namespace gradguard::checkpoint {

void save_hf_model(const std::string& dir, model::LlamaForCausalLMImpl& model) {
  const auto& o = model.options();
  nlohmann::ordered_json cfg = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", o.hidden_size},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_heads},
      {"num_key_value_heads", o.num_kv_heads},
      {"vocab_size", o.vocab_size},
      {"max_position_embeddings", o.max_seq_len},
      {"rms_norm_eps", o.rms_norm_eps},
      {"rope_theta", o.rope_theta},
      {"tie_word_embeddings", o.tie_embeddings},
      {"hidden_act", "silu"},
      {"torch_dtype", "float32"},
  };
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  fs::write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
}

model::LlamaOptions read_hf_config(const std::string& dir, const model::LlamaOptions& base) {
  const std::string path = dir + "/config.json";
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(fs::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(path, std::string("not valid JSON: ") + e.what());
  }
  if (!cfg.is_object()) throw bad_input(path, "must hold a JSON object");
  auto get_int = [&](const char* key, std::optional<int64_t> fallback) -> int64_t {
    if (!cfg.contains(key)) {
      if (fallback) return *fallback;
      throw bad_input(path, std::string("missing key '") + key + "'");
    }
    if (!cfg[key].is_number_integer())
      throw bad_input(path, std::string("key '") + key + "' must be an integer, got " + cfg[key].dump());
    return cfg[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double fallback) -> double {
    if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
    if (!cfg[key].is_number())
      throw bad_input(path, std::string("key '") + key + "' must be a number, got " + cfg[key].dump());
    return cfg[key].get<double>();
  };
  if (cfg.contains("model_type") && cfg["model_type"] != "llama")
    throw bad_input(path, "model_type " + cfg["model_type"].dump() + " is not supported (only \"llama\")");
  if (cfg.contains("hidden_act") && cfg["hidden_act"] != "silu")
    throw bad_input(path, "hidden_act " + cfg["hidden_act"].dump() + " is not supported (only \"silu\")");
  model::LlamaOptions o = base;
  o.hidden_size = get_int("hidden_size", std::nullopt);
  o.intermediate_size = get_int("intermediate_size", std::nullopt);
  o.num_layers = get_int("num_hidden_layers", std::nullopt);
  o.num_heads = get_int("num_attention_heads", std::nullopt);
  o.num_kv_heads = get_int("num_key_value_heads", o.num_heads);
  o.vocab_size = get_int("vocab_size", std::nullopt);
  o.max_seq_len = get_int("max_position_embeddings", base.max_seq_len);
  o.rms_norm_eps = get_num("rms_norm_eps", 1e-6);
  o.rope_theta = get_num("rope_theta", 10000.0);
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null())
    throw bad_input(path, "rope_scaling is not supported");
  o.tie_embeddings = cfg.value("tie_word_embeddings", false);
  try {
    o.validate();
  } catch (const Error& e) {
    throw bad_input(path, std::string("describes an unsupported model: ") + e.what());
  }
  return o;
}

void load_hf_weights(const std::string& dir, model::LlamaForCausalLMImpl& model) {
  const std::string path = dir + "/model.safetensors";
  if (!fs::exists(path) && fs::exists(dir + "/model.safetensors.index.json"))
    throw bad_input(path, "sharded checkpoints (model.safetensors.index.json) are not supported yet");
  auto contents = load_safetensors(path);
  auto params = model.named_parameters();
  std::set<std::string> expected;
  for (const auto& item : params) {
    const std::string& name = item.key();
    expected.insert(name);
    auto it = contents.tensors.find(name);
    if (it == contents.tensors.end()) throw bad_input(path, "missing tensor '" + name + "'");
    if (it->second.sizes() != item.value().sizes()) {
      std::ostringstream msg;
      msg << "tensor '" << name << "' has shape " << it->second.sizes() << " but the model needs "
          << item.value().sizes();
      throw bad_input(path, msg.str());
    }
    if (!it->second.is_floating_point())
      throw bad_input(path, "tensor '" + name + "' has a non-floating dtype");
  }
  for (const auto& [name, t] : contents.tensors) {
    (void)t;
    bool ignorable = (name == "lm_head.weight" && model.options().tie_embeddings) ||
                     name.find("rotary_emb.inv_freq") != std::string::npos;
    if (!expected.count(name) && !ignorable)
      throw bad_input(path, "unexpected tensor '" + name + "' (not a parameter of this model)");
  }
  torch::NoGradGuard no_grad;
  for (auto& item : params) item.value().copy_(contents.tensors.at(item.key()));
}

}  // namespace gradguard::checkpoint
