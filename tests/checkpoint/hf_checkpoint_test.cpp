// HF directories: save/load round trip, and the errors for mismatched or missing tensors
// and bad config.json files (the families and key policy: hf_config_test.cpp).
#include "gradguard/checkpoint/hf_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "golden_util.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/error.h"

namespace gradguard::checkpoint {
namespace {
using ::testing::HasSubstr;

model::LlamaOptions small() {
  model::LlamaOptions o;
  o.hidden_size = 32;
  o.intermediate_size = 48;
  o.num_layers = 2;
  return o;
}

void expect_bad(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

TEST(HfCheckpoint, RoundTrip) {
  test::TempDir dir;
  torch::manual_seed(1);
  model::LlamaForCausalLM a(small());
  save_hf_model(dir.path(), *a);
  auto cfg = nlohmann::json::parse(test::read_text(dir.file("config.json")));
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["model_type"], "llama");
  auto opts = read_hf_config(dir.path(), model::LlamaOptions{});
  EXPECT_EQ(opts.hidden_size, 32);
  EXPECT_EQ(opts.num_kv_heads, small().num_kv_heads);
  torch::manual_seed(2);
  model::LlamaForCausalLM b(opts);
  load_hf_weights(dir.path(), *b);
  auto x = torch::randint(0, 256, {2, 5}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
}

TEST(HfCheckpoint, ShapeMismatchNamesTensor) {
  test::TempDir dir;
  model::LlamaForCausalLM a(small());
  save_hf_model(dir.path(), *a);
  auto bigger = small();
  bigger.hidden_size = 64;
  model::LlamaForCausalLM b(bigger);
  auto before = b->named_parameters()["model.norm.weight"].clone();
  expect_bad([&] { load_hf_weights(dir.path(), *b); }, "model.embed_tokens.weight' has shape");
  EXPECT_TRUE(torch::equal(before, b->named_parameters()["model.norm.weight"]));  // untouched
}

TEST(HfCheckpoint, MissingAndUnexpectedTensors) {
  test::TempDir dir;
  model::LlamaForCausalLM a(small());
  NamedTensors partial;
  for (const auto& item : a->named_parameters())
    if (item.key() != "model.norm.weight") partial.emplace_back(item.key(), item.value());
  save_safetensors(dir.file("model.safetensors"), partial);
  expect_bad([&] { load_hf_weights(dir.path(), *a); }, "missing tensor 'model.norm.weight'");
  partial.emplace_back("model.norm.weight", torch::ones({32}));
  partial.emplace_back("model.extra.weight", torch::ones({2}));
  save_safetensors(dir.file("model.safetensors"), partial);
  expect_bad([&] { load_hf_weights(dir.path(), *a); }, "unexpected tensor 'model.extra.weight'");
}

TEST(HfCheckpoint, ShardedRoundTripWithHfIndex) {
  test::TempDir dir;
  torch::manual_seed(3);
  model::LlamaForCausalLM a(small());
  save_hf_model(dir.path(), *a, /*max_shard_bytes=*/40000);
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors")));
  auto index = nlohmann::json::parse(test::read_text(dir.file("model.safetensors.index.json")));
  int64_t total = 0;
  for (const auto& item : a->named_parameters()) total += item.value().numel() * 4;
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::set<std::string> files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) files.insert(it.value());
  EXPECT_GE(files.size(), 3u);
  EXPECT_TRUE(files.count("model-00001-of-0000" + std::to_string(files.size()) + ".safetensors"));
  model::LlamaForCausalLM b(small());
  load_hf_weights(dir.path(), *b);
  auto x = torch::randint(0, 256, {1, 4}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));

