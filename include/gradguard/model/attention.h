// Causal scaled-dot-product attention with grouped-query sharing, the one place that
// picks the attention kernel for the LibTorch version in use.
//
// Packed sequences (several samples in one row) narrow the causal pattern further with a
// boolean mask `allowed` [B, T, T] built once per forward (segment_mask below) and shared
// by every layer: query i reads key j only where allowed[b, i, j]. Without it the plain
// causal kernels run (is_causal on the fused path, a cached mask on the portable one).
#pragma once

#include <ATen/Tensor.h>

namespace gradguard::model {

// q [B, H, T, hd], k and v [B, KV, T, hd] with H a multiple of KV; query head h reads
// K/V head h / (H/KV) (HF repeat_kv order). Returns [B, H, T, hd], softmax(q k^T /
// sqrt(hd) + mask) v, the mask being causal when `allowed` is undefined, else -inf where
// allowed [B, T, T] (bool, causality already in it) is false; every query must be allowed
// at least one key (segment_mask always allows the diagonal). LibTorch's fused
// scaled_dot_product_attention from 2.1 on, else causal_attention_matmul.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed = {});

// The portable path, on every LibTorch: it folds each group of query heads into the row
// dimension ([B, KV, G*T, hd]) so K/V are never repeated in memory, and masks with a
// cached additive causal mask, or with `allowed` broadcast over heads when given.
at::Tensor causal_attention_matmul(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& allowed = {});

// The attention pattern of packed rows: segments [B, T] int64 -> allowed [B, T, T] bool,
// true where key j <= query i and both carry the same segment id. Ids need not be sorted
// or contiguous; padding is its own segment (or several). No host read.
at::Tensor segment_mask(const at::Tensor& segments);

}  // namespace gradguard::model
