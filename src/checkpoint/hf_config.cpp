// config.json <-> LlamaOptions. The key tables below are the whole policy: keys read
// into options (per family), keys accepted because they cannot change the math, keys
// accepted only at their neutral value, and everything else refused by name.
//
// Defaults follow each family's HF config class where a key is absent: rms_norm_eps
// 1e-6, rope_theta 10000, num_key_value_heads = num_attention_heads,
// tie_word_embeddings false, Mistral's sliding_window 4096, Qwen3's head_dim 128.
#include "gradguard/checkpoint/hf_config.h"

#include <cmath>
#include <optional>
#include <set>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"

namespace gradguard::checkpoint {
namespace {

using model::LlamaOptions;
using model::RopeScaling;

enum class Family { kLlama, kMistral, kQwen2, kQwen3 };

struct FamilyName {
  Family family;
  const char* model_type;
  const char* architecture;
};
// [Family] in enum order.
constexpr FamilyName kFamilies[] = {{Family::kLlama, "llama", "LlamaForCausalLM"},
                                    {Family::kMistral, "mistral", "MistralForCausalLM"},
                                    {Family::kQwen2, "qwen2", "Qwen2ForCausalLM"},
                                    {Family::kQwen3, "qwen3", "Qwen3ForCausalLM"}};

const FamilyName& names_of(Family f) { return kFamilies[static_cast<size_t>(f)]; }

// Keys that cannot change a causal LM's forward or backward pass: token ids, storage
// dtype, generation settings, labels, bookkeeping. Keys starting with '_' (HF's private
// attributes such as _name_or_path or _attn_implementation, which picks a kernel for the
// same math) are accepted too.
const std::set<std::string> kNeutralKeys = {
    "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache", "initializer_range",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "id2label", "label2id", "finetuning_task",
    "problem_type", "prefix", "task_specific_params", "is_decoder", "tie_encoder_decoder",
    "cross_attention_hidden_size", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    // Splits Llama's projections into slices in HF's pretraining_tp > 1 path: the same
    // products summed in another order.
    "pretraining_tp",
    // Which layers would slide if use_sliding_window were true (refused below).
    "max_window_layers"};

// One config.json being read: typed access, and a record of the keys consumed so that
// the rest can be checked against the tables.
class Reader {
 public:
  Reader(const nlohmann::json& cfg, const std::string& path) : cfg_(cfg), path_(path) {}

  bool contains(const std::string& key) const { return cfg_.contains(key); }
  bool has(const std::string& key) const { return cfg_.contains(key) && !cfg_[key].is_null(); }
  // The value of a key that is present, marked as read.
  const nlohmann::json& at(const std::string& key) {
    used_.insert(key);
    return cfg_[key];
  }
  // Marks a key as read (present or not): its value is handled, or unused by design.
  void consume(const std::string& key) { used_.insert(key); }
  Error bad(const std::string& key, const std::string& what) const {
    return bad_input(path_, "key '" + key + "' " + what);
  }

  // A required integer, or `fallback` when absent (or null, where `null_is_absent`).
  int64_t integer(const std::string& key, std::optional<int64_t> fallback, bool null_is_absent = false) {
    used_.insert(key);
    if (!cfg_.contains(key) || (null_is_absent && cfg_[key].is_null())) {
      if (fallback) return *fallback;
      throw bad_input(path_, "missing key '" + key + "'");
    }
    if (!cfg_[key].is_number_integer()) throw bad(key, "must be an integer, got " + describe(cfg_[key]));
    return cfg_[key].get<int64_t>();
  }
  // null is what JSON makes of inf or NaN: not the default, a value lost.
  double number(const std::string& key, double fallback) {
    used_.insert(key);
    if (!cfg_.contains(key)) return fallback;
    if (!cfg_[key].is_number()) throw bad(key, "must be a number, got " + describe(cfg_[key]));
    return cfg_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    if (!cfg_[key].is_boolean()) throw bad(key, "must be true or false, got " + describe(cfg_[key]));
    return cfg_[key].get<bool>();
  }
  // A boolean HF's class for this family does not read: true would describe another model.
  void must_be_false(const std::string& key, const std::string& why) {
    if (boolean(key, false)) throw bad(key, "is true, but " + why);
  }

  // Every key neither consumed nor neutral is refused.
  void refuse_unknown_keys() const {
    for (auto it = cfg_.begin(); it != cfg_.end(); ++it) {
      const std::string& key = it.key();
      if (used_.count(key) || kNeutralKeys.count(key) || (!key.empty() && key[0] == '_')) continue;
      throw bad(key, "is not one gradguard reads, and it may change the model: refused rather than ignored "
                     "(docs/models.md lists the keys read and the keys accepted)");
    }
  }

