// Hugging Face style model directories: config.json (LlamaConfig keys) plus
// model.safetensors with HF Llama tensor names. gradguard writes its model checkpoints
// this way and reads them back (or a real HF Llama directory) for `model.init_from`.
#pragma once

#include <string>

#include "gradguard/model/llama.h"

namespace gradguard::checkpoint {

// Writes <dir>/config.json and <dir>/model.safetensors (float32 or the parameters' dtype),
// each atomically. Creates `dir`. With max_shard_bytes > 0 and a model larger than that,
// writes shards model-00001-of-0000N.safetensors (whole tensors, in parameter order, each
// shard at most max_shard_bytes unless one tensor alone is larger) and the
// model.safetensors.index.json that Hugging Face writes ({"metadata": {"total_size"},
// "weight_map": {tensor: shard file}}).
void save_hf_model(const std::string& dir, model::LlamaForCausalLMImpl& model, int64_t max_shard_bytes = 0);

// Reads <dir>/config.json into model options (architecture keys only; the rest of
// `base` is kept). Throws gradguard::Error (bad input) naming config.json and the key
// when a key is missing, has the wrong type or describes an unsupported model.
model::LlamaOptions read_hf_config(const std::string& dir, const model::LlamaOptions& base);

// Copies the tensors of <dir>/model.safetensors, or of the shards listed by
// <dir>/model.safetensors.index.json, into the model's parameters (converting dtype). Every parameter must be present with the same shape; extra tensors are an
// error except lm_head.weight of a tied model and rotary caches. Errors name the file
// and the tensor. Nothing is modified unless every tensor checks out.
void load_hf_weights(const std::string& dir, model::LlamaForCausalLMImpl& model);

}  // namespace gradguard::checkpoint
