// HF directory I/O: tensors here, the config.json mapping in hf_config.cpp. A saved
// directory carries on the directory the model came from (LlamaOptions::init_from): its
// config.json keys, updated where the model decides, and its tokenizer files, so that a
// fine-tune of an HF model exports as a complete HF model directory.
#include "gradguard/checkpoint/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include <torch/torch.h>

#include "gradguard/checkpoint/hf_config.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/fs.h"

namespace gradguard::checkpoint {

namespace {

// Where a model directory's weights are: model.safetensors (an empty map), or the shard
// file of every tensor that model.safetensors.index.json lists (tensor -> file name).
// *source is the file that says so, for messages.
std::map<std::string, std::string> shard_files(const std::string& dir, std::string* source) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(single) || !fs::exists(index_path)) {
    *source = single;
    return {};
  }
  *source = index_path;
  const nlohmann::json index = read_json_file(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw bad_input(index_path, "has no \"weight_map\" object");
  std::map<std::string, std::string> file_of;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw bad_input(index_path, "weight_map entry '" + it.key() + "' is not a file name");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      throw bad_input(index_path, "weight_map entry '" + it.key() + "' names '" + file + "', not a file in " + dir);
    file_of[it.key()] = file;
  }
  return file_of;
}

// The shapes of every tensor of a model directory's weights, from their headers alone
// (the files are memory-mapped, so only the header pages are read, whatever the size).
std::map<std::string, std::vector<int64_t>> weight_shapes(const std::string& dir, std::string* source) {
  const auto file_of = shard_files(dir, source);
  std::set<std::string> files;
  if (file_of.empty()) files.insert(*source);
  for (const auto& [name, file] : file_of) files.insert(dir + "/" + file);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& f : files) {
    if (!fs::exists(f)) continue;  // the full load names what is missing
    const fs::MappedFile bytes(f);
    for (const auto& e : parse_safetensors_header(f, bytes.data(), bytes.size()).entries) shapes[e.name] = e.shape;
  }
  return shapes;
}

// Every tensor of a (possibly sharded) HF directory.
std::map<std::string, at::Tensor> load_all_tensors(const std::string& dir, std::string* source) {
  const auto file_of = shard_files(dir, source);
  if (file_of.empty()) return load_safetensors(*source).tensors;
  std::map<std::string, at::Tensor> all;
  std::map<std::string, SafetensorsContents> shards;  // file -> contents
  for (const auto& [name, file] : file_of) {
    if (!shards.count(file)) shards.emplace(file, load_safetensors(dir + "/" + file));
    auto& tensors = shards.at(file).tensors;
    auto t = tensors.find(name);
    if (t == tensors.end())
      throw bad_input(dir + "/" + file, "does not hold tensor '" + name + "' that " + *source + " places there");
    all.emplace(name, t->second);
  }
  return all;
}

// HF's names for parameter dtypes (config.json torch_dtype), both ways.
constexpr std::pair<c10::ScalarType, const char*> kHfDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kHalf, "float16"}, {at::kDouble, "float64"}};

std::string hf_dtype_name(c10::ScalarType t) {
  for (const auto& [dtype, name] : kHfDtypeNames)
    if (dtype == t) return name;
  return c10::toString(t);
}

}  // namespace

void save_hf_model(const std::string& dir, model::LlamaForCausalLMImpl& model, int64_t max_shard_bytes, bool merged) {
  const auto& o = model.options();
  const std::string& source_dir = o.init_from;
  nlohmann::ordered_json source = nlohmann::ordered_json::object();
  if (!source_dir.empty() && fs::exists(source_dir + "/config.json")) {
    const std::string source_path = source_dir + "/config.json";
    source = parse_ordered_json(fs::read_file(source_path, JsonLimits{}.max_bytes), source_path);
  }
  const auto cfg = hf_config_from_options(o, source, hf_dtype_name(model.model->embed_tokens->weight.scalar_type()));
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  int64_t total = 0;
  if (merged) {
    for (auto& [name, t] : model::merged_weights(model)) tensors.emplace_back(name, t);
  } else {
    for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& nt : tensors) total += nt.second.numel() * nt.second.element_size();
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
  // The source's tokenizer and generation files, unchanged (a directory saved onto itself
  // keeps its own).
  std::error_code same_error;
  if (!source_dir.empty() && !std::filesystem::equivalent(source_dir, dir, same_error)) {
    for (const char* name : kHfSideFiles) {
      const std::string from = source_dir + "/" + name;
      if (fs::exists(from)) fs::write_file_atomic(dir + "/" + name, fs::read_file(from));
    }
  }
  const std::string lora_path = dir + "/lora.json";
  if (!merged && model.lora().enabled()) {
    fs::write_file_atomic(lora_path, model::peft_adapter_config(model.lora(), source_dir).dump(2) + "\n");
  } else if (fs::exists(lora_path)) {
    std::filesystem::remove(lora_path);  // a plain model written over a LoRA one
  }
  fs::write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
}

