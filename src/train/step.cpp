// Token-weighted accumulation: each micro-batch's summed cross-entropy over its trained
// targets is divided by the trained-target count of the whole global batch (all
// micro-batches of all ranks, known on the host from the data before any forward) before
// backward. That is exact -- no mean-of-means bias when micro-batches hold different
// numbers of trained tokens, which masked chat data always does -- and keeps the
// accumulated gradient equal to one big batch's. A micro-batch with no trained target
// adds exactly 0 (a sum over nothing), never a NaN.
#include "gradguard/train/step.h"

#include <algorithm>

#include <torch/torch.h>

namespace gradguard::train {
namespace {
torch::Tensor summed_loss(model::LlamaForCausalLMImpl& model, const data::Batch& b, const amp::AmpOptions& amp,
                          const c10::Device& device) {
  torch::Tensor logits;
  {
    amp::AutocastScope autocast(amp, device);
    logits = b.positions.defined() || b.segments.defined()
                 ? model.forward(b.inputs.to(device), b.positions.defined() ? b.positions.to(device) : b.positions,
                                 b.segments.defined() ? b.segments.to(device) : b.segments)
                 : model.forward(b.inputs.to(device));  // [B, T, V]
  }
  // Cross-entropy in float32 whatever the compute dtype; ignored targets add nothing.
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), b.targets.to(device).reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(data::kIgnoreTarget));
}

// Trained targets of a micro-batch as a 0-dim float tensor on `device`, at least 1 (the
// mean of a micro-batch with none is then 0, not 0/0). No host read.
torch::Tensor trained_count(const data::Batch& b, const c10::Device& device) {
  return (b.targets.to(device) != data::kIgnoreTarget).sum().to(torch::kFloat).clamp_min(1.0);
}
}  // namespace

Accumulation accumulate(model::LlamaForCausalLMImpl& model, const std::vector<data::Batch>& micro_batches,
                        int64_t total_tokens, const amp::AmpOptions& amp, const c10::Device& device,
                        double loss_scale, bool measure_first,
                        const std::function<void(const Accumulation&)>& before_last_backward) {
  TORCH_INTERNAL_ASSERT(total_tokens > 0);
  Accumulation out;
  out.loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& b = micro_batches[i];
    auto summed = summed_loss(model, b, amp, device);
    auto loss = summed / static_cast<double>(total_tokens);
    out.loss += loss.detach();
    out.micro_losses.push_back(summed.detach() / trained_count(b, device));
    if (before_last_backward && i + 1 == micro_batches.size()) before_last_backward(out);
    (loss_scale == 1.0 ? loss : loss * loss_scale).backward();
    if (i == 0 && measure_first) {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> grads;
      for (const auto& p : model.parameters())
        if (p.grad().defined()) grads.push_back(p.grad());
      out.first_sq_norm = torch::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat).pow(2).sum();
    }
  }
  return out;
}

at::Tensor accumulate_gradients(model::LlamaForCausalLMImpl& model, const std::vector<data::Batch>& micro_batches,
                                int64_t total_tokens, const amp::AmpOptions& amp, const c10::Device& device,
                                double loss_scale) {
  return accumulate(model, micro_batches, total_tokens, amp, device, loss_scale, false).loss;
}

double evaluate(model::LlamaForCausalLMImpl& model, const data::TokenDataset& dataset, int64_t micro_batch,
                int64_t batches, const amp::AmpOptions& amp, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  const int64_t samples = std::min(micro_batch * batches, dataset.num_samples());
  torch::Tensor sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  const int64_t tokens = dataset.trained_targets(0, samples);
  for (int64_t first = 0; first < samples; first += micro_batch) {
    auto b = dataset.batch(first, std::min(micro_batch, samples - first));
    sum += summed_loss(model, b, amp, device).to(torch::kDouble);
  }
  return sum.item<double>() / static_cast<double>(std::max<int64_t>(tokens, 1));
}

}  // namespace gradguard::train
