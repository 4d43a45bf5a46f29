// Rotary frequencies (model/rope.h) against the formulas written out here in float64:
// plain RoPE, theta^(-2i / hd), and Llama 3.1's wavelength-dependent scaling as published
// in Meta's Llama 3.1 reference code (llama-models, `apply_scaling`) and reproduced by
// Hugging Face's `_compute_llama3_parameters`. A float32 table within 1e-6 relative of
// the float64 formula (float32 rounding of theta^x is ~6e-8 relative; the blend adds a
// few ulps). The golden llama3_bias_tiny directory also carries the table its Python
// generator computed (tests/golden/make_family_golden.py, Meta's loop form).
#include "gradguard/model/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "golden_util.h"
#include "gradguard/core/error.h"

namespace gradguard::model {
namespace {

// The published llama3 rule, one frequency at a time, in float64.
std::vector<double> llama3_reference(int64_t hd, double theta, double factor, double low, double high,
                                     double original) {
  std::vector<double> out;
  const double low_wavelen = original / low, high_wavelen = original / high;
  for (int64_t i = 0; i < hd; i += 2) {
    const double f = std::pow(theta, -static_cast<double>(i) / static_cast<double>(hd));
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) {
      out.push_back(f);
    } else if (wavelen > low_wavelen) {
      out.push_back(f / factor);
    } else {
      const double smooth = (original / wavelen - low) / (high - low);
      out.push_back((1 - smooth) * f / factor + smooth * f);
    }
  }
  return out;
}

void expect_table(const at::Tensor& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.scalar_type(), torch::kFloat);
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i].item<double>(), want[i], rel * want[i]) << "inv_freq[" << i << "]";
}

TEST(Rope, PlainInvFreqIsThetaToTheMinusTwoIOverHd) {
  LlamaOptions o;
  o.hidden_size = 256, o.num_heads = 2;  // hd = 128
  o.rope_theta = 500000.0;
  std::vector<double> want;
  for (int64_t i = 0; i < 128; i += 2) want.push_back(std::pow(500000.0, -i / 128.0));
  expect_table(rope_inv_freq(o), want, 1e-6);
}

// Llama 3.1 8B's own constants: hd 128, theta 500000, factor 8, low 1, high 4, 8192.
TEST(Rope, Llama3ScalingOfLlama31MatchesThePublishedFormula) {
  LlamaOptions o;
  o.hidden_size = 4096, o.num_heads = 32, o.num_kv_heads = 8, o.max_seq_len = 131072;
  o.rope_theta = 500000.0;
  o.rope_scaling = RopeScaling::kLlama3;
  o.rope_scaling_factor = 8.0, o.rope_scaling_low_freq_factor = 1.0, o.rope_scaling_high_freq_factor = 4.0;
  o.rope_scaling_original_max_seq_len = 8192;
  o.validate();
  const auto want = llama3_reference(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
  const auto got = rope_inv_freq(o);
  expect_table(got, want, 1e-6);
  // All three regimes occur: kept (i = 0), blended, and divided by 8 (the last).
  const double plain_first = 1.0, plain_last = std::pow(500000.0, -126.0 / 128.0);
  EXPECT_EQ(got[0].item<double>(), plain_first);
  EXPECT_NEAR(got[63].item<double>(), plain_last / 8.0, 1e-6 * plain_last);
  int blended = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128.0), g = got[i].item<double>();
    if (std::abs(g - f) > 1e-6 * f && std::abs(g - f / 8) > 1e-6 * f) ++blended;
  }
  EXPECT_GT(blended, 0);
}

// Another set of constants, and the table the golden directory's Python generator wrote.
TEST(Rope, Llama3ScalingMatchesTheGoldenGenerator) {
  auto g = test::load_golden("llama3_bias_tiny/forward.json");
  LlamaOptions o;
  o.hidden_size = 32, o.num_heads = 4, o.head_dim = 16, o.max_seq_len = 64;
  o.rope_scaling = RopeScaling::kLlama3;
  o.rope_scaling_factor = 8.0, o.rope_scaling_low_freq_factor = 1.0, o.rope_scaling_high_freq_factor = 4.0;
  o.rope_scaling_original_max_seq_len = 32;
  const auto got = rope_inv_freq(o);
  expect_table(got, llama3_reference(16, 10000.0, 8.0, 1.0, 4.0, 32.0), 1e-6);
  expect_table(got, g["inv_freq"].get<std::vector<double>>(), 1e-6);
}

TEST(Rope, ScalingFieldsAreValidatedByName) {
  LlamaOptions o;
  o.rope_scaling = RopeScaling::kLlama3;
  auto where = [&] {
    try {
      o.validate();
    } catch (const Error& e) {
      return e.where();
    }
    return std::string("(valid)");
  };
  EXPECT_EQ(where(), "(valid)");
  o.rope_scaling_factor = 0.5;
  EXPECT_EQ(where(), "model.rope_scaling_factor");
  o = {}, o.rope_scaling = RopeScaling::kLlama3, o.rope_scaling_high_freq_factor = 1.0;
  EXPECT_EQ(where(), "model.rope_scaling_high_freq_factor");
  o = {}, o.rope_scaling = RopeScaling::kLlama3, o.rope_scaling_low_freq_factor = 0;
  EXPECT_EQ(where(), "model.rope_scaling_low_freq_factor");
  o = {}, o.rope_scaling = RopeScaling::kLlama3, o.rope_scaling_original_max_seq_len = 0;
  EXPECT_EQ(where(), "model.rope_scaling_original_max_seq_len");
  o = {}, o.rope_scaling_factor = 0.5;  // ignored without scaling
  EXPECT_EQ(where(), "(valid)");
}

}  // namespace
}  // namespace gradguard::model
