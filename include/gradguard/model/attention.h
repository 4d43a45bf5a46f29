// Causal scaled-dot-product attention with grouped-query sharing, the one place that
// picks the attention kernel for the LibTorch version in use.
#pragma once

#include <ATen/Tensor.h>

namespace gradguard::model {

// q [B, H, T, hd], k and v [B, KV, T, hd] with H a multiple of KV; query head h reads
// K/V head h / (H/KV) (HF repeat_kv order). Returns [B, H, T, hd], softmax(q k^T /
// sqrt(hd) + causal mask) v. LibTorch's fused scaled_dot_product_attention from 2.1 on,
// else causal_attention_matmul.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The portable path, on every LibTorch: it folds each group of query heads into the row
// dimension ([B, KV, G*T, hd]) so K/V are never repeated in memory, and masks with a
// cached additive causal mask.
at::Tensor causal_attention_matmul(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace gradguard::model