void save_peft_adapter(const std::string& dir, model::LlamaForCausalLMImpl& model, const std::string& base) {
  TORCH_INTERNAL_ASSERT(model.lora().enabled(), "save_peft_adapter needs a model with adapters");
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  for (auto& [name, t] : model::peft_adapter_tensors(model)) tensors.emplace_back(name, t);
  save_safetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  fs::write_file_atomic(dir + "/adapter_config.json", model::peft_adapter_config(model.lora(), base).dump(2) + "\n");
}

model::LoraOptions read_lora_config(const std::string& dir) {
  const std::string path = dir + "/lora.json";
  if (!fs::exists(path)) return model::LoraOptions{};
  return model::lora_from_peft_config(read_json_file(path), path);
}

model::LlamaForCausalLM load_hf_model(const std::string& dir, const model::LlamaOptions& base) {
  const auto options = read_hf_config(dir, base);
  check_weights_fit_config(dir, options);
  model::LlamaForCausalLM model(options);
  const auto lora = read_lora_config(dir);
  if (lora.enabled()) {
    try {
      model::add_lora(*model, lora);
    } catch (const Error& e) {
      throw bad_input(dir + "/lora.json", std::string("cannot be applied to the model of config.json: ") + e.what());
    }
  }
  load_hf_weights(dir, *model);
  return model;
}

c10::ScalarType saved_weights_dtype(const std::string& dir) {
  const auto config = read_json_file(dir + "/config.json");
  const auto it = config.is_object() ? config.find("torch_dtype") : config.end();
  if (it != config.end() && it->is_string())
    for (const auto& [dtype, name] : kHfDtypeNames)
      if (*it == name) return dtype;
  return at::kFloat;
}

void check_weights_fit_config(const std::string& dir, const model::LlamaOptions& o) {
  std::string source;
  const auto shapes = weight_shapes(dir, &source);
  const std::vector<int64_t> embed = {o.vocab_size, o.hidden_size};
  const auto it = shapes.find("model.embed_tokens.weight");
  const auto another = [&](const std::string& what) {
    return bad_input(source, what + ": the weights belong to another model than " + dir +
                                 "/config.json describes (refused before the model was allocated)");
  };
  if (it != shapes.end() && it->second != embed) {
    std::ostringstream msg;  // shapes printed as LibTorch prints sizes, as load_hf_weights does
    msg << "holds model.embed_tokens.weight of shape " << at::IntArrayRef(it->second)
        << ", config.json's vocab_size x hidden_size is " << at::IntArrayRef(embed);
    throw another(msg.str());
  }
  int64_t layers = 0;
  for (const auto& [name, shape] : shapes) {
    (void)shape;
    if (name.rfind("model.layers.", 0) != 0) continue;
    const auto end = name.find('.', 13);
    try {
      layers = std::max<int64_t>(layers, std::stoll(name.substr(13, end - 13)) + 1);
    } catch (const std::exception&) {
      // not a layer index: the full load names the tensor as unexpected
    }
  }
  if (layers > 0 && layers != o.num_layers)
    throw another("holds " + std::to_string(layers) + " decoder layers, config.json's num_hidden_layers is " +
                  std::to_string(o.num_layers));
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
    if (expected.count(name) || ignorable) continue;
    if (model::is_lora_name(name))
      throw bad_input(path, "holds the LoRA adapter tensor '" + name + "' and the model being loaded has no adapter "
                            "there: it is a LoRA checkpoint (see its lora.json); load it with its adapters, or "
                            "`gradguard export` it to get the merged model");
    throw bad_input(path, "unexpected tensor '" + name + "' (not a parameter of this model)");
  }
  torch::NoGradGuard no_grad;
  for (auto& item : params) item.value().copy_(contents.tensors.at(item.key()));
}

}  // namespace gradguard::checkpoint
