// HF directory I/O. The config mapping is LlamaConfig's: hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (defaults to
// num_attention_heads when absent, as HF does), vocab_size, max_position_embeddings,
// rms_norm_eps, rope_theta (default 10000), tie_word_embeddings (default false).
#include "gradguard/checkpoint/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/fs.h"

namespace gradguard::checkpoint {

namespace {

// Every tensor of a (possibly sharded) HF directory, with the file each came from.
std::map<std::string, at::Tensor> load_all_tensors(const std::string& dir, std::string* source) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(single) || !fs::exists(index_path)) {
    *source = single;
    return load_safetensors(single).tensors;
  }
  *source = index_path;
  const nlohmann::json index = read_json_file(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw bad_input(index_path, "has no \"weight_map\" object");
  std::map<std::string, std::string> file_of;  // tensor -> shard file
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw bad_input(index_path, "weight_map entry '" + it.key() + "' is not a file name");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      throw bad_input(index_path, "weight_map entry '" + it.key() + "' names '" + file + "', not a file in " + dir);
    file_of[it.key()] = file;
  }
  std::map<std::string, at::Tensor> all;
  std::map<std::string, SafetensorsContents> shards;  // file -> contents
  for (const auto& [name, file] : file_of) {
    if (!shards.count(file)) shards.emplace(file, load_safetensors(dir + "/" + file));
    auto& tensors = shards.at(file).tensors;
    auto t = tensors.find(name);
    if (t == tensors.end())
      throw bad_input(dir + "/" + file, "does not hold tensor '" + name + "' that " + index_path + " places there");
    all.emplace(name, t->second);
  }
  return all;
}

}  // namespace

void save_hf_model(const std::string& dir, model::LlamaForCausalLMImpl& model, int64_t max_shard_bytes) {
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
  int64_t total = 0;
  for (const auto& item : model.named_parameters()) {
    tensors.emplace_back(item.key(), item.value());
    total += item.value().numel() * item.value().element_size();
  }
  if (max_shard_bytes <= 0 || total <= max_shard_bytes) {
    save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  } else {
    std::vector<NamedTensors> shards(1);
    int64_t in_shard = 0;
    for (auto& nt : tensors) {
      const int64_t bytes = nt.second.numel() * nt.second.element_size();
      if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
      shards.back().push_back(nt);
      in_shard += bytes;
    }
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::ordered_json::object()}};
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      save_safetensors(dir + "/" + name, shards[i], {{"format", "pt"}});
      for (const auto& nt : shards[i]) index["weight_map"][nt.first] = name;
    }
    fs::write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  fs::write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
}

model::LlamaOptions read_hf_config(const std::string& dir, const model::LlamaOptions& base) {
  const std::string path = dir + "/config.json";
  const nlohmann::json cfg = read_json_file(path);
  auto get_int = [&](const char* key, std::optional<int64_t> fallback) -> int64_t {
    if (!cfg.contains(key)) {
      if (fallback) return *fallback;
      throw bad_input(path, std::string("missing key '") + key + "'");
    }
    if (!cfg[key].is_number_integer())
      throw bad_input(path, std::string("key '") + key + "' must be an integer, got " + describe(cfg[key]));
    return cfg[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double fallback) -> double {
    if (!cfg.contains(key)) return fallback;
    // null is what JSON makes of inf or NaN: not the default, a value lost.
    if (!cfg[key].is_number())
      throw bad_input(path, std::string("key '") + key + "' must be a number, got " + describe(cfg[key]));
    return cfg[key].get<double>();
  };
  if (cfg.contains("model_type") && cfg["model_type"] != "llama")
    throw bad_input(path, "model_type " + describe(cfg["model_type"]) + " is not supported (only \"llama\")");
  if (cfg.contains("hidden_act") && cfg["hidden_act"] != "silu")
    throw bad_input(path, "hidden_act " + describe(cfg["hidden_act"]) + " is not supported (only \"silu\")");
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
    throw bad_input(path, "rope_scaling " + describe(cfg["rope_scaling"]) +
                              " is not supported (only plain RoPE: rope_scaling null or absent)");
  // Keys the model would otherwise ignore while loading weights of another shape or
  // meaning: refused rather than read as the defaults.
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null()) {
    const int64_t head_dim = get_int("head_dim", std::nullopt);
    if (o.num_heads <= 0 || head_dim * o.num_heads != o.hidden_size) {
      throw bad_input(path, "head_dim " + std::to_string(head_dim) + " is not hidden_size / num_attention_heads (" +
                                std::to_string(o.hidden_size) + " / " + std::to_string(o.num_heads) +
                                "): a separate head size is not supported");
    }
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (!cfg.contains(key) || cfg[key].is_null()) continue;
    if (!cfg[key].is_boolean()) throw bad_input(path, std::string("key '") + key + "' must be true or false, got " + describe(cfg[key]));
    if (cfg[key].get<bool>()) throw bad_input(path, std::string(key) + " true is not supported (Llama's projections have no bias)");
  }
  if (cfg.contains("tie_word_embeddings") && !cfg["tie_word_embeddings"].is_boolean())
    throw bad_input(path, "key 'tie_word_embeddings' must be true or false, got " + describe(cfg["tie_word_embeddings"]));
  o.tie_embeddings = cfg.value("tie_word_embeddings", false);
  try {
    o.validate();
  } catch (const Error& e) {
    throw bad_input(path, std::string("describes an unsupported model: ") + e.what());
  }
  return o;
}

void load_hf_weights(const std::string& dir, model::LlamaForCausalLMImpl& model) {
  std::string path;
  SafetensorsContents contents;
  contents.tensors = load_all_tensors(dir, &path);
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
