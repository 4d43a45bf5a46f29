// The architecture switches of LlamaOptions beyond plain Llama: explicit head_dim,
// attention_bias / qkv_bias / mlp_bias and Qwen3's qk_norm give the parameters, names and
// shapes of the HF classes (checked here), and their math is checked against the Python
// reference by the golden directories in llama_test.cpp (llama3_bias_tiny, qwen2_tiny,
// qwen3_tiny). Validation names the key of each refused combination.
#include <gtest/gtest.h>

#include <map>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/model/llama.h"

namespace gradguard::model {
namespace {

LlamaOptions tiny() {
  LlamaOptions o;
  o.vocab_size = 40, o.hidden_size = 24, o.intermediate_size = 32, o.num_layers = 1, o.num_heads = 4;
  o.num_kv_heads = 2, o.max_seq_len = 16;
  return o;
}

std::map<std::string, std::vector<int64_t>> shapes(const LlamaOptions& o) {
  LlamaForCausalLM m(o);
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& item : m->named_parameters()) out[item.key()] = item.value().sizes().vec();
  return out;
}

const std::string kAttn = "model.layers.0.self_attn.";
const std::string kMlp = "model.layers.0.mlp.";

TEST(Families, ExplicitHeadDimSizesTheProjections) {
  auto o = tiny();
  o.head_dim = 10;  // not 24 / 4
  auto s = shapes(o);
  EXPECT_EQ(s[kAttn + "q_proj.weight"], (std::vector<int64_t>{40, 24}));  // heads x head_dim outputs
  EXPECT_EQ(s[kAttn + "k_proj.weight"], (std::vector<int64_t>{20, 24}));
  EXPECT_EQ(s[kAttn + "v_proj.weight"], (std::vector<int64_t>{20, 24}));
  EXPECT_EQ(s[kAttn + "o_proj.weight"], (std::vector<int64_t>{24, 40}));  // heads x head_dim inputs
  LlamaForCausalLM m(o);
  EXPECT_EQ(m->forward(torch::randint(0, 40, {2, 7}, torch::kLong)).sizes(), (std::vector<int64_t>{2, 7, 40}));
}

TEST(Families, BiasesAndQkNormFollowTheHfClasses) {
  auto o = tiny();
  o.attention_bias = true;  // HF LlamaAttention: q, k, v and o
  o.mlp_bias = true;
  auto s = shapes(o);
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) EXPECT_TRUE(s.count(kAttn + p + ".bias")) << p;
  EXPECT_EQ(s[kAttn + "o_proj.bias"], (std::vector<int64_t>{24}));
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) EXPECT_TRUE(s.count(kMlp + p + ".bias")) << p;
  EXPECT_EQ(s.size(), 3u + 9u + 7u);  // embed, norm, lm_head; 9 weights; 7 biases

  o = tiny();
  o.qkv_bias = true;  // Qwen2
  s = shapes(o);
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) EXPECT_TRUE(s.count(kAttn + p + ".bias")) << p;
  EXPECT_FALSE(s.count(kAttn + "o_proj.bias"));
  EXPECT_EQ(s[kAttn + "k_proj.bias"], (std::vector<int64_t>{12}));
  EXPECT_FALSE(s.count(kMlp + "up_proj.bias"));

  o = tiny();
  o.qk_norm = true;  // Qwen3: one weight per head channel, shared by the heads
  o.head_dim = 8;
  s = shapes(o);
  EXPECT_EQ(s[kAttn + "q_norm.weight"], (std::vector<int64_t>{8}));
  EXPECT_EQ(s[kAttn + "k_norm.weight"], (std::vector<int64_t>{8}));
  EXPECT_FALSE(s.count(kAttn + "q_proj.bias"));
}

