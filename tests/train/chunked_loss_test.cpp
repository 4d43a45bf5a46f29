// The chunked output projection + cross-entropy (train/chunked_loss.h) against the whole
// logits: the function alone against the formulas evaluated in float64 on the whole
// [N, V] logits (sum over trained rows of lse - logit[target], and of lse^2), loss and
// both gradients to 1e-6 relative for chunk sizes that do and do not divide N; and the
// trainer's accumulation with loss.chunk_tokens against the unchunked path in float32
// (tied embeddings, LoRA, packed rows, masked targets, z-loss), to 1e-5.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/model/lora.h"
#include "gradguard/train/chunked_loss.h"
#include "gradguard/train/step.h"
#include "test_util.h"

namespace gradguard::train {
namespace {

// max |a - b| / max |b|: 0 for equal tensors.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

TEST(ChunkedLoss, EqualsTheWholeLogitsInFloat64) {
  torch::manual_seed(7);
  const int64_t N = 37, h = 8, V = 50;
  const auto hidden0 = torch::randn({N, h}, torch::kDouble), weight0 = torch::randn({V, h}, torch::kDouble) * 0.5;
  auto targets = torch::randint(0, V, {N}, torch::kLong);
  targets.narrow(0, 3, 6).fill_(data::kIgnoreTarget);
  targets[N - 1] = data::kIgnoreTarget;
  const auto trained = (targets != data::kIgnoreTarget).to(torch::kDouble);
  for (const bool z_loss : {false, true}) {
    // The reference: the whole logits, the formulas as written.
    auto hidden = hidden0.clone().requires_grad_(true), weight = weight0.clone().requires_grad_(true);
    const auto logits = torch::matmul(hidden, weight.t());
    const auto lse = logits.logsumexp(-1);
    const auto picked = logits.gather(1, targets.clamp_min(0).unsqueeze(1)).squeeze(1);
    const auto ce = ((lse - picked) * trained).sum(), z = (lse * lse * trained).sum();
    (0.7 * ce + (z_loss ? 0.3 * z : torch::zeros({}, torch::kDouble))).backward();
    for (const int64_t chunk : {1, 5, 16, 37, 100}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + (z_loss ? ", z-loss" : ""));
      auto hc = hidden0.clone().requires_grad_(true), wc = weight0.clone().requires_grad_(true);
      const auto out = chunked_linear_cross_entropy(hc, wc, targets, chunk, z_loss);
      EXPECT_EQ(out.ce.scalar_type(), torch::kDouble);
      EXPECT_LT(relative(out.ce, ce.detach()), 1e-12);
      ASSERT_EQ(out.z.defined(), z_loss);
      if (z_loss) EXPECT_LT(relative(out.z, z.detach()), 1e-12);
      (0.7 * out.ce + (z_loss ? 0.3 * out.z : torch::zeros({}, torch::kDouble))).backward();
      EXPECT_LT(relative(hc.grad(), hidden.grad()), 1e-6);
      EXPECT_LT(relative(wc.grad(), weight.grad()), 1e-6);
      // Ignored rows get no gradient at all.
      EXPECT_EQ(hc.grad().narrow(0, 3, 6).abs().max().item<double>(), 0.0);
    }
  }
}

TEST(ChunkedLoss, AFrozenWeightGetsNoGradient) {
  torch::manual_seed(8);
  auto hidden = torch::randn({6, 4}, torch::requires_grad()), weight = torch::randn({9, 4});
  const auto out = chunked_linear_cross_entropy(hidden, weight, torch::randint(0, 9, {6}, torch::kLong), 4, false);
  out.ce.backward();
  EXPECT_TRUE(hidden.grad().defined());
  EXPECT_FALSE(weight.grad().defined());
}

model::LlamaOptions tiny(bool tied) {
  model::LlamaOptions o;
  o.vocab_size = 96, o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 2, o.num_heads = 4;
  o.num_kv_heads = 2, o.max_seq_len = 16, o.tie_embeddings = tied;
  return o;
}

// Two micro-batches: one plain, one of packed rows (positions restart, two segments)
// with masked targets.
std::vector<data::Batch> batches() {
  torch::manual_seed(11);
  auto a = torch::randint(0, 96, {2, 13}, torch::kLong), b = torch::randint(0, 96, {3, 13}, torch::kLong);
  data::Batch m0{a.narrow(1, 0, 12).contiguous(), a.narrow(1, 1, 12).contiguous()};
  data::Batch m1{b.narrow(1, 0, 12).contiguous(), b.narrow(1, 1, 12).clone()};
  m1.targets.narrow(1, 0, 4).fill_(data::kIgnoreTarget);
  m1.positions = torch::cat({torch::arange(5, torch::kLong), torch::arange(7, torch::kLong)}).repeat({3, 1});
  m1.segments = torch::cat({torch::zeros({5}, torch::kLong), torch::ones({7}, torch::kLong)}).repeat({3, 1});
  return {m0, m1};
}

TEST(ChunkedLoss, TheTrainersAccumulationMatchesTheWholeLogits) {
  const auto bs = batches();
  int64_t n = 0;
  for (const auto& b : bs) n += (b.targets != data::kIgnoreTarget).sum().item<int64_t>();
  for (const bool tied : {false, true}) {
    for (const bool lora : {false, true}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (lora ? ", LoRA" : ""));
      torch::manual_seed(3);
      model::LlamaForCausalLM net(tiny(tied));
      if (lora) {
        model::LoraOptions l;
        l.rank = 4;
        model::add_lora(*net, l);
        torch::NoGradGuard no_grad;
        for (auto& p : net->parameters())
          if (p.requires_grad()) p.normal_(0, 0.05);  // B starts at 0: give the adapters a gradient path
      }
      auto run = [&](int64_t chunk) {
        net->zero_grad();
        auto acc = accumulate(*net, bs, n, amp::AmpOptions{}, torch::kCPU, 1.0, false, {}, LossTerms{1e-3, chunk});
        std::vector<torch::Tensor> g;
        for (const auto& p : net->parameters())
          if (p.grad().defined()) g.push_back(p.grad().clone());
        return std::make_tuple(acc.loss, acc.z_loss, acc.micro_losses, g);
      };
      const auto [loss0, z0, micro0, g0] = run(0);
      for (const int64_t chunk : {1, 7, 64, 1000}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const auto [loss, z, micro, g] = run(chunk);
        EXPECT_LT(relative(loss, loss0), 1e-6);
        EXPECT_LT(relative(z, z0), 1e-6);
        ASSERT_EQ(micro.size(), micro0.size());
        for (size_t i = 0; i < micro.size(); ++i) EXPECT_LT(relative(micro[i], micro0[i]), 1e-6);
        ASSERT_EQ(g.size(), g0.size());
        ASSERT_FALSE(g.empty());
        for (size_t k = 0; k < g.size(); ++k) EXPECT_LT(relative(g[k], g0[k]), 1e-5) << k;
      }
    }
  }
}