 private:
  const nlohmann::json& cfg_;
  const std::string& path_;
  std::set<std::string> used_;
};

// A rope_scaling (or transformers 5 rope_parameters) object into `o`. `where` is its key.
void read_rope_object(Reader& r, const nlohmann::json& obj, const std::string& where, bool theta_inside,
                      LlamaOptions& o) {
  if (!obj.is_object()) throw r.bad(where, "must be an object or null, got " + describe(obj));
  std::string type;
  for (const char* k : {"rope_type", "type"}) {
    if (!obj.contains(k)) continue;
    if (!obj[k].is_string()) throw r.bad(where + "." + k, "must be a string, got " + describe(obj[k]));
    const std::string t = obj[k].get<std::string>();
    if (!type.empty() && t != type)
      throw r.bad(where, "has rope_type \"" + type + "\" and type \"" + t + "\": they must agree");
    type = t;
  }
  if (type.empty()) throw r.bad(where, "has no rope_type");
  std::set<std::string> allowed = {"rope_type", "type"};
  if (theta_inside) {
    allowed.insert("rope_theta");
    if (obj.contains("rope_theta")) {
      if (!obj["rope_theta"].is_number())
        throw r.bad(where + ".rope_theta", "must be a number, got " + describe(obj["rope_theta"]));
      o.rope_theta = obj["rope_theta"].get<double>();
    }
  }
  if (type == "default") {
    o.rope_scaling = RopeScaling::kNone;
  } else if (type == "llama3") {
    o.rope_scaling = RopeScaling::kLlama3;
    auto number = [&](const char* k) {
      allowed.insert(k);
      if (!obj.contains(k)) throw r.bad(where, std::string("of rope_type \"llama3\" has no ") + k);
      if (!obj[k].is_number()) throw r.bad(where + "." + k, "must be a number, got " + describe(obj[k]));
      return obj[k].get<double>();
    };
    o.rope_scaling_factor = number("factor");
    o.rope_scaling_low_freq_factor = number("low_freq_factor");
    o.rope_scaling_high_freq_factor = number("high_freq_factor");
    allowed.insert("original_max_position_embeddings");
    const auto& orig = obj.contains("original_max_position_embeddings") ? obj["original_max_position_embeddings"]
                                                                        : nlohmann::json();
    if (!orig.is_number_integer())
      throw r.bad(where + ".original_max_position_embeddings",
                  "must be an integer (the llama3 type needs it), got " + describe(orig));
    o.rope_scaling_original_max_seq_len = orig.get<int64_t>();
  } else {
    throw r.bad(where, "has rope_type \"" + type +
                           "\", which is not supported (only \"default\" and \"llama3\"; docs/models.md)");
  }
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!allowed.count(it.key()))
      throw r.bad(where + "." + it.key(), "is not read for rope_type \"" + type + "\": refused rather than ignored");
}

// use_sliding_window, layer_types and the other keys that would make layers attend a
// window: accepted where every layer attends the whole causal prefix, and Mistral's one
// window for all layers kept in the options (the model refuses longer sequences).
void read_attention_pattern(Reader& r, Family family, LlamaOptions& o) {
  if (r.boolean("use_sliding_window", false))
    throw r.bad("use_sliding_window", "is true: sliding-window attention is not supported (docs/models.md)");
  if (r.has("layer_types")) {
    const auto& types = r.at("layer_types");
    if (!types.is_array()) throw r.bad("layer_types", "must be a list, got " + describe(types));
    for (const auto& t : types)
      if (t != "full_attention")
        throw r.bad("layer_types", "holds " + describe(t) + ": only \"full_attention\" layers are supported");
  }
  r.consume("layer_types");
  switch (family) {
    case Family::kMistral:
      // MistralConfig's default window is 4096 tokens; null turns it off. The model keeps
      // the window and refuses a sequence longer than it: up to the window, sliding-window
      // attention is plain causal attention.
      if (r.contains("sliding_window") && !r.has("sliding_window")) {
        o.sliding_window = 0;
      } else {
        o.sliding_window = r.integer("sliding_window", int64_t{4096});
        if (o.sliding_window < 1)
          throw r.bad("sliding_window", "must be a positive integer or null, got " + std::to_string(o.sliding_window));
      }
      r.consume("sliding_window");
      break;
    case Family::kQwen2:
    case Family::kQwen3:
      r.consume("sliding_window");  // HF reads it only when use_sliding_window is true
      break;
    case Family::kLlama:
      if (r.has("sliding_window"))
        throw r.bad("sliding_window", "is set, but Llama has no sliding window: refused rather than ignored");
      r.consume("sliding_window");
      break;
  }
}

}  // namespace

