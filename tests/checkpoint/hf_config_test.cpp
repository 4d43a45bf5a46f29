// config.json <-> LlamaOptions (checkpoint/hf_config.h) and the export of complete HF
// directories. The configs below are written the way each family's Hugging Face config
// class writes them (keys and defaults of LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config); the weights are the tests' own tiny random ones. What is proved: each
// family's keys land in the options; every key that would change the math and is not
// supported is refused with its name; math-neutral keys pass; writing a config and
// reading it back gives the same architecture; and an export keeps every key and the
// tokenizer files of its source and reloads to bit-identical weights and logits.
#include "gradguard/checkpoint/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <torch/torch.h>

#include "golden_util.h"
#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::checkpoint {
namespace {

using model::LlamaOptions;
using model::RopeScaling;
using ::testing::HasSubstr;
using json = nlohmann::json;

LlamaOptions read(const json& cfg) { return options_from_hf_config(cfg, "dir/config.json", LlamaOptions{}); }

// The message of the bad-input error reading `cfg` throws ("" and a failure if none).
std::string refusal(const json& cfg) {
  return test::bad_input_message([&] { read(cfg); });
}

// The architecture fields, as one comparable string.
std::string architecture(const LlamaOptions& o) {
  std::ostringstream s;
  s << o.vocab_size << " " << o.hidden_size << " " << o.intermediate_size << " " << o.num_layers << " " << o.num_heads
    << " " << o.num_kv_heads << " " << o.max_seq_len << " " << o.rope_theta << " " << o.rms_norm_eps << " "
    << o.tie_embeddings << " " << o.head_size() << " " << o.attention_bias << " " << o.qkv_bias << " " << o.mlp_bias
    << " " << o.qk_norm << " " << static_cast<int>(o.rope_scaling) << " " << o.sliding_window;
  if (o.rope_scaling != RopeScaling::kNone)
    s << " " << o.rope_scaling_factor << " " << o.rope_scaling_low_freq_factor << " "
      << o.rope_scaling_high_freq_factor << " " << o.rope_scaling_original_max_seq_len;
  return s.str();
}

// Tiny configs shaped like the published ones of each family.
json llama31() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 8, "hidden_act": "silu",
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 128,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 32, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 96})");
}
json mistral() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
    "max_position_embeddings": 128, "model_type": "mistral", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
    "use_cache": true, "vocab_size": 96})");
}
json qwen2() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 64, "max_position_embeddings": 128, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 128, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 96})");
}
json qwen3() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 16, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 128, "max_window_layers": 2,
    "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 96})");
}

TEST(HfConfig, EachFamilyReadsIntoTheOptions) {
  auto l = read(llama31());
  EXPECT_EQ(l.head_size(), 8);
  EXPECT_TRUE(l.tie_embeddings);
  EXPECT_FALSE(l.attention_bias || l.mlp_bias || l.qkv_bias || l.qk_norm);
  EXPECT_EQ(l.rope_scaling, RopeScaling::kLlama3);
  EXPECT_EQ(l.rope_scaling_factor, 8.0);
  EXPECT_EQ(l.rope_scaling_low_freq_factor, 1.0);
  EXPECT_EQ(l.rope_scaling_high_freq_factor, 4.0);
  EXPECT_EQ(l.rope_scaling_original_max_seq_len, 32);
  EXPECT_EQ(l.rope_theta, 500000.0);

  auto m = read(mistral());
  EXPECT_FALSE(m.attention_bias || m.mlp_bias || m.qkv_bias || m.qk_norm);
  EXPECT_EQ(m.rope_scaling, RopeScaling::kNone);

  auto q2 = read(qwen2());
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.attention_bias || q2.mlp_bias || q2.qk_norm);
  EXPECT_TRUE(q2.tie_embeddings);
  EXPECT_EQ(q2.rms_norm_eps, 1e-6);

  auto q3 = read(qwen3());
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_size(), 16);
  EXPECT_FALSE(q3.attention_bias || q3.qkv_bias || q3.mlp_bias);
  auto q3b = qwen3();
  q3b["attention_bias"] = true;  // Qwen3's attention_bias: all four projections
  EXPECT_TRUE(read(q3b).attention_bias);
  q3b.erase("head_dim");  // Qwen3Config's default head_dim is 128, not hidden / heads
  EXPECT_EQ(read(q3b).head_size(), 128);

  auto l2 = llama31();
  l2["attention_bias"] = true, l2["mlp_bias"] = true;
  EXPECT_TRUE(read(l2).attention_bias);
  EXPECT_TRUE(read(l2).mlp_bias);
}

