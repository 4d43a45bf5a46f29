// The Llama model against tests/golden/llama_reference.py (a plain PyTorch
// implementation of HF's Llama) and, for the other families, its extension in
// tests/golden/make_family_golden.py (explicit head_dim, q/k/v/o and MLP biases, Llama
// 3.1 rope scaling; Qwen2; Qwen3): logits to 1e-5, the loss, and every parameter's
// gradient norm, loaded from the HF-style golden directories.
#include "gradguard/model/llama.h"

#include <gtest/gtest.h>

#include <set>

#include "golden_util.h"
#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/core/error.h"

namespace gradguard::model {
namespace {

class LlamaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaGolden, ForwardAndGradientsMatchReference) {
  const std::string dir = test::source_path("tests/golden/" + GetParam());
  auto opts = checkpoint::read_hf_config(dir, LlamaOptions{});
  LlamaForCausalLM model(opts);
  checkpoint::load_hf_weights(dir, *model);
  auto g = test::load_golden(GetParam() + "/forward.json");
  auto ids = torch::tensor(g["input_ids"].get<std::vector<std::vector<int64_t>>>()[0], torch::kLong);
  std::vector<torch::Tensor> rows;
  for (const auto& r : g["input_ids"]) rows.push_back(torch::tensor(r.get<std::vector<int64_t>>(), torch::kLong));
  auto input = torch::stack(rows);
  rows.clear();
  for (const auto& r : g["targets"]) rows.push_back(torch::tensor(r.get<std::vector<int64_t>>(), torch::kLong));
  auto targets = torch::stack(rows);

  auto logits = model->forward(input);
  auto expected = test::golden_tensor(g["logits"], g["logits_shape"].get<std::vector<int64_t>>());
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-5);

  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  EXPECT_NEAR(loss.item<double>(), g["loss"].get<double>(), 1e-5);
  loss.backward();
  std::set<std::string> seen;
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(g["grad_norms"].contains(item.key())) << item.key();
    const double want = g["grad_norms"][item.key()];
    EXPECT_NEAR(item.value().grad().norm().item<double>(), want, 1e-4 * want + 1e-7) << item.key();
    seen.insert(item.key());
  }
  EXPECT_EQ(seen.size(), g["grad_norms"].size());  // same parameter set, HF names
}

INSTANTIATE_TEST_SUITE_P(Golden, LlamaGolden,
                         ::testing::Values("llama_tiny", "llama_tiny_tied", "llama3_bias_tiny", "qwen2_tiny",
                                           "qwen3_tiny"));

TEST(Llama, ParameterNamesAreHuggingFace) {
  LlamaOptions o;
  o.num_layers = 2;
  LlamaForCausalLM model(o);
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      expected.push_back(p + n);
  }
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  EXPECT_EQ(names, expected);
  EXPECT_EQ(model->named_parameters()["model.layers.0.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{o.num_kv_heads * o.head_size(), o.hidden_size}));
}

TEST(Llama, ScaledNormalInit) {
  LlamaOptions o;
  o.hidden_size = 256;
  o.intermediate_size = 512;
  o.num_layers = 8;
  torch::manual_seed(0);
  LlamaForCausalLM model(o);
  auto params = model->named_parameters();
  EXPECT_NEAR(params["model.layers.0.self_attn.q_proj.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(params["model.layers.0.mlp.down_proj.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_TRUE(torch::equal(params["model.norm.weight"], torch::ones({256})));
}

TEST(Llama, CausalOutputsIgnoreTheFuture) {
  torch::manual_seed(1);
  LlamaOptions o;
  o.hidden_size = 32;
  o.intermediate_size = 64;
  o.num_layers = 1;
  LlamaForCausalLM model(o);
  auto a = torch::randint(0, 256, {1, 10}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 9}, (a.index({0, 9}) + 1) % 256);  // change only the last token
  auto la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 9), lb.narrow(1, 0, 9), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 9, 1), lb.narrow(1, 9, 1)));
}

TEST(Llama, RejectsInconsistentShapes) {
  LlamaOptions o;
  o.num_kv_heads = 3;
  EXPECT_THROW(LlamaForCausalLM{o}, Error);
  o = {};
  o.num_heads = 5;
  EXPECT_THROW(o.validate(), Error);
  o = {};
  o.max_seq_len = 8;
  LlamaForCausalLM model(o);
  EXPECT_THROW(model->forward(torch::zeros({1, 9}, torch::kLong)), Error);
}

}  // namespace
}  // namespace gradguard::model
