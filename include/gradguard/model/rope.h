// Rotary embedding frequencies. The model's rotary tables are cos/sin of position x
// inv_freq; this is the one place inv_freq is computed, for plain RoPE and for the
// frequency scalings the options allow (LlamaOptions::rope_scaling).
//
// Plain: inv_freq[i] = theta^(-2i / hd), i < hd / 2, computed in float32 from a float32
// exponent as Hugging Face does, so tables (and logits) match HF bit for bit.
//
// llama3 (Llama 3.1 onwards): each frequency is rescaled by its wavelength 2 pi / f,
// against the context length the model was first trained at (L = original max seq len):
//   wavelength < L / high_freq_factor   kept            (high frequencies: local order)
//   wavelength > L / low_freq_factor    f / factor      (low frequencies: stretched)
//   otherwise                           (1 - s) f / factor + s f,
//                                       s = (L / wavelength - low_freq_factor) /
//                                           (high_freq_factor - low_freq_factor)
// This is `apply_scaling` of Meta's Llama 3.1 reference code (llama-models), which HF's
// `_compute_llama3_parameters` reproduces with tensor ops; the llama3 type has no
// attention scaling (cos and sin are not multiplied by anything).
#pragma once

#include <ATen/Tensor.h>

#include "gradguard/model/llama.h"

namespace gradguard::model {

// inv_freq [head_size / 2] float32 on the CPU for `o` (head_size(), rope_theta and the
// rope_scaling fields).
at::Tensor rope_inv_freq(const LlamaOptions& o);

}  // namespace gradguard::model
