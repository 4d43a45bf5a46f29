// The pieces of one optimizer step that tests exercise on their own: gradient
// accumulation over micro-batches with the global-batch token mean, and validation.
#pragma once

#include <functional>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/amp/precision.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/model/llama.h"

namespace gradguard::train {

// Forward and backward over every micro-batch of one optimizer step, accumulating into
// .grad. The loss is the mean over all trained target tokens of the global batch: each
// micro-batch contributes sum(token losses over its trained targets) / total_tokens, so
// micro 4 x accum 8 gives the same gradients as micro 32 x accum 1, and as 2 ranks x
// micro 4 x accum 4, also when the micro-batches hold different numbers of trained
// targets (masked chat data). `total_tokens` is the trained-target count of the whole
// global batch across ranks (TokenDataset::trained_targets over the step's samples);
// targets equal to data::kIgnoreTarget do not count. With loss_scale != 1 the loss is multiplied by it before
// backward (dynamic loss scaling), so the gradients come out scaled and must be unscaled
// by the statistics pass. Returns the global-batch mean loss (unscaled) as a 0-dim
// tensor on the model's device (no host sync).
at::Tensor accumulate_gradients(model::LlamaForCausalLMImpl& model, const std::vector<data::Batch>& micro_batches,
                                int64_t total_tokens, const amp::AmpOptions& amp, const c10::Device& device,
                                double loss_scale = 1.0);

// accumulate_gradients with what the guard reads besides the loss, all left on the
// device (no host sync): each micro-batch's mean loss over its trained targets, and -- when
// `measure_first` -- the squared L2 norm of the gradients right after the first
// micro-batch's backward (still multiplied by loss_scale and by the first micro-batch's
// share of the global tokens), which the gradient-noise-scale estimate needs.
struct Accumulation {
  at::Tensor loss;                       // 0-dim, global-batch mean token loss (unscaled)
  std::vector<at::Tensor> micro_losses;  // [micro-batch] 0-dim mean token loss of each
  at::Tensor first_sq_norm;              // 0-dim float; undefined unless measure_first
  at::Tensor z_loss;                     // 0-dim: c x sum of logsumexp^2 / total_tokens; undefined when c = 0
};
// What the objective adds to the token cross-entropy, and how it is computed: PaLM's
// z-loss coefficient (below), and loss.chunk_tokens (> 0: the output projection and the
// cross-entropy a chunk of tokens at a time, train/chunked_loss.h; 0: whole logits).
struct LossTerms {
  LossTerms(double z = 0, int64_t chunk = 0) : z_loss(z), chunk_tokens(chunk) {}  // NOLINT: a z-loss converts
  double z_loss = 0;
  int64_t chunk_tokens = 0;
};

// `before_last_backward`, when set, runs after the last micro-batch's forward and before
// its backward with the accumulation so far (loss and micro_losses complete): data
// parallelism hands the side values to the gradient all-reduce there.
// `terms.z_loss` > 0 adds PaLM's z-loss to what backward differentiates: z_loss x
// logsumexp(logits)^2 summed over each micro-batch's trained targets and divided by
// total_tokens like the cross-entropy (so accumulation and ranks split it exactly); it is
// reported in Accumulation::z_loss and left out of `loss` and `micro_losses`, which stay
// the cross-entropy the guard watches.
// `after_each_backward`, when set, runs after every micro-batch's backward (ZeRO-2 reduces
// each micro-batch's gradients to their owners there).
Accumulation accumulate(model::LlamaForCausalLMImpl& model, const std::vector<data::Batch>& micro_batches,
                        int64_t total_tokens, const amp::AmpOptions& amp, const c10::Device& device,
                        double loss_scale, bool measure_first,
                        const std::function<void(const Accumulation&)>& before_last_backward = {},
                        const LossTerms& terms = {}, const std::function<void()>& after_each_backward = {});

// Mean loss over the trained targets of up to `batches` micro-batches of `micro_batch` samples taken
// from the start of `dataset` (never wrapping past its end), without gradients. Syncs once.
double evaluate(model::LlamaForCausalLMImpl& model, const data::TokenDataset& dataset, int64_t micro_batch,
                int64_t batches, const amp::AmpOptions& amp, const c10::Device& device, int64_t chunk_tokens = 0);

}  // namespace gradguard::train
