// Causal attention (both the kernel the build uses and the portable matmul path) against
// the textbook formula written out here: K/V heads repeated as HF's repeat_kv does,
// softmax(q k^T / sqrt(hd) + upper-triangular -inf) v, in float64; with a packed-segment
// mask, the same formula with -inf wherever the key is later or in another segment.
#include "gradguard/model/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/compat.h"

namespace gradguard::model {
namespace {

// segments undefined: plain causal; else [B, T] ids, and key j is hidden from query i
// unless j <= i and segments[b, j] == segments[b, i] (written element by element).
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& segments = {}) {
  const int64_t B = q.size(0), T = q.size(2), groups = q.size(1) / k.size(1);
  auto qd = q.to(torch::kDouble), kd = k.to(torch::kDouble).repeat_interleave(groups, 1),
       vd = v.to(torch::kDouble).repeat_interleave(groups, 1);
  auto scores = torch::matmul(qd, kd.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  auto hidden = torch::zeros({B, 1, T, T}, torch::kBool);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        hidden[b][0][i][j] = j > i || (segments.defined() && segments[b][i].item<int64_t>() != segments[b][j].item<int64_t>());
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vd);
}

struct Case {
  int64_t heads, kv_heads;
};

class Attention : public ::testing::TestWithParam<Case> {};

// Forward and the gradients of q, k, v (float32) agree with the float64 formula.
void check_against_reference(at::Tensor (*attention)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     const at::Tensor&),
                             const Case& c) {
  torch::manual_seed(7);
  const int64_t B = 2, T = 9, hd = 8;
  auto q = torch::randn({B, c.heads, T, hd}, torch::requires_grad());
  auto k = torch::randn({B, c.kv_heads, T, hd}, torch::requires_grad());
  auto v = torch::randn({B, c.kv_heads, T, hd}, torch::requires_grad());
  auto upstream = torch::randn({B, c.heads, T, hd});

  auto out = attention(q, k, v, at::Tensor());
  ASSERT_EQ(out.sizes(), q.sizes());
  auto grads = torch::autograd::grad({out}, {q, k, v}, {upstream});

  auto q64 = q.detach().to(torch::kDouble).requires_grad_(), k64 = k.detach().to(torch::kDouble).requires_grad_(),
       v64 = v.detach().to(torch::kDouble).requires_grad_();
  auto ref = reference(q64, k64, v64);
  auto ref_grads = torch::autograd::grad({ref}, {q64, k64, v64}, {upstream.to(torch::kDouble)});

  // float32 against float64 on O(1) values: 1e-5 absolute leaves room for the
  // different summation orders of fused kernels.
  EXPECT_LT((out.to(torch::kDouble) - ref).abs().max().item<double>(), 1e-5);
  for (int i = 0; i < 3; ++i)
    EXPECT_LT((grads[i].to(torch::kDouble) - ref_grads[i]).abs().max().item<double>(), 1e-4) << "grad " << i;
}

// The same with a packed-segment mask: row 0 holds samples of 3, 4 and 2 tokens, row 1
// of 6 and 3 (ids not in order, to show only equality matters).
void check_masked_against_reference(at::Tensor (*attention)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            const at::Tensor&),
                                    const Case& c) {
  torch::manual_seed(8);
  const int64_t B = 2, T = 9, hd = 8;
  auto segments = torch::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, 5, 5, 5, 5, 5, 5, 3, 3, 3}, torch::kLong).view({B, T});
  auto q = torch::randn({B, c.heads, T, hd}, torch::requires_grad());
  auto k = torch::randn({B, c.kv_heads, T, hd}, torch::requires_grad());
  auto v = torch::randn({B, c.kv_heads, T, hd}, torch::requires_grad());
  auto upstream = torch::randn({B, c.heads, T, hd});

  auto out = attention(q, k, v, segment_mask(segments));
  auto grads = torch::autograd::grad({out}, {q, k, v}, {upstream});
  auto q64 = q.detach().to(torch::kDouble).requires_grad_(), k64 = k.detach().to(torch::kDouble).requires_grad_(),
       v64 = v.detach().to(torch::kDouble).requires_grad_();
  auto ref = reference(q64, k64, v64, segments);
  auto ref_grads = torch::autograd::grad({ref}, {q64, k64, v64}, {upstream.to(torch::kDouble)});
  EXPECT_LT((out.to(torch::kDouble) - ref).abs().max().item<double>(), 1e-5);
  for (int i = 0; i < 3; ++i)
    EXPECT_LT((grads[i].to(torch::kDouble) - ref_grads[i]).abs().max().item<double>(), 1e-4) << "grad " << i;
}

TEST_P(Attention, KernelInUseMatchesTheFormula) { check_against_reference(&causal_attention, GetParam()); }

TEST_P(Attention, PortableMatmulPathMatchesTheFormula) {
  check_against_reference(&causal_attention_matmul, GetParam());
}

TEST_P(Attention, KernelInUseMatchesTheFormulaWithSegments) {
  check_masked_against_reference(&causal_attention, GetParam());
}

TEST_P(Attention, PortableMatmulPathMatchesTheFormulaWithSegments) {
  check_masked_against_reference(&causal_attention_matmul, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Heads, Attention,
                         ::testing::Values(Case{4, 4} /* MHA */, Case{4, 2} /* GQA */, Case{6, 1} /* MQA */),
                         [](const auto& info) {
                           return std::to_string(info.param.heads) + "q" + std::to_string(info.param.kv_heads) + "kv";
                         });

// Under bf16 autocast both paths stay within bf16 rounding of the float64 formula.
TEST(Attention, Bf16AutocastStaysWithinBf16Rounding) {
  torch::manual_seed(3);
  auto q = torch::randn({1, 4, 16, 16}).to(torch::kBFloat16);
  auto k = torch::randn({1, 2, 16, 16}).to(torch::kBFloat16);
  auto v = torch::randn({1, 2, 16, 16}).to(torch::kBFloat16);
  auto ref = reference(q, k, v);
  // With segments the masked scores are bf16 too: -inf is a bf16 value, so the mask holds.
  auto segments = torch::tensor({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2}, torch::kLong).view({1, 16});
  auto ref_packed = reference(q, k, v, segments);
  for (auto* f : {&causal_attention, &causal_attention_matmul}) {
    auto out = f(q, k, v, at::Tensor());
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    // bf16 keeps 8 significant bits: outputs of magnitude <= ~3 are within ~2^-6.
    EXPECT_LT((out.to(torch::kDouble) - ref).abs().max().item<double>(), 0.05);
    auto packed = f(q, k, v, segment_mask(segments));
    EXPECT_EQ(packed.scalar_type(), torch::kBFloat16);
    EXPECT_LT((packed.to(torch::kDouble) - ref_packed).abs().max().item<double>(), 0.05);
  }
}

// The first query position sees only the first key: its output is v[0] exactly.
TEST(Attention, FirstPositionReturnsFirstValue) {
  auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 1, 5, 4}), v = torch::randn({1, 1, 5, 4});
  auto out = causal_attention(q, k, v);
  for (int h = 0; h < 2; ++h) EXPECT_TRUE(torch::allclose(out[0][h][0], v[0][0][0], 1e-6, 1e-6));
}

}  // namespace
}  // namespace gradguard::model
