// LoRA adapters (model/lora.h) against the formulas of Hu et al. (arXiv 2106.09685) in
// float64: y = x W^T + b + (alpha / r) x A^T B^T, B = 0 at the start so the adapted model's
// first logits are the base model's bit for bit, dL/dA = 0 at that point (B = 0 blocks it),
// the merge W + (alpha / r) B A (PEFT's get_delta_weight: B @ A * lora_alpha / r) giving
// the adapted logits, the PEFT adapter_config.json format both ways, and every setting a
// user can get wrong refused with its key.
#include "gradguard/model/lora.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/model/llama.h"
#include "test_util.h"

namespace gradguard::model {
namespace {
using ::testing::HasSubstr;

LlamaOptions tiny(bool biases = false) {
  LlamaOptions o;
  o.vocab_size = 64;
  o.hidden_size = 32;
  o.intermediate_size = 48;
  o.num_layers = 2;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.max_seq_len = 32;
  o.attention_bias = biases;
  o.mlp_bias = biases;
  return o;
}

LoraOptions lora(int64_t rank, std::vector<LoraTarget> targets, double alpha = 16.0) {
  LoraOptions o;
  o.rank = rank;
  o.alpha = alpha;
  o.targets = std::move(targets);
  return o;
}

const std::vector<LoraTarget> kAll = {LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,   LoraTarget::kO,
                                      LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};

torch::Tensor ids(int64_t B, int64_t T, int64_t vocab) {
  return (torch::arange(B * T, torch::kLong) * 37 % vocab).reshape({B, T});
}

// Every adapter B drawn at random, as after some training (B = 0 would hide the update).
void randomise_b(LlamaForCausalLMImpl& m) {
  torch::NoGradGuard no_grad;
  for (auto& item : m.named_parameters())
    if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0.0, 0.05);
}

TEST(Lora, FirstForwardEqualsTheBaseModelBitForBit) {
  torch::manual_seed(1);
  LlamaForCausalLM m(tiny(/*biases=*/true));
  m->eval();
  const auto x = ids(2, 12, 64);
  const auto before = m->forward(x);
  add_lora(*m, lora(4, kAll));
  EXPECT_TRUE(torch::equal(m->forward(x), before));
  m->train();
  EXPECT_TRUE(torch::equal(m->forward(x), before));  // no dropout configured: training changes nothing
}

TEST(Lora, AddsPeftNamedAdaptersAndFreezesTheRest) {
  torch::manual_seed(2);
  LlamaForCausalLM m(tiny());
  const int64_t base = count_parameters(*m);
  add_lora(*m, lora(4, {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown}));
  const auto o = m->options();
  const int64_t hd = o.head_size();
  // Per layer: q (32 -> 4*8), v (32 -> 2*8), down (48 -> 32); each adapter r x (in + out).
  const int64_t per_layer = 4 * (32 + o.num_heads * hd) + 4 * (32 + o.num_kv_heads * hd) + 4 * (48 + 32);
  EXPECT_EQ(count_trainable_parameters(*m), o.num_layers * per_layer);
  EXPECT_EQ(count_parameters(*m), base + o.num_layers * per_layer);
  std::set<std::string> adapters;
  for (const auto& item : m->named_parameters()) {
    EXPECT_EQ(item.value().requires_grad(), is_lora_name(item.key())) << item.key();
    if (is_lora_name(item.key())) adapters.insert(item.key());
  }
  EXPECT_EQ(adapters.size(), 2u * 3u * 2u);
  const auto params = m->named_parameters();
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.lora_A.weight"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.lora_B.weight"].sizes(), (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_A.weight"].sizes(), (std::vector<int64_t>{4, 48}));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_B.weight"].sizes(), (std::vector<int64_t>{32, 4}));
  // A: uniform within 1/sqrt(in); B: zero.
  const auto a = params["model.layers.0.mlp.down_proj.lora_A.weight"];
  EXPECT_LE(a.abs().max().item<double>(), 1.0 / std::sqrt(48.0));
  EXPECT_GT(a.abs().max().item<double>(), 0.5 / std::sqrt(48.0));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_B.weight"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(m->lora().rank, 4);
  EXPECT_THAT(test::bad_input_message([&] { add_lora(*m, lora(2, {LoraTarget::kK})); }), HasSubstr("already has"));
}

