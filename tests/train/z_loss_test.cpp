// PaLM's z-loss (Chowdhery et al. 2022, §5: "z_loss = 1e-4 * log^2 Z"): the reported term
// and the gradient it adds, checked against the formula evaluated in float64 on the same
// logits -- c x sum over trained targets of logsumexp(logits)^2 / trained targets of the
// global batch -- and the cross-entropy the guard watches left untouched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "gradguard/config/config.h"
#include "gradguard/train/step.h"
#include "test_util.h"

namespace gradguard::train {
namespace {

model::LlamaOptions tiny() {
  model::LlamaOptions o;
  o.vocab_size = 64, o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 2, o.num_heads = 4;
  o.num_kv_heads = 2, o.max_seq_len = 16;
  return o;
}

// Two micro-batches of unequal trained-target counts (ignored targets in the second).
std::vector<data::Batch> batches() {
  torch::manual_seed(11);
  auto a = torch::randint(0, 64, {2, 9}, torch::kLong), b = torch::randint(0, 64, {3, 9}, torch::kLong);
  data::Batch m0{a.narrow(1, 0, 8).contiguous(), a.narrow(1, 1, 8).contiguous()};
  data::Batch m1{b.narrow(1, 0, 8).contiguous(), b.narrow(1, 1, 8).clone()};
  m1.targets.narrow(1, 0, 3).fill_(data::kIgnoreTarget);
  return {m0, m1};
}

int64_t trained(const std::vector<data::Batch>& bs) {
  int64_t n = 0;
  for (const auto& b : bs) n += (b.targets != data::kIgnoreTarget).sum().item<int64_t>();
  return n;
}

std::vector<torch::Tensor> grads(model::LlamaForCausalLM& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST(ZLoss, TermAndGradientFollowTheFormulaInFloat64) {
  const double c = 0.01;  // 100x PaLM's, so the term's gradient is far above float32 noise
  const auto bs = batches();
  const int64_t n = trained(bs);
  torch::manual_seed(3);
  model::LlamaForCausalLM net(tiny());

  // The reference: the same float32 logits, the objective in float64.
  torch::Tensor want_z = torch::zeros({}, torch::kDouble), want_ce = torch::zeros({}, torch::kDouble);
  net->zero_grad();
  for (const auto& b : bs) {
    auto logits = net->forward(b.inputs).reshape({-1, 64}).to(torch::kDouble);
    auto t = b.targets.reshape({-1});
    auto keep = (t != data::kIgnoreTarget).to(torch::kDouble);
    auto lse = torch::logsumexp(logits, -1);
    auto picked = logits.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
    auto ce = ((lse - picked) * keep).sum(), z = (lse * lse * keep).sum();
    ((ce + c * z) / static_cast<double>(n)).backward();
    want_ce += ce.detach() / static_cast<double>(n);
    want_z += c * z.detach() / static_cast<double>(n);
  }
  const auto want_grads = grads(net);

  net->zero_grad();
  auto acc = accumulate(*net, bs, n, amp::AmpOptions{}, torch::kCPU, 1.0, false, {}, c);
  ASSERT_TRUE(acc.z_loss.defined());
  EXPECT_NEAR(acc.z_loss.item<double>(), want_z.item<double>(), 1e-6 * want_z.item<double>());
  EXPECT_NEAR(acc.loss.item<double>(), want_ce.item<double>(), 1e-6 * want_ce.item<double>());  // CE only
  const auto got = grads(net);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LT(((got[i].to(torch::kDouble) - want_grads[i].to(torch::kDouble)).norm() /
               want_grads[i].to(torch::kDouble).norm()).item<double>(), 1e-5)
        << "parameter " << i;
}

TEST(ZLoss, OffLeavesTheLossAndAddsNothing) {
  const auto bs = batches();
  const int64_t n = trained(bs);
  torch::manual_seed(3);
  model::LlamaForCausalLM net(tiny());
  auto off = accumulate(*net, bs, n, amp::AmpOptions{}, torch::kCPU, 1.0, false);
  EXPECT_FALSE(off.z_loss.defined());
  const auto g_off = grads(net);
  net->zero_grad();
  auto on = accumulate(*net, bs, n, amp::AmpOptions{}, torch::kCPU, 1.0, false, {}, 1e-4);
  // The watched loss and micro-batch losses are the cross-entropy, bit for bit.
  EXPECT_EQ(on.loss.item<float>(), off.loss.item<float>());
  for (size_t m = 0; m < bs.size(); ++m) EXPECT_EQ(on.micro_losses[m].item<float>(), off.micro_losses[m].item<float>());
  // ... while the gradient changed: the term is in the objective.
  const auto g_on = grads(net);
  double diff = 0;
  for (size_t i = 0; i < g_on.size(); ++i) diff += (g_on[i] - g_off[i]).abs().sum().item<double>();
  EXPECT_GT(diff, 0);
}

TEST(ZLoss, MicroBatchesSplitItExactly) {
  // One micro-batch of all rows against the two: the same term (the global-batch mean).
  const auto bs = batches();
  const int64_t n = trained(bs);
  torch::manual_seed(3);
  model::LlamaForCausalLM net(tiny());
  auto split = accumulate(*net, bs, n, amp::AmpOptions{}, torch::kCPU, 1.0, false, {}, 1e-3);
  // Pad the first micro-batch's 2 rows into the second's shape: equal T, so stack rows.
  data::Batch whole{torch::cat({bs[0].inputs, bs[1].inputs}), torch::cat({bs[0].targets, bs[1].targets})};
  net->zero_grad();
  auto one = accumulate(*net, {whole}, n, amp::AmpOptions{}, torch::kCPU, 1.0, false, {}, 1e-3);
  EXPECT_NEAR(split.z_loss.item<double>(), one.z_loss.item<double>(), 1e-6 * one.z_loss.item<double>());
}

TEST(ZLoss, CoefficientOutOfRangeNamesTheKey) {
  for (const char* v : {"-1e-4", "1", "nan"}) {
    const auto msg = test::bad_input_message([&] { config::load_config("", {std::string("loss.z_loss=") + v}); });
    EXPECT_THAT(msg, ::testing::HasSubstr("loss.z_loss")) << v;
  }
  EXPECT_EQ(config::load_config("", {"loss.z_loss=1e-4"}).loss.z_loss, 1e-4);
}

}  // namespace
}  // namespace gradguard::train
