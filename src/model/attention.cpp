// Causal GQA attention. From LibTorch 2.1 on, at::scaled_dot_product_attention (through
// compat.h) picks a fused kernel: flash or memory-efficient attention on GPUs, the CPU
// flash kernel on the CPU. Before 2.1 there is no public fused SDPA, so the fallback
// computes scores with one batched matmul per layer, masks with a cached additive -inf mask,
// softmaxes in place of a separate scaling pass (the 1/sqrt(hd) is folded into q), and
// multiplies by V. Query heads of one group are stacked along the row axis, which turns
// GQA into plain broadcasting-free matmuls against the un-repeated K/V.
//
// Packed rows bring their own mask (`allowed`, from segment_mask): the fused path hands it
// to SDPA as a boolean attn_mask (no is_causal: causality is inside it), the portable
// path fills -inf where it is false, viewing the scores as [B, KV, G, T, T] so one
// [B, 1, 1, T, T] mask serves every head without a copy. -inf is representable in every
// score dtype (fp32, and bf16/fp16 under autocast), and softmax of a row with at least
// one finite entry (the diagonal is always allowed) is exact zero on the masked keys.
#include "gradguard/model/attention.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/compat.h"

namespace gradguard::model {
namespace {

// Additive causal mask [G*T, T]: row r is query position r % T.
torch::Tensor causal_mask(int64_t groups, int64_t T, const torch::TensorOptions& opts) {
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(opts.device()));
  auto future = pos.unsqueeze(0) > pos.unsqueeze(1);  // [T, T]: key after query
  auto mask = torch::zeros({T, T}, opts).masked_fill(future, -std::numeric_limits<float>::infinity());
  return groups == 1 ? mask : mask.repeat({groups, 1});
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed) {
#if GRADGUARD_HAS_SDPA
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  if (allowed.defined()) return compat::masked_sdpa(q, k, v, allowed.unsqueeze(1), scale);
  return compat::causal_sdpa(q, k, v, scale);
#else
  return causal_attention_matmul(q, k, v, allowed);
#endif
}

at::Tensor segment_mask(const at::Tensor& segments) {
  TORCH_INTERNAL_ASSERT(segments.dim() == 2, "segment_mask: segments must be [B, T]");
  const int64_t T = segments.size(1);
  auto causal = torch::ones({T, T}, segments.options().dtype(torch::kBool)).tril();  // [T, T]
  return segments.unsqueeze(2).eq(segments.unsqueeze(1)).logical_and_(causal);      // [B, T, T]
}

at::Tensor causal_attention_matmul(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& allowed) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  const int64_t KV = k.size(1), G = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // [B, H, T, hd] -> [B, KV, G*T, hd]: heads h = kv*G + g are contiguous per kv head.
  auto qg = (q * scale).reshape({B, KV, G * T, hd});
  auto scores = torch::matmul(qg, k.transpose(-2, -1));  // [B, KV, G*T, T]
  if (allowed.defined()) {
    auto blocked = allowed.logical_not().view({B, 1, 1, T, T});
    scores = scores.view({B, KV, G, T, T})
                 .masked_fill(blocked, -std::numeric_limits<float>::infinity())
                 .view({B, KV, G * T, T});
    auto out = torch::matmul(torch::softmax(scores, -1), v);  // [B, KV, G*T, hd]
    return out.reshape({B, H, T, hd});
  }
  thread_local torch::Tensor mask;
  if (!mask.defined() || mask.size(0) != G * T || mask.size(1) != T ||
      mask.device() != scores.device() || mask.scalar_type() != scores.scalar_type())
    mask = causal_mask(G, T, scores.options());
  scores = torch::softmax(scores + mask, -1);
  auto out = torch::matmul(scores, v);  // [B, KV, G*T, hd]
  return out.reshape({B, H, T, hd});
}

}  // namespace gradguard::model