TEST(Lora, ProjectionMatchesTheFormulaInFloat64) {
  torch::manual_seed(3);
  LlamaForCausalLM m(tiny(/*biases=*/true));
  add_lora(*m, lora(3, {LoraTarget::kO}, /*alpha=*/6.0));
  randomise_b(*m);
  auto& attn = *m->model->layers[0]->as<DecoderLayer>()->self_attn;
  const auto x = torch::randn({2, 5, 32});
  const auto y = project(attn.o_proj, attn.o_lora, x, /*training=*/false);
  auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
  const auto W = d(attn.o_proj->weight), b = d(attn.o_proj->bias), A = d(attn.o_lora.a->weight),
             B = d(attn.o_lora.b->weight);
  const auto want = torch::matmul(d(x), W.t()) + b + (6.0 / 3.0) * torch::matmul(torch::matmul(d(x), A.t()), B.t());
  EXPECT_LT((d(y) - want).abs().max().item<double>(), 1e-5);
  EXPECT_GT((torch::matmul(d(x), A.t())).abs().max().item<double>(), 0.0);
}

TEST(Lora, OnlyAdaptersGetGradientsAndAGetsNoneWhileBIsZero) {
  torch::manual_seed(4);
  LlamaForCausalLM m(tiny());
  add_lora(*m, lora(4, kAll));
  m->train();
  auto logits = m->forward(ids(2, 10, 64));
  logits.pow(2).mean().backward();
  for (const auto& item : m->named_parameters()) {
    const auto& g = item.value().grad();
    if (!is_lora_name(item.key())) {
      EXPECT_FALSE(g.defined()) << item.key();
    } else if (item.key().find("lora_A") != std::string::npos) {
      ASSERT_TRUE(g.defined()) << item.key();
      EXPECT_EQ(g.abs().max().item<double>(), 0.0) << item.key();  // dL/dA = s B^T (...) = 0
    } else {
      ASSERT_TRUE(g.defined()) << item.key();
      EXPECT_GT(g.abs().max().item<double>(), 0.0) << item.key();
    }
  }
}

TEST(Lora, CheckpointedLayersGiveTheSameAdapterGradients) {
  torch::manual_seed(5);
  LlamaForCausalLM plain(tiny());
  add_lora(*plain, lora(2, kAll));
  randomise_b(*plain);
  torch::manual_seed(5);
  auto opts = tiny();
  opts.activation_checkpointing = true;
  LlamaForCausalLM ckpt(opts);
  add_lora(*ckpt, lora(2, kAll));
  {
    torch::NoGradGuard no_grad;
    auto src = plain->named_parameters();
    for (auto& item : ckpt->named_parameters()) item.value().copy_(src[item.key()]);
  }
  plain->train();
  ckpt->train();
  const auto x = ids(2, 9, 64);
  plain->forward(x).pow(2).mean().backward();
  ckpt->forward(x).pow(2).mean().backward();
  auto want = plain->named_parameters();
  int compared = 0;
  for (const auto& item : ckpt->named_parameters()) {
    if (!is_lora_name(item.key())) continue;
    const auto& g = item.value().grad();
    ASSERT_TRUE(g.defined()) << item.key();
    EXPECT_TRUE(torch::allclose(g, want[item.key()].grad(), 1e-5, 1e-7)) << item.key();
    ++compared;
  }
  EXPECT_EQ(compared, 2 * 7 * 2);
}

TEST(Lora, MergedWeightsReproduceTheAdaptedLogits) {
  torch::manual_seed(6);
  LlamaForCausalLM m(tiny(/*biases=*/true));
  add_lora(*m, lora(4, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kUp, LoraTarget::kDown}, 8.0));
  randomise_b(*m);
  m->eval();
  const auto x = ids(2, 16, 64);
  const auto adapted = m->forward(x);
  LlamaForCausalLM plain(tiny(/*biases=*/true));
  plain->eval();
  const auto merged = merged_weights(*m);
  {
    torch::NoGradGuard no_grad;
    auto dst = plain->named_parameters();
    ASSERT_EQ(merged.size(), dst.size());
    for (const auto& [name, t] : merged) dst[name].copy_(t);
  }
  const auto logits = plain->forward(x);
  EXPECT_LT((logits - adapted).abs().max().item<double>(), 1e-5 * std::max(1.0, adapted.abs().max().item<double>()));
  // The merge itself, in float64: W + (alpha / r) B A for an adapted weight, W for the rest.
  auto params = m->named_parameters();
  auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
  for (const auto& [name, t] : merged) {
    EXPECT_FALSE(is_lora_name(name)) << name;
    if (name == "model.layers.1.mlp.up_proj.weight") {
      const auto want = d(params[name]) + (8.0 / 4.0) * torch::matmul(d(params["model.layers.1.mlp.up_proj.lora_B.weight"]),
                                                                       d(params["model.layers.1.mlp.up_proj.lora_A.weight"]));
      EXPECT_LT((d(t) - want).abs().max().item<double>(), 1e-6);
      EXPECT_GT((d(t) - d(params[name])).abs().max().item<double>(), 1e-4);  // the update is there
    }
    if (name == "model.layers.1.self_attn.v_proj.weight") EXPECT_TRUE(torch::equal(t, params[name]));  // not a target
  }
}

