// Fused gradient statistics: the one pass over all gradients that every guarded step
// makes. It unscales the gradients (multiplies by 1/loss_scale), computes every
// per-tensor L2 norm with one foreach kernel, the global norm from them exactly as
// torch.nn.utils.clip_grad_norm_ does, and derives the non-finite flag from the global
// norm (an inf or NaN anywhere makes it non-finite). Everything the host needs -- the
// norms, the global norm and any extra scalars of the step such as the loss -- comes
// back in ONE device->host copy (core/device.h's HostReadCounter sees it, so tests can
// hold the guarded step to its budget of one sync).
//
// Per-layer norms group the tensors by module: a name with a numeric component is
// grouped up to it ("model.layers.3.mlp.up_proj.weight" -> "layers.3",
// "blocks.0.attn.weight" -> "blocks.0"), any other by its module path without the
// parameter ("model.embed_tokens.weight" -> "embed_tokens", "lm_head.weight" ->
// "lm_head"); a leading "model." is dropped, so Hugging Face names read as before.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::grad {

// Tensor -> layer grouping of a parameter list.
struct LayerGroups {
  std::vector<std::string> names;  // [group] e.g. "embed_tokens", "layers.0", ..., "lm_head"
  std::vector<int64_t> group_of;   // [tensor] index into names
};
LayerGroups group_by_layer(const std::vector<std::string>& param_names);
std::string layer_of(const std::string& param_name);

struct GradStats {
  double global_norm = 0;                // L2 norm of all unscaled gradients (before clipping)
  bool nonfinite = false;                // some gradient holds inf or NaN
  std::vector<double> tensor_norms;      // [tensor] L2 norm (0 for a tensor without gradient)
  std::vector<double> layer_norms;       // [group of LayerGroups] L2 norm
  double norm_after_device_clip = 0;     // global norm after an on-device clip hook (= global_norm without one)
  std::vector<double> side;              // [i] the side values passed to compute(), same order
};

// An on-device clipping pass run between measuring and reading back (AGC uses it), so
// its effect is measured in the same single copy. Gets the unscaled gradients.
using DeviceClipHook = std::function<void(const std::vector<at::Tensor>& grads)>;

// Gradients sharded over ranks (ZeRO stage 2, dist/grad_shard_sync.h): each rank holds
// only its part of each tensor's summed gradient. The statistics are then combined from
// the parts: every rank's per-tensor sums of squares and the side values, in float64,
// summed over the ranks by ONE collective, then read back in the one host copy. Norms
// equal the whole gradient's up to summation order (the sums of squares are float64).
//
// AGC on shards: weights are whole on every rank, so a rank clips the weight rows that lie
// wholly in its parts by itself. A row cut by a shard boundary (at most one per boundary)
// is shared: the ranks' partial sums of its squared gradient ride in the same collective,
// the host derives its factor, and each rank scales its piece of the row afterwards (a
// device multiply by a host number, no further sync).
struct ShardedGradients {
  std::vector<at::Tensor> parts;                     // [tensor] this rank's part, 1-D (numel 0: none)
  std::vector<int64_t> offsets;                      // [tensor] its first element within the tensor
  // Every shard boundary that falls inside a tensor, as (tensor, element), in flat order;
  // the same list on every rank.
  std::vector<std::pair<size_t, int64_t>> cuts;
  std::function<void(at::Tensor&)> sum_over_ranks;  // in place, over all ranks: the statistics' collective
};

// AGC's rule (clip.h) for the sharded statistics: every row i of each tensor marked in
// `rows` keeps ||G_i|| <= lambda x max(||W_i||, eps).
struct RowClipRule {
  double lambda = 0, eps = 0;
  std::vector<char> rows;  // [tensor] clipped row-wise (matrices but lm_head)
};

class GradStatsComputer {
 public:
  // `params` and `names` are parallel lists ([tensor]).
  GradStatsComputer(std::vector<at::Tensor> params, const std::vector<std::string>& names);

  // Unscales the gradients in place by `inv_scale` (skipped when 1), measures them and
  // returns the statistics. `side` (1-D, any float dtype, may be undefined) holds the
  // step's other scalars (the loss, ...), read back in the same copy. Syncs with the
  // host exactly once.
  // With sharded gradients (use_sharded) `hook` must be empty; `row_clip` (may be null)
  // then applies AGC to the shards within the same collective and host read.
  GradStats compute(double inv_scale, const at::Tensor& side = {}, const DeviceClipHook& hook = {},
                    const RowClipRule* row_clip = nullptr);

  // From now on measure `sharded.parts` instead of the parameters' .grad; a device clip
  // hook is then refused (AGC comes as a RowClipRule instead).
  void use_sharded(ShardedGradients sharded);
  bool sharded() const { return static_cast<bool>(sharded_.sum_over_ranks); }

  const LayerGroups& groups() const { return groups_; }
  const std::vector<at::Tensor>& params() const { return params_; }

 private:
  GradStats compute_sharded(double inv_scale, const at::Tensor& side, const RowClipRule* row_clip);

  std::vector<at::Tensor> params_;
  LayerGroups groups_;
  ShardedGradients sharded_;
};

}  // namespace gradguard::grad
