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

#include "gradguard/train/chunked_loss.h"

namespace gradguard::train {
namespace {
// A micro-batch's summed cross-entropy over its trained targets and, when z-loss is on,
// its summed logsumexp(logits)^2 over the same targets (undefined otherwise).
struct Summed {
  torch::Tensor ce, z;
};
Summed summed_loss(model::LlamaForCausalLMImpl& model, const data::Batch& b, const amp::AmpOptions& amp,
                   const c10::Device& device, bool z_loss, int64_t chunk_tokens) {
  const auto positions = b.positions.defined() ? b.positions.to(device) : b.positions;
  const auto segments = b.segments.defined() ? b.segments.to(device) : b.segments;
  if (chunk_tokens > 0) {
    // The logits a chunk at a time (chunked_loss.h): the same sums, never [B, T, V] whole.
    amp::AutocastScope autocast(amp, device);
    const auto hidden = model.hidden_states(b.inputs.to(device), positions, segments);
    const auto out = chunked_linear_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), model.output_weight(),
                                                  b.targets.to(device).reshape({-1}), chunk_tokens, z_loss);
    return {out.ce.to(torch::kFloat), z_loss ? out.z.to(torch::kFloat) : torch::Tensor()};
  }
  torch::Tensor logits;
  {
    amp::AutocastScope autocast(amp, device);
    logits = positions.defined() || segments.defined() ? model.forward(b.inputs.to(device), positions, segments)
                                                       : model.forward(b.inputs.to(device));  // [B, T, V]
  }
  // Cross-entropy in float32 whatever the compute dtype; ignored targets add nothing.
  const auto flat = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
  const auto targets = b.targets.to(device).reshape({-1});
  Summed out;
  out.ce = torch::nn::functional::cross_entropy(
      flat, targets,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(data::kIgnoreTarget));
  if (z_loss) out.z = flat.logsumexp(-1).square().masked_fill(targets == data::kIgnoreTarget, 0).sum();
  return out;
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
                        const std::function<void(const Accumulation&)>& before_last_backward, const LossTerms& terms,
                        const std::function<void()>& after_each_backward) {
  const double z_loss = terms.z_loss;
  TORCH_INTERNAL_ASSERT(total_tokens > 0);
  Accumulation out;
  out.loss = torch::zeros({}, torch::TensorOptions().device(device));
  if (z_loss > 0) out.z_loss = torch::zeros({}, torch::TensorOptions().device(device));
  const double n = static_cast<double>(total_tokens);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& b = micro_batches[i];
    auto summed = summed_loss(model, b, amp, device, z_loss > 0, terms.chunk_tokens);
    auto loss = summed.ce / n;
    out.loss += loss.detach();
    out.micro_losses.push_back(summed.ce.detach() / trained_count(b, device));
    if (z_loss > 0) {
      auto z = summed.z * (z_loss / n);
      out.z_loss += z.detach();
      loss = loss + z;
    }
    if (before_last_backward && i + 1 == micro_batches.size()) before_last_backward(out);
    (loss_scale == 1.0 ? loss : loss * loss_scale).backward();
    if (after_each_backward) after_each_backward();
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
                int64_t batches, const amp::AmpOptions& amp, const c10::Device& device, int64_t chunk_tokens) {
  torch::NoGradGuard no_grad;
  const int64_t samples = std::min(micro_batch * batches, dataset.num_samples());
  torch::Tensor sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  const int64_t tokens = dataset.trained_targets(0, samples);
  for (int64_t first = 0; first < samples; first += micro_batch) {
    auto b = dataset.batch(first, std::min(micro_batch, samples - first));
    sum += summed_loss(model, b, amp, device, false, chunk_tokens).ce.to(torch::kDouble);
  }
  return sum.item<double>() / static_cast<double>(std::max<int64_t>(tokens, 1));
}

}  // namespace gradguard::train
