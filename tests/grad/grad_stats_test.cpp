// Fused gradient statistics: norms against direct per-tensor computation, unscaling,
// the non-finite flag, layer grouping, side values, and the one-read-per-call budget.
#include "gradguard/grad/grad_stats.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "gradguard/core/host_read.h"
#include "gradguard/model/llama.h"

namespace gradguard::grad {
namespace {

TEST(GradStats, NormsMatchDirectComputationAndUnscale) {
  torch::manual_seed(0);
  model::LlamaOptions o;
  o.num_layers = 2;
  o.hidden_size = 32;
  o.intermediate_size = 64;
  model::LlamaForCausalLM model(o);
  auto ids = torch::randint(0, 256, {2, 8}, torch::kLong);
  const double scale = 1024.0;
  (model->forward(ids).logsumexp(-1).mean() * scale).backward();
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) {
    params.push_back(item.value());
    names.push_back(item.key());
  }
  std::vector<double> expected;  // unscaled per-tensor norms, computed directly
  for (const auto& p : params) expected.push_back((p.grad() / scale).norm().item<double>());
  GradStatsComputer computer(params, names);
  auto loss = torch::tensor(2.5f);
  HostReadCounter reads;
  auto s = computer.compute(1.0 / scale, loss.reshape({1}));
  EXPECT_EQ(reads.count(), 1);  // exactly one device->host copy
  ASSERT_EQ(s.tensor_norms.size(), params.size());
  double sq = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_NEAR(s.tensor_norms[i], expected[i], 1e-5 * expected[i] + 1e-9) << names[i];
    sq += expected[i] * expected[i];
  }
  EXPECT_NEAR(s.global_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
  EXPECT_FALSE(s.nonfinite);
  ASSERT_EQ(s.side.size(), 1u);
  EXPECT_EQ(s.side[0], 2.5);
  // The gradients themselves were unscaled in place.
  EXPECT_NEAR(params[0].grad().norm().item<double>(), expected[0], 1e-5 * expected[0]);

  // Layer groups: embed_tokens, layers.0, layers.1, norm, lm_head.
  const auto& g = computer.groups();
  EXPECT_EQ(g.names, (std::vector<std::string>{"embed_tokens", "layers.0", "layers.1", "norm", "lm_head"}));
  double layer0 = 0;
  for (size_t i = 0; i < params.size(); ++i)
    if (names[i].rfind("model.layers.0.", 0) == 0) layer0 += expected[i] * expected[i];
  EXPECT_NEAR(s.layer_norms[1], std::sqrt(layer0), 1e-5 * std::sqrt(layer0));
}

TEST(GradStats, NonFiniteAnywhereFlagsTheStep) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    auto a = torch::zeros({4}, torch::requires_grad()), b = torch::zeros({3}, torch::requires_grad());
    a.mutable_grad() = torch::ones({4});
    b.mutable_grad() = torch::ones({3});
    b.grad()[1] = bad;
    GradStatsComputer computer({a, b}, {"a", "b"});
    auto s = computer.compute(1.0);
    EXPECT_TRUE(s.nonfinite);
    EXPECT_FALSE(std::isfinite(s.global_norm));
    EXPECT_EQ(s.tensor_norms[0], 2.0);
  }
}

TEST(GradStats, MissingGradientsCountAsZero) {
  auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  GradStatsComputer computer({a, b}, {"a", "b"});
  auto s = computer.compute(0.5);
  EXPECT_NEAR(s.global_norm, 2.5, 1e-6);
  EXPECT_EQ(s.tensor_norms[1], 0.0);
}

TEST(GradStats, DeviceHookIsMeasuredInTheSameCopy) {
  auto a = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  GradStatsComputer computer({a}, {"a"});
  HostReadCounter reads;
  auto s = computer.compute(1.0, {}, [](const std::vector<at::Tensor>& grads) {
    for (auto g : grads) g.mul_(0.5);
  });
  EXPECT_EQ(reads.count(), 1);
  EXPECT_NEAR(s.global_norm, 5.0, 1e-6);
  EXPECT_NEAR(s.norm_after_device_clip, 2.5, 1e-6);
}

TEST(GradStats, LayerOfNames) {
  EXPECT_EQ(layer_of("model.layers.12.mlp.up_proj.weight"), "layers.12");
  EXPECT_EQ(layer_of("model.embed_tokens.weight"), "embed_tokens");
  EXPECT_EQ(layer_of("model.norm.weight"), "norm");
  EXPECT_EQ(layer_of("lm_head.weight"), "lm_head");
  // Any other model: up to the first numeric component, else the module path.
  EXPECT_EQ(layer_of("blocks.3.attn.qkv.weight"), "blocks.3");
  EXPECT_EQ(layer_of("transformer.h.11.mlp.c_fc.bias"), "transformer.h.11");
  EXPECT_EQ(layer_of("encoder.embed.weight"), "encoder.embed");
  EXPECT_EQ(layer_of("custom.thing"), "custom");
  EXPECT_EQ(layer_of("bias"), "bias");
}

}  // namespace
}  // namespace gradguard::grad
