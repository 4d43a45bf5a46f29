// NF4 (model/nf4.h) against the QLoRA paper's definition, evaluated here in float64: the
// code book rebuilt from the normal quantile function (Q(p) = sqrt(2) erfinv(2p - 1)),
// each element's code the nearest by float64 distance, the absmax per block of 64, the
// double-quantized scales within one int8 step of their group, and the linear map over a
// quantized weight equal to the dense one over the dequantized weight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/model/nf4.h"
#include "test_util.h"

namespace gradguard::model {
namespace {

// Q(p) for p spaced evenly from `from` to 0.5 in n points, the last (Q(0.5) = 0) dropped.
std::vector<double> quantiles(double from, int n) {
  std::vector<double> out;
  for (int i = 0; i + 1 < n; ++i) {
    const double p = from + (0.5 - from) * i / (n - 1);
    out.push_back(std::sqrt(2.0) * torch::erfinv(torch::tensor(2 * p - 1, torch::kDouble)).item<double>());
  }
  return out;
}

TEST(Nf4, CodeBookFollowsTheConstructionInFloat64) {
  const double offset = (1 - 1.0 / (2 * 15) + 1 - 1.0 / (2 * 16)) / 2;  // 0.9677083
  std::vector<double> v = quantiles(offset, 9);                        // 8 positive
  for (double q : quantiles(offset, 8)) v.push_back(-q);               // 7 negative
  v.push_back(0.0);
  std::sort(v.begin(), v.end());
  const double top = v.back();
  const auto& book = nf4_code_book();
  ASSERT_EQ(v.size(), book.size());
  // The published table was computed from float32 probabilities: within 2e-7 of float64.
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(book[i], v[i] / top, 5e-7) << i;
  EXPECT_EQ(book[7], 0.0f);
  EXPECT_EQ(book.front(), -1.0f);
  EXPECT_EQ(book.back(), 1.0f);
}

TEST(Nf4, EachElementIsTheNearestCodeTimesItsStoredScale) {
  torch::manual_seed(21);
  auto w = torch::randn({96, 64}) * 0.02;  // 96 blocks of 64
  w[5].zero_();                            // a block of zeros stays zeros
  w[7][3] = 0.5;                           // an outlier sets its block's scale
  const auto q = nf4_quantize(w, "w");
  EXPECT_EQ(q.codes.numel(), 96 * 32);
  EXPECT_EQ(q.scales.numel(), 96);
  const auto scales = nf4_block_scales(q).to(torch::kDouble);
  const auto absmax = w.abs().amax(1).to(torch::kDouble);
  // Double quantization: each absmax within half an int8 step of its group (one group here).
  const double step = q.group_steps[0].item<double>();
  EXPECT_LE((scales - absmax).abs().max().item<double>(), 0.5 * step * (1 + 1e-6) + 1e-7);
  // The reference: the nearest code by float64 distance to the element over its stored
  // scale (clipped to [-1, 1]), the lower code on a tie.
  const auto& book = nf4_code_book();
  const auto deq = nf4_dequantize(q, torch::kDouble);
  const auto wd = w.to(torch::kDouble);
  for (int64_t b = 0; b < 96; ++b) {
    const double s = scales[b].item<double>();
    for (int64_t j = 0; j < 64; ++j) {
      const double x = s > 0 ? std::clamp(wd[b][j].item<double>() / s, -1.0, 1.0) : 0.0;
      size_t best = 0;
      for (size_t i = 1; i < book.size(); ++i)
        if (std::abs(double(book[i]) - x) < std::abs(double(book[best]) - x)) best = i;
      ASSERT_NEAR(deq[b][j].item<double>(), double(book[best]) * s, 1e-7 * std::max(s, 1e-30)) << b << ", " << j;
    }
  }
  EXPECT_EQ(deq[5].abs().max().item<double>(), 0.0);
  EXPECT_NEAR(deq[7][3].item<double>(), 0.5, 0.5 * step + 1e-6);
  EXPECT_EQ(nf4_dequantize(q, torch::kBFloat16).scalar_type(), torch::kBFloat16);
}

TEST(Nf4, StoresAboutHalfAByteAParameter) {
  torch::manual_seed(22);
  const auto w = torch::randn({512, 1024});
  const auto q = nf4_quantize(w, "w");
  const double per_param = static_cast<double>(q.bytes()) / static_cast<double>(w.numel());
  // 0.5 (codes) + 1/64 (int8 scales) + 4/(64 x 256) (group steps), as the paper counts.
  EXPECT_NEAR(per_param, 0.5 + 1.0 / 64 + 4.0 / (64 * 256), 1e-4);
  // The error of a normal weight is a fraction of its spread (the code book's spacing).
  const auto err = (nf4_dequantize(q, torch::kFloat) - w).abs().mean().item<double>();
  EXPECT_LT(err, 0.1 * w.abs().mean().item<double>());
}

TEST(Nf4, LinearEqualsTheDequantizedWeightInForwardAndBackward) {
  torch::manual_seed(23);
  const auto w = torch::randn({48, 128}) * 0.05;
  const auto q = nf4_quantize(w, "w");
  const auto dense = nf4_dequantize(q, torch::kFloat);
  auto x = torch::randn({3, 5, 128}, torch::requires_grad());
  auto y = nf4_linear(x, q);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 48}));
  auto x2 = x.detach().clone().requires_grad_(true);
  auto y2 = torch::matmul(x2, dense.t());
  EXPECT_TRUE(torch::allclose(y, y2, 1e-6, 1e-7));
  const auto g = torch::randn_like(y);
  y.backward(g);
  y2.backward(g);
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-6, 1e-7));
}

TEST(Nf4, AWeightThatDoesNotSplitIntoBlocksIsRefusedNamingIt) {
  EXPECT_THAT(test::bad_input_message([] { nf4_quantize(torch::zeros({3, 7}), "layers.0.q_proj.weight"); }),
              ::testing::HasSubstr("layers.0.q_proj.weight: has 21 elements, which do not split into blocks of 64"));
  EXPECT_THAT(test::bad_input_message([] { nf4_quantize(torch::zeros({64}, torch::kLong), "ids"); }),
              ::testing::HasSubstr("ids: nf4 quantizes floating-point weights"));
}

}  // namespace
}  // namespace gradguard::model
