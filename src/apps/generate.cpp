// Generation is a loop over LlamaForCausalLMImpl::forward_cached: the prompt once, then
// one token per call, so each step costs one token's forward instead of the whole
// sequence's. Sampling happens on the host from float32 probabilities (one small copy
// per token is nothing next to a forward at any model size).
#include "gradguard/apps/generate.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/data/chat_template/chat_template.h"
#include "gradguard/data/tokenizer/tokenizer.h"

namespace gradguard::generate {
namespace {

// eos_token_id of a config.json or generation_config.json: an id or a list of ids.
void add_eos_ids(const std::string& path, std::set<int64_t>* ids) {
  if (!fs::exists(path)) return;
  const auto j = read_json_file(path);
  if (!j.contains("eos_token_id")) return;
  const auto& e = j["eos_token_id"];
  if (e.is_number_integer()) ids->insert(e.get<int64_t>());
  if (e.is_array())
    for (const auto& x : e)
      if (x.is_number_integer()) ids->insert(x.get<int64_t>());
}

bool ends_inside_a_character(const std::string& text) {
  // The decoder turns an incomplete UTF-8 sequence at the end into U+FFFD; wait for the
  // next token before printing it.
  return text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

void GenerateOptions::validate() const {
  if (model_dir.empty()) throw bad_input("--model", "is required: a Hugging Face model directory");
  if (max_new_tokens < 1 || max_new_tokens > 1000000)
    throw bad_input("--max-new-tokens", "must be in [1, 1000000], got " + std::to_string(max_new_tokens));
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw bad_input("--temperature", "must be a finite number >= 0 (0 = greedy), got " + format_number(temperature));
  if (!(top_p > 0 && top_p <= 1)) throw bad_input("--top-p", "must be in (0, 1], got " + format_number(top_p));
}

at::Tensor top_p_filter(const at::Tensor& probs, double top_p) {
  const auto sorted = probs.sort(/*dim=*/-1, /*descending=*/true);
  const auto& values = std::get<0>(sorted);
  const auto& order = std::get<1>(sorted);
  // Keep token i of the sorted list while the mass before it is below top_p: the token
  // that crosses top_p is kept, the first token always is.
  const auto before = values.cumsum(-1) - values;
  const auto kept = values.masked_fill(before >= top_p, 0.0);
  auto out = torch::zeros_like(probs).scatter(-1, order, kept);
  return out / out.sum();
}

GenerateResult generate(const GenerateOptions& o, const std::function<void(const std::string&)>& on_text,
                        const std::function<void(const at::Tensor&)>& on_logits) {
  o.validate();
  if (!fs::exists(o.model_dir + "/config.json"))
    throw bad_input(o.model_dir, "is not a Hugging Face model directory: config.json is missing");
  const auto tokenizer = data::Tokenizer::load(o.model_dir);
  GenerateResult r;
  const std::string& source = tokenizer.chat_template();
  r.chat_template = !o.raw && !source.empty();
  if (r.chat_template) {
    const auto chat = data::ChatTemplate::parse(source, o.model_dir + "/tokenizer_config.json: chat_template");
    nlohmann::ordered_json context = nlohmann::ordered_json::object();
    context["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", o.prompt}}});
    context["add_generation_prompt"] = true;
    context["bos_token"] = tokenizer.bos_token();
    context["eos_token"] = tokenizer.eos_token();
    r.prompt_text = chat.render(context);
  } else {
    r.prompt_text = o.prompt;
  }
  // The template writes its own special tokens (bos included); plain text gets the
  // tokenizer's (its post-processor), as Hugging Face encodes each.
  r.prompt_ids = tokenizer.encode(r.prompt_text, /*add_special_tokens=*/!r.chat_template);
  if (r.prompt_ids.empty()) throw bad_input("--prompt", "encodes to no token at all");

  torch::NoGradGuard no_grad;
  const torch::Device device(o.device);
  auto model = checkpoint::load_hf_model(o.model_dir, model::LlamaOptions{});
  model->to(device);
  model->eval();
  const auto& mo = model->options();
  int64_t context_len = mo.max_seq_len;
  if (mo.sliding_window > 0) context_len = std::min(context_len, mo.sliding_window);
  const auto prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  if (prompt_len >= context_len)
    throw bad_input("--prompt", std::to_string(prompt_len) + " tokens" +
                                    (r.chat_template ? " with the chat template" : std::string()) +
                                    " leave no room in the model's context of " + std::to_string(context_len) +
                                    " tokens");
  for (const auto id : r.prompt_ids)
    if (id < 0 || id >= mo.vocab_size)
      throw bad_input(o.model_dir, "the tokenizer gives id " + std::to_string(id) + ", outside the model's vocabulary of " +
                                       std::to_string(mo.vocab_size));
  std::set<int64_t> eos;
  if (tokenizer.eos_id() >= 0) eos.insert(tokenizer.eos_id());
  add_eos_ids(o.model_dir + "/config.json", &eos);
  add_eos_ids(o.model_dir + "/generation_config.json", &eos);

  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  model::KvCache cache;
  std::vector<int64_t> ids(r.prompt_ids.begin(), r.prompt_ids.end());
  auto input = torch::tensor(ids, torch::kLong).unsqueeze(0).to(device);
  std::string printed;
  r.stop = "max_new_tokens";
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    if (cache.length + input.size(1) > context_len) {
      r.stop = "context";
      break;
    }
    const auto logits = model->forward_cached(input, cache).select(1, -1).squeeze(0).to(torch::kFloat).cpu();  // [V]
    if (on_logits) on_logits(logits);
    int64_t next;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      const auto probs = top_p_filter(torch::softmax(logits.to(torch::kDouble) / o.temperature, -1), o.top_p);
      next = torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
    }
    r.new_ids.push_back(static_cast<int32_t>(next));
    if (eos.count(next)) {
      r.stop = "eos";
      break;
    }
    std::vector<int32_t> text_ids(r.new_ids.begin(), r.new_ids.end());
    const std::string text = tokenizer.decode(text_ids, /*skip_special_tokens=*/true);
    if (on_text && !ends_inside_a_character(text) && text.size() > printed.size() &&
        text.compare(0, printed.size(), printed) == 0) {
      on_text(text.substr(printed.size()));
      printed = text;
    }
    input = torch::tensor({next}, torch::kLong).view({1, 1}).to(device);
  }
  std::vector<int32_t> text_ids(r.new_ids.begin(), r.new_ids.end());
  if (r.stop == "eos") text_ids.pop_back();
  r.text = tokenizer.decode(text_ids, /*skip_special_tokens=*/true);
  if (on_text && r.text.size() > printed.size() && r.text.compare(0, printed.size(), printed) == 0)
    on_text(r.text.substr(printed.size()));
  return r;
}

}  // namespace gradguard::generate
