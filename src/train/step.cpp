// Token-weighted accumulation: each micro-batch's summed cross-entropy is divided by the
// token count of the whole global batch before backward, which is both exact (no
// mean-of-means bias when micro-batches differ in size) and what keeps the accumulated
// gradient equal to one big batch's.
#include "gradguard/train/step.h"

#include <torch/torch.h>

namespace gradguard::train {
namespace {
torch::Tensor summed_loss(model::LlamaForCausalLMImpl& model, const data::Batch& b, const amp::AmpOptions& amp,
                          const c10::Device& device) {
  torch::Tensor logits;
  {
    amp::AutocastScope autocast(amp, device);
    logits = model.forward(b.inputs.to(device));  // [B, T, V]
  }
  // Cross-entropy in float32 whatever the compute dtype.
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), b.targets.to(device).reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
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
    out.micro_losses.push_back(summed.detach() / static_cast<double>(b.targets.numel()));
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
  int64_t tokens = 0;
  for (int64_t first = 0; first < samples; first += micro_batch) {
    auto b = dataset.batch(first, std::min(micro_batch, samples - first));
    sum += summed_loss(model, b, amp, device).to(torch::kDouble);
    tokens += b.targets.numel();
  }
  return sum.item<double>() / static_cast<double>(tokens);
}

}  // namespace gradguard::train