LlamaOptions options_from_hf_config(const nlohmann::json& cfg, const std::string& path, const LlamaOptions& base) {
  if (!cfg.is_object()) throw bad_input(path, "must hold a JSON object");
  Reader r(cfg, path);
  Family family = Family::kLlama;
  if (r.has("model_type")) {
    const auto& type = r.at("model_type");
    bool known = false;
    for (const auto& n : kFamilies)
      if (type == n.model_type) family = n.family, known = true;
    if (!known)
      throw bad_input(path, "model_type " + describe(type) +
                                " is not supported (llama, mistral, qwen2, qwen3; docs/models.md)");
  }
  r.consume("model_type");
  if (r.has("hidden_act") && r.at("hidden_act") != "silu")
    throw bad_input(path, "hidden_act " + describe(cfg["hidden_act"]) + " is not supported (only \"silu\")");
  r.consume("hidden_act");

  LlamaOptions o = base;
  o.hidden_size = r.integer("hidden_size", std::nullopt);
  o.intermediate_size = r.integer("intermediate_size", std::nullopt);
  o.num_layers = r.integer("num_hidden_layers", std::nullopt);
  o.num_heads = r.integer("num_attention_heads", std::nullopt);
  o.num_kv_heads = r.integer("num_key_value_heads", o.num_heads, /*null_is_absent=*/true);
  o.vocab_size = r.integer("vocab_size", std::nullopt);
  o.max_seq_len = r.integer("max_position_embeddings", base.max_seq_len);
  o.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  o.tie_embeddings = r.boolean("tie_word_embeddings", false);
  o.head_dim = r.integer("head_dim", family == Family::kQwen3 ? 128 : 0, /*null_is_absent=*/true);

  // Rotary embedding: rope_theta + rope_scaling, or transformers 5's rope_parameters.
  o.rope_theta = r.number("rope_theta", 10000.0);
  o.rope_scaling = RopeScaling::kNone;
  if (r.has("rope_parameters")) {
    if (r.has("rope_scaling"))
      throw r.bad("rope_parameters", "and rope_scaling are both set: only one may describe the rotary embedding");
    read_rope_object(r, r.at("rope_parameters"), "rope_parameters", /*theta_inside=*/true, o);
  } else if (r.has("rope_scaling")) {
    read_rope_object(r, r.at("rope_scaling"), "rope_scaling", /*theta_inside=*/false, o);
  }
  r.consume("rope_parameters");
  r.consume("rope_scaling");

  // Keys neutral only at one value.
  const double dropout = r.number("attention_dropout", 0.0);
  if (dropout != 0.0)
    throw r.bad("attention_dropout", "is " + format_number(dropout) + ": attention dropout is not supported (only 0)");
  const double partial = r.number("partial_rotary_factor", 1.0);
  if (partial != 1.0)
    throw r.bad("partial_rotary_factor", "is " + format_number(partial) + ": only full rotary embeddings (1.0)");
  r.must_be_false("is_encoder_decoder", "gradguard's models are decoder-only");
  r.must_be_false("add_cross_attention", "gradguard's models have no cross-attention");
  if (r.has("pruned_heads") && !(r.at("pruned_heads").is_object() && r.at("pruned_heads").empty()))
    throw r.bad("pruned_heads", "is not empty: pruned attention heads are not supported");
  r.consume("pruned_heads");

  // The family's own switches.
  switch (family) {
    case Family::kLlama:
      o.attention_bias = r.boolean("attention_bias", false);
      o.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case Family::kMistral:
      r.must_be_false("attention_bias", "Hugging Face's Mistral has no projection biases");
      r.must_be_false("mlp_bias", "Hugging Face's Mistral has no MLP biases");
      break;
    case Family::kQwen2:
      o.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
      r.must_be_false("attention_bias", "Hugging Face's Qwen2 always has q/k/v biases and none on o_proj");
      r.must_be_false("mlp_bias", "Hugging Face's Qwen2 has no MLP biases");
      break;
    case Family::kQwen3:
      o.qk_norm = true;  // Qwen3Attention: q_norm/k_norm over each head before RoPE
      o.attention_bias = r.boolean("attention_bias", false);
      r.must_be_false("mlp_bias", "Hugging Face's Qwen3 has no MLP biases");
      break;
  }
  read_attention_pattern(r, family, o);
  r.refuse_unknown_keys();
  try {
    o.validate();
  } catch (const Error& e) {
    throw bad_input(path, std::string("describes an unsupported model: ") + e.what());
  }
  return o;
}

