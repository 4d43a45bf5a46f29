// The output projection and the token cross-entropy in chunks of tokens, so that the
// [tokens, vocabulary] logits never exist whole (loss.chunk_tokens). For today's
// vocabularies (Qwen3's 151,936, Llama-3's 128,256) they are the largest activation of a
// step: 2,048 tokens x 151,936 x (2 + 8) bytes is 3.1 GB per sequence.
//
// Forward: for each chunk of `chunk_tokens` rows of `hidden`, logits = hidden_chunk W^T
// in the hidden states' dtype (the compute dtype under autocast, as lm_head computes it),
// widened to float32 (float64 stays float64); per row lse = logsumexp(logits) and the
// target's logit; kept: the rows' lse only. Returns the summed cross-entropy
// sum(lse - logit[target]) and, with z-loss, sum(lse^2), both over the trained rows
// (targets != data::kIgnoreTarget), as 0-dim tensors in that float dtype.
// Backward recomputes each chunk's logits: d ce / d logits = softmax - onehot(target),
// d z / d logits = 2 lse softmax, zero for ignored rows; then the chunk's hidden gradient
// and its share of W's gradient (accumulated in the float dtype, cast to W's at the end).
// Peak extra memory: one chunk's logits and their gradient instead of the whole step's.
//
// Equal to the unchunked computation (the same formulas on the whole logits) up to the
// order of float summation: tests/train/chunked_loss_test.cpp holds loss and gradients
// to 1e-6 relative in float64, and the trainer's accumulation with and without chunks to
// 1e-5 in float32 (tied embeddings, LoRA, packed rows, masked targets, z-loss).
#pragma once

#include <cstdint>

#include <ATen/Tensor.h>

namespace gradguard::train {

struct LinearCrossEntropy {
  at::Tensor ce;  // 0-dim: summed cross-entropy over the trained rows
  at::Tensor z;   // 0-dim: summed lse^2 over the trained rows; undefined without z-loss
};

// hidden [N, h], weight [V, h], targets [N] int64; chunk_tokens >= 1. Differentiable in
// hidden and weight.
LinearCrossEntropy chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk_tokens, bool z_loss);

}  // namespace gradguard::train
