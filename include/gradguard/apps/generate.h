// `gradguard generate`: text from a model directory, to look at a fine-tune without
// leaving the tool. The prompt goes through the model's chat template when its
// tokenizer_config.json has one (a user turn, then the assistant's generation prompt, as
// Hugging Face's apply_chat_template(add_generation_prompt=True) renders it), else it is
// encoded as plain text. Tokens come one at a time from a KV cache
// (LlamaForCausalLMImpl::forward_cached): greedy at temperature 0, else nucleus (top-p)
// sampling at that temperature from a seeded generator, until an end-of-sequence token
// (the tokenizer's eos and config.json's / generation_config.json's eos_token_id), the
// token budget or the model's context.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::generate {

struct GenerateOptions {
  std::string model_dir;       // HF directory: config.json, weights, tokenizer.json
  std::string prompt;          // the user's text
  int64_t max_new_tokens = 128;  // >= 1
  double temperature = 0.0;    // 0 = greedy; > 0 divides the logits before sampling
  double top_p = 1.0;          // nucleus: sample from the smallest set of tokens whose probability reaches top_p; (0, 1]
  uint64_t seed = 0;           // of the sampling generator
  bool raw = false;            // true: no chat template, the prompt is plain text
  std::string device = "cpu";  // cpu | cuda | cuda:N
  void validate() const;       // throws gradguard::Error (bad input) naming the option (--top-p, ...)
};

struct GenerateResult {
  std::string prompt_text;          // what was encoded (the rendered template, or the prompt)
  bool chat_template = false;       // whether the template was applied
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> new_ids;     // generated, the end-of-sequence token included when one came
  std::string text;                 // new_ids decoded, special tokens skipped
  std::string stop;                 // eos | max_new_tokens | context
};

// Generates. `on_text` (may be empty) receives each new piece of decoded text as it
// comes; `on_logits` (tests) the float32 logits [vocab] each token was chosen from.
// Throws gradguard::Error (bad input) naming the directory or file when the model or its
// tokenizer cannot be read, and --prompt when the prompt alone fills the model's context.
GenerateResult generate(const GenerateOptions& options, const std::function<void(const std::string&)>& on_text = {},
                        const std::function<void(const at::Tensor&)>& on_logits = {});

// The nucleus of `probs` [vocab] (float32, summing to 1): the smallest set of the most
// probable tokens whose probability reaches top_p (the token that crosses it included),
// renormalised; the rest 0. Exposed for its test.
at::Tensor top_p_filter(const at::Tensor& probs, double top_p);

}  // namespace gradguard::generate