// Under bf16 autocast the chunk's product is in bf16 as lm_head's is; the loss is then
// widened to float32 either way. The gradients differ by bf16 rounding only.
TEST(ChunkedLoss, Bf16AutocastStaysWithinItsRounding) {
  const auto bs = batches();
  int64_t n = 0;
  for (const auto& b : bs) n += (b.targets != data::kIgnoreTarget).sum().item<int64_t>();
  torch::manual_seed(3);
  model::LlamaForCausalLM net(tiny(false));
  amp::AmpOptions bf16;
  bf16.dtype = amp::AmpDtype::kBf16;
  auto run = [&](int64_t chunk) {
    net->zero_grad();
    auto acc = accumulate(*net, bs, n, bf16, torch::kCPU, 1.0, false, {}, LossTerms{0, chunk});
    return std::make_pair(acc.loss, net->output_weight().grad().clone());
  };
  const auto [loss0, g0] = run(0);
  const auto [loss, g] = run(5);
  EXPECT_LT(relative(loss, loss0), 1e-3);
  EXPECT_LT(relative(g, g0), 3e-2);
  EXPECT_EQ(g.scalar_type(), torch::kFloat);
}

TEST(ChunkedLoss, ANegativeChunkIsRefusedNamingTheKey) {
  EXPECT_THAT(test::bad_input_message([] { config::load_config("", {"loss.chunk_tokens=-1"}); }),
              ::testing::HasSubstr("loss.chunk_tokens: must be >= 0"));
}

}  // namespace
}  // namespace gradguard::train