TEST(Lora, DropoutActsInTrainingOnlyAndIsRefusedWithCheckpointing) {
  torch::manual_seed(7);
  LlamaForCausalLM m(tiny());
  auto o = lora(4, {LoraTarget::kQ, LoraTarget::kV});
  o.dropout = 0.5;
  add_lora(*m, o);
  randomise_b(*m);
  const auto x = ids(1, 8, 64);
  m->eval();
  const auto e1 = m->forward(x), e2 = m->forward(x);
  EXPECT_TRUE(torch::equal(e1, e2));
  m->train();
  EXPECT_FALSE(torch::equal(m->forward(x), e1));
  EXPECT_THAT(test::bad_input_message([&] { m->set_activation_checkpointing(true); }),
              HasSubstr("model.activation_checkpointing"));
  auto with_ckpt = tiny();
  with_ckpt.activation_checkpointing = true;
  LlamaForCausalLM c(with_ckpt);
  EXPECT_THAT(test::bad_input_message([&] { add_lora(*c, o); }), HasSubstr("lora.dropout"));
}

TEST(Lora, ValidationNamesTheKey) {
  auto msg = [](LoraOptions o, bool ckpt = false) { return test::bad_input_message([&] { o.validate(ckpt); }); };
  auto o = lora(8, {LoraTarget::kQ});
  o.rank = -1;
  EXPECT_THAT(msg(o), HasSubstr("lora.rank"));
  o.rank = 5000;
  EXPECT_THAT(msg(o), HasSubstr("lora.rank"));
  o.rank = 8;
  o.alpha = 0;
  EXPECT_THAT(msg(o), HasSubstr("lora.alpha"));
  o.alpha = std::nan("");
  EXPECT_THAT(msg(o), HasSubstr("lora.alpha"));
  o.alpha = 16;
  o.dropout = 1.0;
  EXPECT_THAT(msg(o), HasSubstr("lora.dropout"));
  o.dropout = 0;
  o.targets.clear();
  EXPECT_THAT(msg(o), HasSubstr("lora.targets"));
  o.targets = {LoraTarget::kQ, LoraTarget::kQ};
  EXPECT_THAT(msg(o), HasSubstr("q_proj twice"));
  o = lora(0, {});  // off: nothing else is looked at
  EXPECT_NO_THROW(o.validate(true));
}

TEST(Lora, PeftAdapterConfigRoundTripsAndForeignOnesAreRefused) {
  auto o = lora(16, {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kGate}, 32.0);
  o.dropout = 0.05;
  const auto c = peft_adapter_config(o, "/models/llama");
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_EQ(c["r"], 16);
  EXPECT_EQ(c["lora_alpha"], 32.0);
  EXPECT_EQ(c["target_modules"].dump(), R"(["q_proj","v_proj","gate_proj"])");
  EXPECT_EQ(c["base_model_name_or_path"], "/models/llama");
  EXPECT_EQ(c["bias"], "none");
  const auto back = lora_from_peft_config(nlohmann::json::parse(c.dump()), "a/lora.json");
  EXPECT_EQ(back.rank, 16);
  EXPECT_EQ(back.alpha, 32.0);
  EXPECT_EQ(back.dropout, 0.05);
  EXPECT_EQ(back.targets, o.targets);

  auto refused = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(peft_adapter_config(lora(8, {LoraTarget::kQ}), "").dump());
    edit(j);
    return test::bad_input_message([&] { lora_from_peft_config(j, "x/lora.json"); });
  };
  EXPECT_THAT(refused([](auto& j) { j["peft_type"] = "IA3"; }), HasSubstr("peft_type"));
  EXPECT_THAT(refused([](auto& j) { j["use_dora"] = true; }), HasSubstr("use_dora"));
  EXPECT_THAT(refused([](auto& j) { j["use_rslora"] = true; }), HasSubstr("use_rslora"));
  EXPECT_THAT(refused([](auto& j) { j["bias"] = "all"; }), HasSubstr("bias"));
  EXPECT_THAT(refused([](auto& j) { j["modules_to_save"] = nlohmann::json::array({"lm_head"}); }), HasSubstr("modules_to_save"));
  EXPECT_THAT(refused([](auto& j) { j["target_modules"] = nlohmann::json::array({"q_proj", "lm_head"}); }), HasSubstr("lm_head"));
  EXPECT_THAT(refused([](auto& j) { j["r"] = 0; }), HasSubstr("x/lora.json"));
  EXPECT_THAT(refused([](auto& j) { j["r"] = "eight"; }), HasSubstr("\"r\""));
  EXPECT_THAT(refused([](auto& j) { j["lora_alpha"] = -1; }), HasSubstr("lora.alpha"));
  EXPECT_THAT(refused([](auto& j) { j = nlohmann::json::array(); }), HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace gradguard::model