nlohmann::ordered_json hf_config_from_options(const LlamaOptions& o, const nlohmann::ordered_json& source,
                                              const std::string& dtype) {
  nlohmann::ordered_json out = source.is_object() ? source : nlohmann::ordered_json::object();
  // The family: the one the options need, Mistral kept where the source is Mistral and the
  // options are plain Llama math (the two differ only in the sliding window).
  const std::string source_type = out.contains("model_type") && out["model_type"].is_string()
                                      ? out["model_type"].get<std::string>()
                                      : "";
  Family family = Family::kLlama;
  if (o.qk_norm)
    family = Family::kQwen3;
  else if (o.qkv_bias && !o.attention_bias)
    family = Family::kQwen2;
  else if (o.sliding_window > 0 || (source_type == "mistral" && !o.attention_bias && !o.mlp_bias))
    family = Family::kMistral;
  const FamilyName& names = names_of(family);
  if (source_type != names.model_type) {
    out["model_type"] = names.model_type;
    out["architectures"] = nlohmann::ordered_json::array({names.architecture});
  } else if (!out.contains("architectures")) {
    out["architectures"] = nlohmann::ordered_json::array({names.architecture});
  }

  out["hidden_size"] = o.hidden_size;
  out["intermediate_size"] = o.intermediate_size;
  out["num_hidden_layers"] = o.num_layers;
  out["num_attention_heads"] = o.num_heads;
  out["num_key_value_heads"] = o.num_kv_heads;
  out["vocab_size"] = o.vocab_size;
  out["max_position_embeddings"] = o.max_seq_len;
  out["rms_norm_eps"] = o.rms_norm_eps;
  out["tie_word_embeddings"] = o.tie_embeddings;
  out["hidden_act"] = "silu";
  // head_dim where it is not the default of the family's HF class, or was written before.
  if (o.head_dim > 0 || out.contains("head_dim") || family == Family::kQwen3) out["head_dim"] = o.head_size();
  if ((family == Family::kLlama || family == Family::kQwen3) && (o.attention_bias || out.contains("attention_bias")))
    out["attention_bias"] = o.attention_bias;
  if (family == Family::kLlama && (o.mlp_bias || out.contains("mlp_bias"))) out["mlp_bias"] = o.mlp_bias;
  // Mistral's window; null says "none" (HF's default of 4096 applies when the key is absent).
  if (family == Family::kMistral)
    out["sliding_window"] = o.sliding_window > 0 ? nlohmann::ordered_json(o.sliding_window) : nlohmann::ordered_json();

  // Rotary embedding, where the source keeps it: rope_parameters (transformers 5) or
  // rope_theta + rope_scaling. An existing llama3 object keeps its key names ("type").
  // (ordered_json keeps its members in a vector: the reference is taken after the last
  // insertion into `out` it must survive.)
  const bool parameters = out.contains("rope_parameters") && out["rope_parameters"].is_object();
  const bool had_scaling_key = out.contains("rope_scaling");
  if (parameters) {
    out["rope_parameters"]["rope_theta"] = o.rope_theta;
  } else {
    out["rope_theta"] = o.rope_theta;
  }
  nlohmann::ordered_json& rope_obj = parameters ? out["rope_parameters"] : out["rope_scaling"];
  if (o.rope_scaling == RopeScaling::kLlama3) {
    if (!rope_obj.is_object()) rope_obj = nlohmann::ordered_json::object();
    if (!rope_obj.contains("type") || rope_obj.contains("rope_type")) rope_obj["rope_type"] = "llama3";
    if (rope_obj.contains("type")) rope_obj["type"] = "llama3";
    rope_obj["factor"] = o.rope_scaling_factor;
    rope_obj["low_freq_factor"] = o.rope_scaling_low_freq_factor;
    rope_obj["high_freq_factor"] = o.rope_scaling_high_freq_factor;
    rope_obj["original_max_position_embeddings"] = o.rope_scaling_original_max_seq_len;
  } else if (parameters) {
    rope_obj = {{"rope_type", "default"}, {"rope_theta", o.rope_theta}};
  } else if (!rope_obj.is_null() && string_field(rope_obj, "rope_type", string_field(rope_obj, "type")) != "default") {
    rope_obj = nullptr;  // a scaling the options do not have
  }
  if (!parameters && !had_scaling_key && rope_obj.is_null()) out.erase("rope_scaling");

  out["torch_dtype"] = dtype;
  if (out.contains("dtype")) out["dtype"] = dtype;
  return out;
}

model::LlamaOptions read_hf_config(const std::string& dir, const model::LlamaOptions& base) {
  const std::string path = dir + "/config.json";
  auto o = options_from_hf_config(read_json_file(path), path, base);
  o.init_from = dir;
  return o;
}

}  // namespace gradguard::checkpoint
