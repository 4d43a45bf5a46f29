// The mapping between a Hugging Face config.json and LlamaOptions, for the families the
// model implements: Llama (with head_dim, attention_bias, mlp_bias, Llama 3.1
// rope_scaling), Mistral without a binding sliding window, Qwen2/2.5 and Qwen3
// (docs/models.md has the whole table).
//
// Reading is strict in one direction only: a key that would change the model's math is
// either honoured or refused with an error naming it, never dropped; a key that cannot
// change the math (token ids, dtype, generation settings, bookkeeping) is accepted
// whatever its value. A key gradguard does not know is refused, since it cannot tell
// which kind it is. Writing starts from the source directory's config.json, so every key
// survives a fine-tune and an export, and overwrites what the model itself decides.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "gradguard/model/llama.h"

namespace gradguard::checkpoint {

// `cfg` (the parsed config.json at `path`, for messages) -> options: architecture fields
// from `cfg`, everything else from `base`. Throws gradguard::Error (bad input) naming
// `path` and the key when a key is missing, has the wrong type, or describes a model the
// options cannot express.
model::LlamaOptions options_from_hf_config(const nlohmann::json& cfg, const std::string& path,
                                           const model::LlamaOptions& base);

// config.json for a model with options `o` whose parameters are stored as `dtype`
// ("float32", "bfloat16", "float16"): `source` (the config.json the model came from, or
// an empty object) with every key the model determines overwritten, model_type and
// architectures included when the options no longer fit the source's family. Reading the
// result back gives `o`'s architecture fields.
nlohmann::ordered_json hf_config_from_options(const model::LlamaOptions& o, const nlohmann::ordered_json& source,
                                              const std::string& dtype);

// Reads <dir>/config.json into model options: the architecture keys (options_from_hf_config), and
// init_from = dir (the options describe the model stored there); the rest of `base` is
// kept. Throws gradguard::Error (bad input) naming config.json and the key when a key is
// missing, has the wrong type, describes an unsupported model or is unknown.
model::LlamaOptions read_hf_config(const std::string& dir, const model::LlamaOptions& base);

}  // namespace gradguard::checkpoint
