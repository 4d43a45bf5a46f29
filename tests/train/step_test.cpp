// Gradient accumulation: micro 4 x accum 8 must give the gradients of micro 32 x accum 1
// (the global-batch token mean of docs/design.md), to 1e-5 relative.
#include "gradguard/train/step.h"

#include <gtest/gtest.h>

#include "golden_util.h"

namespace gradguard::train {
namespace {

std::vector<torch::Tensor> grads_for(int64_t micro, int64_t accum, const torch::Tensor& inputs,
                                     const torch::Tensor& targets, double* loss) {
  torch::manual_seed(7);
  model::LlamaOptions o;
  o.hidden_size = 64;
  o.intermediate_size = 128;
  o.num_layers = 2;
  model::LlamaForCausalLM model(o);
  std::vector<data::Batch> batches;
  for (int64_t m = 0; m < accum; ++m)
    batches.push_back({inputs.narrow(0, m * micro, micro), targets.narrow(0, m * micro, micro)});
  auto l = accumulate_gradients(*model, batches, targets.numel(), amp::AmpOptions{}, torch::kCPU);
  *loss = l.item<double>();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(Accumulation, MicroTimesAccumEqualsOneBigBatch) {
  torch::manual_seed(3);
  auto tokens = torch::randint(0, 256, {32, 17}, torch::kLong);
  auto inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  double loss_small = 0, loss_big = 0;
  auto small = grads_for(4, 8, inputs, targets, &loss_small);
  auto big = grads_for(32, 1, inputs, targets, &loss_big);
  ASSERT_EQ(small.size(), big.size());
  EXPECT_NEAR(loss_small, loss_big, 1e-5 * loss_big);
  for (size_t i = 0; i < small.size(); ++i) {
    double rel = ((small[i] - big[i]).norm() / big[i].norm()).item<double>();
    EXPECT_LT(rel, 1e-5) << "parameter " << i;
  }
}

TEST(Accumulation, LossIsTokenMeanNotMeanOfMeans) {
  // Unequal micro-batches (3 and 1 rows): the result must equal the token mean over all 4.
  torch::manual_seed(5);
  auto tokens = torch::randint(0, 256, {4, 9}, torch::kLong);
  auto inputs = tokens.narrow(1, 0, 8), targets = tokens.narrow(1, 1, 8);
  double uneven = 0;
  {
    torch::manual_seed(7);
    model::LlamaOptions o;
    o.num_layers = 1;
    model::LlamaForCausalLM model(o);
    uneven = accumulate_gradients(*model,
                                  {{inputs.narrow(0, 0, 3), targets.narrow(0, 0, 3)},
                                   {inputs.narrow(0, 3, 1), targets.narrow(0, 3, 1)}},
                                  targets.numel(), amp::AmpOptions{}, torch::kCPU)
                 .item<double>();
  }
  torch::manual_seed(7);
  model::LlamaOptions o;
  o.num_layers = 1;
  model::LlamaForCausalLM model(o);
  auto logits = model->forward(inputs);
  double mean = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), targets.reshape({-1})).item<double>();
  EXPECT_NEAR(uneven, mean, 1e-6 * mean);
}

TEST(Accumulation, Bf16AutocastTrainsOnCpu) {
  torch::manual_seed(3);
  model::LlamaOptions o;
  o.num_layers = 1;
  model::LlamaForCausalLM model(o);
  auto tokens = torch::randint(0, 256, {2, 9}, torch::kLong);
  amp::AmpOptions bf16;
  bf16.dtype = amp::AmpDtype::kBf16;
  auto loss = accumulate_gradients(*model, {{tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)}}, 16, bf16, torch::kCPU);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.3);  // fresh model: about ln(vocab)
  for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);  // master grads fp32
}

}  // namespace
}  // namespace gradguard::train
