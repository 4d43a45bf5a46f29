// The Llama block's elementwise chains as single-pass CPU kernels with hand-written
// backward passes: SwiGLU, RMSNorm and rotary embeddings. Written as ATen ops these take
// 3-10 kernel launches and as many full passes over the activations each way (the
// profile of the CPU step has them at about a third of the time once the matmuls run on
// every core: docs/performance.md); fused, each is one pass forward and one backward.
//
// Every function computes exactly the formula of its composite reference (the *_reference
// functions below, which the model used before and which the tests compare against in
// float64). The fused kernels run for float32 CPU tensors; anything else (CUDA, bf16/fp16
// under autocast, a weight or table that itself requires grad) takes the reference
// path, so the result never depends on which path ran beyond float rounding. Gradients
// are first order only (no double backward), like the rest of the training step.
#pragma once

#include <ATen/Tensor.h>

namespace gradguard::model {

// silu(gate) * up, gate and up of the same shape.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);

// HF LlamaRMSNorm: weight * (x * rsqrt(mean(x^2 over the last dim) + eps)), the
// normalisation in float32 and cast back to x's dtype before the weight. x [..., d],
// weight [d].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding in HF's rotate-half convention, x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]). x [B, T, H, hd] (the projection's
// natural layout, before heads move to dim 1), cos and sin [T, hd] broadcast over B and H,
// or [B, T, hd] (a position per token: packed rows) broadcast over H.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace gradguard::model
