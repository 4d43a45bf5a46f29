// The chunked output projection + cross-entropy as one autograd function (chunked_loss.h).
#include "gradguard/train/chunked_loss.h"

#include <algorithm>

#include <torch/torch.h>

#include "gradguard/data/token_dataset.h"

namespace gradguard::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The float dtype the loss is computed in: float32, or float64 for float64 inputs.
at::ScalarType loss_dtype(const at::Tensor& hidden) {
  return hidden.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// One chunk's logits [n, V] in the loss dtype: the product in the hidden states' dtype,
// as lm_head computes it, then widened.
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t begin, int64_t n,
                        at::ScalarType dtype) {
  return at::matmul(hidden.narrow(0, begin, n), weight.t()).to(dtype);
}

class ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, int64_t chunk, bool z_loss) {
    const auto dtype = loss_dtype(hidden);
    const auto w = weight.to(hidden.scalar_type());  // as autocast casts lm_head's weight
    const int64_t N = hidden.size(0);
    auto lse = torch::empty({N}, hidden.options().dtype(dtype));
    auto ce = torch::zeros({}, hidden.options().dtype(dtype));
    auto z = torch::zeros({}, hidden.options().dtype(dtype));
    for (int64_t begin = 0; begin < N; begin += chunk) {
      const int64_t n = std::min(chunk, N - begin);
      const auto logits = chunk_logits(hidden, w, begin, n, dtype);
      const auto target = targets.narrow(0, begin, n);
      const auto trained = target != data::kIgnoreTarget;
      const auto row_lse = logits.logsumexp(-1);
      lse.narrow(0, begin, n).copy_(row_lse);
      const auto picked = logits.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
      ce += (row_lse - picked).masked_fill(~trained, 0).sum();
      if (z_loss) z += row_lse.square().masked_fill(~trained, 0).sum();
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["z_loss"] = z_loss;
    return {ce, z};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const auto& lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool z_loss = ctx->saved_data["z_loss"].toBool();
    const auto dtype = loss_dtype(hidden);
    // Undefined when an output was not used: it contributes nothing.
    const auto g_ce = grads[0].defined() ? grads[0].to(dtype) : torch::zeros({}, hidden.options().dtype(dtype));
    const auto g_z = z_loss && grads[1].defined() ? grads[1].to(dtype) : torch::zeros({}, hidden.options().dtype(dtype));
    const auto w = weight.to(hidden.scalar_type());
    const bool want_weight = weight.requires_grad();
    auto grad_hidden = torch::empty_like(hidden);
    at::Tensor grad_weight = want_weight ? torch::zeros(weight.sizes(), weight.options().dtype(dtype)) : at::Tensor();
    const int64_t N = hidden.size(0);
    for (int64_t begin = 0; begin < N; begin += chunk) {
      const int64_t n = std::min(chunk, N - begin);
      const auto logits = chunk_logits(hidden, w, begin, n, dtype);
      const auto target = targets.narrow(0, begin, n);
      const auto trained = (target != data::kIgnoreTarget).to(dtype).unsqueeze(1);  // [n, 1]
      const auto row_lse = lse.narrow(0, begin, n).unsqueeze(1);
      const auto softmax = (logits - row_lse).exp_();
      // g_ce (softmax - onehot) + g_z 2 lse softmax, on trained rows only.
      auto grad_logits = softmax.mul_(g_ce + g_z * 2 * row_lse);
      grad_logits.scatter_add_(1, target.clamp_min(0).unsqueeze(1), (-g_ce).expand({n, 1}).contiguous());
      grad_logits.mul_(trained);
      const auto g = grad_logits.to(hidden.scalar_type());
      grad_hidden.narrow(0, begin, n).copy_(at::matmul(g, w));
      if (want_weight) grad_weight += at::matmul(g.t(), hidden.narrow(0, begin, n)).to(dtype);
    }
    return {grad_hidden, want_weight ? grad_weight.to(weight.scalar_type()) : at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LinearCrossEntropy chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk_tokens, bool z_loss) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "chunked_linear_cross_entropy: hidden [N, h] and weight [V, h]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0) && targets.scalar_type() == torch::kLong,
              "chunked_linear_cross_entropy: targets must be int64 [N]");
  TORCH_CHECK(chunk_tokens >= 1, "chunked_linear_cross_entropy: chunk_tokens must be >= 1");
  const auto out = ChunkedLinearCrossEntropy::apply(hidden, weight, targets, chunk_tokens, z_loss);
  return {out[0], z_loss ? out[1] : at::Tensor()};
}

}  // namespace gradguard::train