// Mistral's one window for all layers is kept (sequences up to it are plain causal
// attention; the model refuses longer ones: Families.SequencesLongerThanTheWindowAreRefused);
// per-layer windows (Qwen's use_sliding_window, layer_types) and a window on Llama are refused.
TEST(HfConfig, MistralsWindowIsKeptAndOtherWindowsAreRefused) {
  auto m = mistral();  // "sliding_window": null, as Mistral-7B-v0.2 onwards
  EXPECT_EQ(read(m).sliding_window, 0);
  m["sliding_window"] = 64;  // Mistral-7B-v0.1 has 4096 over 32768 positions
  EXPECT_EQ(read(m).sliding_window, 64);
  m.erase("sliding_window");  // MistralConfig's default: 4096
  EXPECT_EQ(read(m).sliding_window, 4096);
  m["sliding_window"] = 0;
  EXPECT_THAT(refusal(m), HasSubstr("key 'sliding_window' must be a positive integer or null, got 0"));
  m["sliding_window"] = "4096";
  EXPECT_THAT(refusal(m), HasSubstr("key 'sliding_window' must be an integer"));

  auto q = qwen2();
  q["use_sliding_window"] = true;
  EXPECT_THAT(refusal(q), HasSubstr("key 'use_sliding_window' is true"));
  q = qwen2();
  q["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THAT(refusal(q), HasSubstr("key 'layer_types'"));
  q["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_NO_THROW(read(q));

  auto l = llama31();
  l["sliding_window"] = 4096;
  EXPECT_THAT(refusal(l), HasSubstr("key 'sliding_window'"));
}

TEST(HfConfig, RopeScalingTypesOtherThanLlama3AreRefusedByName) {
  auto l = llama31();
  l["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  auto msg = refusal(l);
  EXPECT_THAT(msg, HasSubstr("key 'rope_scaling'"));
  EXPECT_THAT(msg, HasSubstr("\"yarn\""));
  l["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THAT(refusal(l), HasSubstr("\"linear\""));
  l["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THAT(refusal(l), HasSubstr("\"dynamic\""));
  l["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_THAT(refusal(l), HasSubstr("has no low_freq_factor"));
  l = llama31();
  l["rope_scaling"]["attention_factor"] = 2.0;
  EXPECT_THAT(refusal(l), HasSubstr("key 'rope_scaling.attention_factor'"));
  l = llama31();
  l["rope_scaling"]["type"] = "linear";  // disagrees with rope_type
  EXPECT_THAT(refusal(l), HasSubstr("must agree"));
  l = llama31();
  l["rope_scaling"]["factor"] = 0.5;  // validated as the option it fills
  EXPECT_THAT(refusal(l), HasSubstr("model.rope_scaling_factor"));
  l = llama31();
  l["rope_scaling"] = {{"rope_type", "default"}};  // HF's name for no scaling
  EXPECT_EQ(read(l).rope_scaling, RopeScaling::kNone);
  // transformers 5 keeps theta and scaling in rope_parameters.
  l = llama31();
  l.erase("rope_theta");
  l["rope_parameters"] = l["rope_scaling"];
  l["rope_parameters"]["rope_theta"] = 250000.0;
  l.erase("rope_scaling");
  EXPECT_EQ(read(l).rope_theta, 250000.0);
  EXPECT_EQ(read(l).rope_scaling, RopeScaling::kLlama3);
}

TEST(HfConfig, KeysThatWouldChangeTheMathAreRefusedByName) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"attention_dropout", 0.1},          {"partial_rotary_factor", 0.5},
      {"quantization_config", json::object({{"quant_method", "gptq"}})},
      {"hidden_act", "gelu"},              {"is_encoder_decoder", true},
      {"num_experts", 8},                  {"pruned_heads", json::object({{"0", {1}}})},
      {"rope_scaling", "llama3"},          {"head_dim", "16"}};
  for (const auto& [key, value] : cases) {
    auto l = llama31();
    l[key] = value;
    EXPECT_THAT(refusal(l), HasSubstr(key)) << key;
  }
  auto q = qwen2();
  q["attention_bias"] = true;  // Qwen2 ignores it in HF: not a Qwen2 model
  EXPECT_THAT(refusal(q), HasSubstr("key 'attention_bias' is true"));
  q = qwen2(), q["mlp_bias"] = true;
  EXPECT_THAT(refusal(q), HasSubstr("key 'mlp_bias' is true"));
  auto m = mistral();
  m["attention_bias"] = true;
  EXPECT_THAT(refusal(m), HasSubstr("key 'attention_bias' is true"));
  auto q3 = qwen3();
  q3["mlp_bias"] = true;
  EXPECT_THAT(refusal(q3), HasSubstr("key 'mlp_bias' is true"));
  auto g = llama31();
  g["model_type"] = "gemma";
  EXPECT_THAT(refusal(g), HasSubstr("model_type \"gemma\" is not supported"));
}