TEST(Families, BiasesStartAtZeroAndTrain) {
  auto o = tiny();
  o.attention_bias = true, o.mlp_bias = true;
  torch::manual_seed(4);
  LlamaForCausalLM m(o);
  for (const auto& item : m->named_parameters()) {
    const auto& name = item.key();
    if (name.size() > 5 && name.substr(name.size() - 5) == ".bias") {
      EXPECT_TRUE(torch::equal(item.value(), torch::zeros_like(item.value()))) << name;
    }
  }
  auto ids = torch::randint(0, 40, {2, 6}, torch::kLong);
  m->forward(ids).pow(2).sum().backward();
  for (const auto& item : m->named_parameters())
    EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0) << item.key();
}

TEST(Families, QkNormNormalisesEachHeadBeforeRope) {
  // Scaling q_proj's weights scales q; RMSNorm per head undoes it, so the logits stay.
  auto o = tiny();
  o.qk_norm = true;
  o.rms_norm_eps = 1e-12;  // so that the scale cancels to float rounding
  torch::manual_seed(5);
  LlamaForCausalLM m(o);
  auto ids = torch::randint(0, 40, {1, 9}, torch::kLong);
  auto before = m->forward(ids);
  {
    torch::NoGradGuard no_grad;
    m->named_parameters()[kAttn + "q_proj.weight"].mul_(7.0);
    m->named_parameters()[kAttn + "k_proj.weight"].mul_(0.25);
  }
  EXPECT_LT((m->forward(ids) - before).abs().max().item<double>(), 1e-5);
}

TEST(Families, ValidationNamesTheKey) {
  auto where = [](const LlamaOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      return e.where();
    }
    return std::string("(valid)");
  };
  auto o = tiny();
  o.head_dim = 7;
  EXPECT_EQ(where(o), "model.head_dim");  // odd: no rotary pairs
  o.head_dim = -2;
  EXPECT_EQ(where(o), "model.head_dim");
  o = tiny(), o.num_heads = 5;
  EXPECT_EQ(where(o), "model.num_heads");  // 24 % 5 with head_dim 0
  o.head_dim = 8, o.num_kv_heads = 5;
  EXPECT_EQ(where(o), "(valid)");  // an explicit head_dim frees num_heads from hidden_size
  o = tiny(), o.mlp_bias = true, o.qk_norm = true;
  EXPECT_EQ(where(o), "model.mlp_bias");
  o = tiny(), o.mlp_bias = true, o.qkv_bias = true;
  EXPECT_EQ(where(o), "model.mlp_bias");
  o.attention_bias = true;  // q/k/v/o biases + MLP biases: HF Llama
  EXPECT_EQ(where(o), "(valid)");
  o = tiny(), o.qkv_bias = true, o.qk_norm = true;
  EXPECT_EQ(where(o), "model.qkv_bias");
  o = tiny(), o.sliding_window = -1;
  EXPECT_EQ(where(o), "model.sliding_window");
  o = tiny(), o.sliding_window = 8, o.qkv_bias = true;  // Mistral has no biases
  EXPECT_EQ(where(o), "model.sliding_window");
}

// Mistral's window: a sequence up to it is plain causal attention (the same logits as the
// model without a window), a longer one is refused naming the window rather than computed
// with attention the checkpoint was not trained with.
TEST(Families, SequencesLongerThanTheWindowAreRefused) {
  auto o = tiny();
  torch::manual_seed(5);
  LlamaForCausalLM plain(o);
  o.sliding_window = 8;
  LlamaForCausalLM windowed(o);
  {
    torch::NoGradGuard no_grad;
    auto from = plain->named_parameters();
    for (auto& item : windowed->named_parameters()) item.value().copy_(from[item.key()]);
  }
  auto ids = torch::randint(0, o.vocab_size, {2, 8}, torch::kLong);
  EXPECT_TRUE(torch::equal(windowed->forward(ids), plain->forward(ids)));
  auto longer = torch::randint(0, o.vocab_size, {2, 9}, torch::kLong);
  try {
    windowed->forward(longer);
    ADD_FAILURE() << "a sequence of 9 tokens passed a window of 8";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "data.seq_len");
    EXPECT_NE(std::string(e.what()).find("exceeds model.sliding_window 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradguard::model