  // An index that points a tensor at the wrong shard, or at a missing file.
  const std::string first = *files.begin(), last = *files.rbegin();
  index["weight_map"]["model.norm.weight"] = first == index["weight_map"]["model.norm.weight"] ? last : first;
  test::write_text(dir.file("model.safetensors.index.json"), index.dump());
  expect_bad([&] { load_hf_weights(dir.path(), *b); }, "does not hold tensor 'model.norm.weight'");
  index["weight_map"]["model.norm.weight"] = "model-00099-of-00099.safetensors";
  test::write_text(dir.file("model.safetensors.index.json"), index.dump());
  expect_bad([&] { load_hf_weights(dir.path(), *b); }, "model-00099-of-00099.safetensors");
  index["weight_map"]["model.norm.weight"] = "../escape.safetensors";
  test::write_text(dir.file("model.safetensors.index.json"), index.dump());
  expect_bad([&] { load_hf_weights(dir.path(), *b); }, "not a file in");
}

TEST(HfCheckpoint, BadConfigJson) {
  test::TempDir dir;
  test::write_text(dir.file("config.json"), "{ nope");
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "not valid JSON");
  test::write_text(dir.file("config.json"), R"({"hidden_size": 32})");
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "missing key 'intermediate_size'");
  test::write_text(dir.file("config.json"), R"({"model_type": "gpt2"})");
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "not supported");
  test::write_text(dir.file("config.json"),
                   R"({"hidden_size": 30, "intermediate_size": 8, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "vocab_size": 10})");
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "model.num_heads");
  expect_bad([&] { read_hf_config(dir.file("nonexistent"), {}); }, "config.json");
}

TEST(HfCheckpoint, ArchitectureKeysAreHonouredOrRefusedNeverIgnored) {
  // A valid config (head size 16 = 64 / 4) with one key changed at a time; the families
  // and the whole key policy are tested in hf_config_test.cpp.
  const nlohmann::json base = {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 1},
                               {"num_attention_heads", 4}, {"vocab_size", 10}};
  test::TempDir dir;
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json cfg = base;
    cfg[key] = value;
    test::write_text(dir.file("config.json"), cfg.dump());
  };
  with("head_dim", 16);
  EXPECT_EQ(read_hf_config(dir.path(), {}).head_size(), 16);
  with("head_dim", 32);  // q_proj: 64 -> 4 x 32
  EXPECT_EQ(read_hf_config(dir.path(), {}).head_size(), 32);
  with("head_dim", 15);
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "model.head_dim");
  with("attention_bias", true);
  EXPECT_TRUE(read_hf_config(dir.path(), {}).attention_bias);
  with("attention_bias", false);
  EXPECT_FALSE(read_hf_config(dir.path(), {}).attention_bias);
  with("mlp_bias", true);
  EXPECT_TRUE(read_hf_config(dir.path(), {}).mlp_bias);
  with("mlp_bias", "yes");
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "'mlp_bias' must be true or false");
  with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}});
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "key 'rope_scaling' of rope_type \"llama3\" has no low_freq_factor");
  with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}});
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "rope_type \"yarn\", which is not supported");
  with("sliding_window", 64);
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "key 'sliding_window'");
  with("some_new_switch", 1);
  expect_bad([&] { read_hf_config(dir.path(), {}); }, "key 'some_new_switch' is not one gradguard reads");
}

// A model with biases, an explicit head_dim and llama3 rope survives save + load.
TEST(HfCheckpoint, RoundTripOfTheArchitectureSwitches) {
  test::TempDir dir;
  auto o = small();
  o.head_dim = 16, o.attention_bias = true, o.mlp_bias = true;
  o.rope_scaling = model::RopeScaling::kLlama3, o.rope_scaling_original_max_seq_len = 64;
  torch::manual_seed(4);
  model::LlamaForCausalLM a(o);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : a->parameters()) p.normal_(0.0, 0.1);
  }
  save_hf_model(dir.path(), *a);
  auto back = read_hf_config(dir.path(), model::LlamaOptions{});
  EXPECT_EQ(back.head_dim, 16);
  EXPECT_TRUE(back.attention_bias && back.mlp_bias);
  EXPECT_EQ(back.rope_scaling, model::RopeScaling::kLlama3);
  EXPECT_EQ(back.rope_scaling_original_max_seq_len, 64);
  model::LlamaForCausalLM b(back);
  load_hf_weights(dir.path(), *b);
  auto x = torch::randint(0, 256, {2, 5}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
}

}  // namespace
}  // namespace gradguard::checkpoint