TEST(HfConfig, KeysThatCannotChangeTheMathAreAccepted) {
  auto l = llama31();
  l["_name_or_path"] = "meta-llama/Llama-3.1-8B";
  l["pad_token_id"] = nullptr;
  l["dtype"] = "bfloat16";
  l["temperature"] = 0.6;
  l["id2label"] = {{"0", "LABEL_0"}};
  l["pretraining_tp"] = 2;  // the same products summed in slices
  l["attention_dropout"] = 0;
  l["layer_types"] = {"full_attention", "full_attention"};
  l["pruned_heads"] = json::object();
  EXPECT_EQ(architecture(read(l)), architecture(read(llama31())));
}

// options -> config.json -> options gives the same architecture, for every family and
// for options with no source config (random-init models, e.g. Qwen3-shaped ones).
TEST(HfConfig, WrittenConfigsReadBackToTheSameArchitecture) {
  for (const auto& cfg : {llama31(), mistral(), qwen2(), qwen3()}) {
    const auto o = read(cfg);
    const auto written = hf_config_from_options(o, nlohmann::ordered_json::parse(cfg.dump()), "float32");
    EXPECT_EQ(architecture(read(json::parse(written.dump()))), architecture(o)) << cfg["model_type"];
    EXPECT_EQ(written["model_type"].get<std::string>(), cfg["model_type"].get<std::string>());
    EXPECT_EQ(written["torch_dtype"], "float32");
    for (auto it = cfg.begin(); it != cfg.end(); ++it)
      EXPECT_TRUE(written.contains(it.key())) << cfg["model_type"] << " lost " << it.key();
  }
  std::vector<LlamaOptions> fresh(5);
  fresh[1].qkv_bias = true;
  fresh[2].qk_norm = true, fresh[2].head_dim = 64, fresh[2].attention_bias = true;
  fresh[3].attention_bias = true, fresh[3].mlp_bias = true, fresh[3].head_dim = 16;
  fresh[4].rope_scaling = RopeScaling::kLlama3, fresh[4].rope_scaling_original_max_seq_len = 256;
  const char* types[] = {"llama", "qwen2", "qwen3", "llama", "llama"};
  for (size_t i = 0; i < fresh.size(); ++i) {
    const auto written = hf_config_from_options(fresh[i], nlohmann::ordered_json::object(), "float32");
    EXPECT_EQ(written["model_type"], types[i]);
    auto back = options_from_hf_config(json::parse(written.dump()), "x", fresh[i]);
    EXPECT_EQ(architecture(back), architecture(fresh[i])) << i;
  }
}

