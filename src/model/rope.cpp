// Rotary frequencies (see rope.h for the formulas). The llama3 rescaling is written with
// the same float32 tensor operations, in the same order, as HF's
// _compute_llama3_parameters (wavelength = 2 pi * (1 / f), comparisons and blend in
// float32 against double constants), so a Llama 3.1 checkpoint gets HF's table exactly;
// tests/model/rope_test.cpp checks the table against the formula in float64.
#include "gradguard/model/rope.h"

#include <cmath>

#include <torch/torch.h>

namespace gradguard::model {
namespace {

// Llama 3.1's wavelength-dependent rescaling of `inv_freq` [hd / 2] float32.
at::Tensor llama3_scaling(const at::Tensor& inv_freq, const LlamaOptions& o) {
  const double factor = o.rope_scaling_factor;
  const double low = o.rope_scaling_low_freq_factor, high = o.rope_scaling_high_freq_factor;
  const double old_context = static_cast<double>(o.rope_scaling_original_max_seq_len);
  const double low_freq_wavelen = old_context / low;    // longer wavelengths are divided by factor
  const double high_freq_wavelen = old_context / high;  // shorter ones are kept
  auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  auto smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
  auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  auto medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
  return torch::where(medium, smoothed, scaled);
}

}  // namespace

at::Tensor rope_inv_freq(const LlamaOptions& o) {
  const int64_t hd = o.head_size();
  // In float32 from a float32 exponent, as HF does.
  auto exponent = torch::arange(0, hd, 2, torch::kLong).to(torch::kFloat) / static_cast<float>(hd);
  auto inv_freq = 1.0 / torch::pow(static_cast<float>(o.rope_theta), exponent);  // [hd / 2]
  switch (o.rope_scaling) {
    case RopeScaling::kNone:
      return inv_freq;
    case RopeScaling::kLlama3:
      return llama3_scaling(inv_freq, o);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled RopeScaling");
}

}  // namespace gradguard::model
