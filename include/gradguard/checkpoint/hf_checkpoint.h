// Hugging Face style model directories: config.json plus model.safetensors (or shards)
// with HF tensor names. gradguard writes its model checkpoints this way and reads them
// back (or a real HF Llama, Mistral, Qwen2 or Qwen3 directory: docs/models.md) for
// `model.init_from`. The config.json mapping itself is checkpoint/hf_config.h.
#pragma once

#include <string>

#include "gradguard/checkpoint/hf_config.h"
#include "gradguard/model/llama.h"

namespace gradguard::checkpoint {

// The files of an HF model directory besides config.json and the weights: tokenizer
// and generation settings, copied unchanged by save_hf_model.
inline constexpr const char* kHfSideFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
    "chat_template.json"};

// Writes <dir>/config.json and <dir>/model.safetensors (the parameters' dtype), each
// atomically. Creates `dir`. When the model came from an HF directory
// (options().init_from), config.json keeps every key of that directory's config.json,
// updated where the model's own values decide (sizes, rope, biases, dtype, family), and
// the side files present there (kHfSideFiles) are copied, so the result is a complete
// HF model directory. With max_shard_bytes > 0 and a model larger than that, writes
// shards model-00001-of-0000N.safetensors (whole tensors, in parameter order, each
// shard at most max_shard_bytes unless one tensor alone is larger) and the
// model.safetensors.index.json that Hugging Face writes ({"metadata": {"total_size"},
// "weight_map": {tensor: shard file}}).
//
// A model with LoRA adapters (model/lora.h) is written as trained by default: the base
// weights unmerged, the adapters under their own names in the same file, and their
// settings in <dir>/lora.json (PEFT's adapter_config.json format; not under that name, so
// a library that looks for adapter_config.json does not try to load adapter files the
// directory does not have). That is what trainer checkpoints hold and what resume needs.
// With `merged` it writes the plain model instead, each adapted weight W + (alpha / r) B A,
// with no adapter tensor and no lora.json: a directory any HF Llama loader takes as is.
void save_hf_model(const std::string& dir, model::LlamaForCausalLMImpl& model, int64_t max_shard_bytes = 0,
                   bool merged = false);

// The adapters of a LoRA model as PEFT saves them: <dir>/adapter_model.safetensors (the
// names prefixed "base_model.model.") and <dir>/adapter_config.json, whose
// base_model_name_or_path is `base`. Creates `dir`. The model must have adapters.
void save_peft_adapter(const std::string& dir, model::LlamaForCausalLMImpl& model, const std::string& base);

// The LoRA settings a directory written by save_hf_model records in lora.json, or rank 0
// when it has none. Throws gradguard::Error (bad input) naming lora.json when it is not a
// LoRA configuration gradguard can apply.
model::LoraOptions read_lora_config(const std::string& dir);

// A whole model from a directory: read_hf_config(dir, base), the adapters of lora.json
// when there is one (model::add_lora), then load_hf_weights. What export and replay load.
model::LlamaForCausalLM load_hf_model(const std::string& dir, const model::LlamaOptions& base);

// The dtype a directory written by save_hf_model stores its weights in: config.json's
// torch_dtype (float32, bfloat16, float16, float64), float32 when it names none.
c10::ScalarType saved_weights_dtype(const std::string& dir);

// Compares the shapes in the weights' headers (model.safetensors or its shards; only the
// headers are read) with the model `o` describes: the embedding's [vocab_size,
// hidden_size] and the number of decoder layers. Throws gradguard::Error (bad input) naming
// the weights file and both shapes when they belong to another model, before anything of
// the model's size is allocated (a 70B config.json beside a small model's weights).
// load_hf_model calls it; so does the trainer before it builds an init_from model.
void check_weights_fit_config(const std::string& dir, const model::LlamaOptions& o);

// Copies the tensors of <dir>/model.safetensors, or of the shards listed by
// <dir>/model.safetensors.index.json, into the model's parameters (converting dtype). Every parameter must be present with the same shape; extra tensors are an
// error except lm_head.weight of a tied model and rotary caches (a LoRA adapter tensor in
// a directory loaded into a model without adapters is one). Errors name the file
// and the tensor. Nothing is modified unless every tensor checks out.
void load_hf_weights(const std::string& dir, model::LlamaForCausalLMImpl& model);

}  // namespace gradguard::checkpoint