// A source HF directory of family `cfg` with the tests' own random weights and
// stand-in tokenizer files.
void make_source(const std::string& dir, const json& cfg) {
  auto o = read(cfg);
  torch::manual_seed(31);
  model::LlamaForCausalLM m(o);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.normal_(0.0, 0.1);  // biases and norms nonzero too
  }
  save_hf_model(dir, *m);
  test::write_text(dir + "/config.json", cfg.dump(2));
  test::write_text(dir + "/tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})");
  test::write_text(dir + "/tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  test::write_text(dir + "/generation_config.json", R"({"do_sample": true, "temperature": 0.7})");
  test::write_text(dir + "/merges.txt", "#version: 0.2\nh e\n");
}

class Export : public ::testing::TestWithParam<std::string> {};

json family_config(const std::string& name) {
  if (name == "llama31") return llama31();
  if (name == "mistral") return mistral();
  if (name == "mistral_window") {
    auto m = mistral();
    m["sliding_window"] = 64;
    return m;
  }
  if (name == "qwen2") return qwen2();
  return qwen3();
}

// A source directory -> read_hf_config + load_hf_weights -> save_hf_model (what a
// checkpoint and `gradguard export` do) -> again: the configs keep every source key
// (values too, but torch_dtype, which says what the file holds), the tokenizer files are
// byte-identical, and the weights and logits bit-identical.
TEST_P(Export, KeepsEveryKeyAndTokenizerFileAndReloadsBitIdentical) {
  test::TempDir root;
  const std::string src = root.file("src"), ckpt = root.file("ckpt"), out = root.file("out");
  const json cfg = family_config(GetParam());
  make_source(src, cfg);

  auto o = read_hf_config(src, LlamaOptions{});
  EXPECT_EQ(o.init_from, src);
  model::LlamaForCausalLM a(o);
  load_hf_weights(src, *a);
  save_hf_model(ckpt, *a);  // a checkpoint of the fine-tune
  auto oc = read_hf_config(ckpt, LlamaOptions{});
  model::LlamaForCausalLM b(oc);
  load_hf_weights(ckpt, *b);
  save_hf_model(out, *b);  // gradguard export of that checkpoint

  const auto written = json::parse(test::read_text(out + "/config.json"));
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    ASSERT_TRUE(written.contains(it.key())) << it.key();
    if (it.key() != "torch_dtype") EXPECT_EQ(written[it.key()], it.value()) << it.key();
  }
  EXPECT_EQ(written["torch_dtype"], "float32");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "merges.txt"})
    EXPECT_EQ(test::read_text(out + "/" + f), test::read_text(src + "/" + f)) << f;
  EXPECT_FALSE(std::filesystem::exists(out + "/tokenizer.model"));  // only what the source has

  auto oe = read_hf_config(out, LlamaOptions{});
  EXPECT_EQ(architecture(oe), architecture(o));
  model::LlamaForCausalLM c(oe);
  load_hf_weights(out, *c);
  auto pa = a->named_parameters(), pc = c->named_parameters();
  ASSERT_EQ(pa.size(), pc.size());
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pc[item.key()])) << item.key();
  auto ids = torch::randint(0, o.vocab_size, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(ids), c->forward(ids)));
}

INSTANTIATE_TEST_SUITE_P(Families, Export, ::testing::Values("llama31", "mistral", "mistral_window", "qwen2", "qwen3"));

// Saving a directory onto itself keeps its own files, and a model with no source gets a
// config of its own family.
TEST(HfConfig, SaveOntoTheSourceAndWithoutASource) {
  test::TempDir root;
  make_source(root.file("src"), qwen2());
  auto o = read_hf_config(root.file("src"), LlamaOptions{});
  model::LlamaForCausalLM m(o);
  load_hf_weights(root.file("src"), *m);
  save_hf_model(root.file("src"), *m);
  EXPECT_EQ(json::parse(test::read_text(root.file("src/config.json")))["max_window_layers"], 21);
  EXPECT_TRUE(std::filesystem::exists(root.file("src/merges.txt")));

  o.init_from.clear();
  model::LlamaForCausalLM fresh(o);
  save_hf_model(root.file("fresh"), *fresh);
  const auto cfg = json::parse(test::read_text(root.file("fresh/config.json")));
  EXPECT_EQ(cfg["model_type"], "qwen2");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_FALSE(std::filesystem::exists(root.file("fresh/merges.txt")));
}

}  // namespace
}  // namespace gradguard::checkpoint
