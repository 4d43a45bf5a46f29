// One foreach norm over the gradients, the global norm computed on the device in the
// gradients' dtype (so it is bit-equal to torch's clip_grad_norm_), then a single
// concatenated tensor of [tensor norms | global norm | (after-hook norm) | side values]
// copied to the host. Tensors without a gradient contribute a norm of 0.
#include "gradguard/grad/grad_stats.h"

#include <cmath>

#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/host_read.h"

namespace gradguard::grad {

std::string layer_of(const std::string& name) {
  // Components of the name; the group ends at the first numeric one, else before the
  // parameter's own name.
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  size_t end = parts.size() > 1 ? parts.size() - 1 : parts.size();
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].empty() && parts[i].find_first_not_of("0123456789") == std::string::npos) {
      end = i + 1;
      break;
    }
  size_t begin = parts.size() > 1 && parts[0] == "model" && end > 1 ? 1 : 0;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += (i > begin ? "." : "") + parts[i];
  return out;
}

LayerGroups group_by_layer(const std::vector<std::string>& param_names) {
  LayerGroups g;
  for (const auto& n : param_names) {
    const std::string layer = layer_of(n);
    auto it = std::find(g.names.begin(), g.names.end(), layer);
    if (it == g.names.end()) {
      g.group_of.push_back(static_cast<int64_t>(g.names.size()));
      g.names.push_back(layer);
    } else {
      g.group_of.push_back(it - g.names.begin());
    }
  }
  return g;
}

GradStatsComputer::GradStatsComputer(std::vector<at::Tensor> params, const std::vector<std::string>& names)
    : params_(std::move(params)), groups_(group_by_layer(names)) {
  TORCH_INTERNAL_ASSERT(params_.size() == names.size());
}

void GradStatsComputer::use_sharded(ShardedGradients sharded) {
  TORCH_INTERNAL_ASSERT(sharded.parts.size() == params_.size() && sharded.offsets.size() == params_.size() &&
                        sharded.sum_over_ranks);
  sharded_ = std::move(sharded);
}

namespace {
// A weight row cut by a shard boundary, and this rank's piece of it.
struct CutRow {
  size_t tensor = 0;
  int64_t row = 0;
  int64_t from = 0, length = 0;  // this rank's piece within its part (length 0: none)
  bool first_piece = false;      // this rank holds the row's first element (it reports ||W_row||^2)
};
}  // namespace

GradStats GradStatsComputer::compute_sharded(double inv_scale, const at::Tensor& side, const RowClipRule* row_clip) {
  // [sum of squares per tensor | (AGC) per tensor: sum of squares of its whole rows after
  // clipping | per cut row: g^2 piece, ||W_row||^2 | side values], float64, this rank's
  // share; summed over the ranks in one collective. Every rank takes part even when it
  // holds no gradient.
  const auto& parts_all = sharded_.parts;
  std::vector<at::Tensor> parts;
  std::vector<int64_t> index;
  for (size_t i = 0; i < params_.size(); ++i)
    if (parts_all[i].numel() > 0) parts.push_back(parts_all[i]), index.push_back(static_cast<int64_t>(i));
  const int64_t T = static_cast<int64_t>(params_.size());
  const bool agc = row_clip != nullptr;
  std::vector<CutRow> cut_rows;
  if (agc) {
    for (const auto& [t, at] : sharded_.cuts) {
      if (!row_clip->rows[t]) continue;
      const int64_t c = params_[t].numel() / params_[t].size(0);  // row length
      if (at % c == 0) continue;  // the boundary falls between rows
      const int64_t row = at / c;
      if (!cut_rows.empty() && cut_rows.back().tensor == t && cut_rows.back().row == row) continue;
      CutRow r;
      r.tensor = t, r.row = row;
      const int64_t o = sharded_.offsets[t], n = parts_all[t].numel();
      const int64_t lo = std::max(row * c, o), hi = std::min((row + 1) * c, o + n);
      if (lo < hi) r.from = lo - o, r.length = hi - lo;
      r.first_piece = n > 0 && row * c >= o && row * c < o + n;
      cut_rows.push_back(r);
    }
  }
  const int64_t J = static_cast<int64_t>(cut_rows.size());
  const int64_t n_side = side.defined() ? side.numel() : 0;
  const int64_t after_at = T, cut_at = T + (agc ? T : 0), side_at = cut_at + 2 * J;
  const auto device = parts_all.empty() ? torch::Device(torch::kCPU) : parts_all[0].device();
  auto packed = torch::zeros({side_at + n_side}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  if (!parts.empty()) {
    if (inv_scale != 1.0) compat::foreach_mul_(parts, torch::full({}, inv_scale, parts[0].options()));
    // bf16/fp16 parts: each norm accumulated and returned in float32, without a float32 copy.
    at::Tensor norms;
    if (parts[0].scalar_type() == torch::kFloat) {
      norms = torch::stack(at::_foreach_norm(parts, 2));
    } else {
      std::vector<at::Tensor> each;
      for (const auto& p : parts) each.push_back(at::linalg_vector_norm(p, 2, c10::nullopt, false, torch::kFloat));
      norms = torch::stack(each);
    }
    packed.index_copy_(0, torch::tensor(index, torch::TensorOptions().dtype(torch::kLong).device(device)),
                       norms.to(torch::kDouble).square());
  }
  if (agc) {
    // The pieces of cut rows, before any clipping.
    for (int64_t j = 0; j < J; ++j) {
      const auto& r = cut_rows[j];
      if (r.length > 0)
        packed.narrow(0, cut_at + 2 * j, 1)
            .copy_(parts_all[r.tensor].narrow(0, r.from, r.length).to(torch::kDouble).square().sum().reshape({1}));
      if (r.first_piece)
        packed.narrow(0, cut_at + 2 * j + 1, 1)
            .copy_(params_[r.tensor].detach().flatten(1)[r.row].to(torch::kDouble).square().sum().reshape({1}));
    }
    // Whole rows: clipped here exactly as the unsharded hook does (clip.cpp), then measured.
    for (int64_t t = 0; t < T; ++t) {
      if (!row_clip->rows[t] || parts_all[t].numel() == 0) continue;
      const auto& p = params_[t];
      const int64_t c = p.numel() / p.size(0), o = sharded_.offsets[t], n = parts_all[t].numel();
      const int64_t first = (o + c - 1) / c, end = (o + n) / c;  // whole rows [first, end)
      if (first >= end) continue;
      auto g = parts_all[t].narrow(0, first * c - o, (end - first) * c).view({end - first, c});
      auto w_norm = p.detach().flatten(1).narrow(0, first, end - first).norm(2, {1}).clamp_min(row_clip->eps);
      auto g_norm = g.norm(2, {1});
      auto limit = w_norm * row_clip->lambda;
      auto factor = torch::where(g_norm > limit, limit / g_norm.clamp_min(1e-6), torch::ones_like(g_norm));
      g.mul_(factor.unsqueeze(1).to(g.scalar_type()));
      packed.narrow(0, after_at + t, 1).copy_(g.to(torch::kDouble).square().sum().reshape({1}));
    }
  }
  if (n_side > 0) packed.narrow(0, side_at, n_side).copy_(side.detach().to(device).to(torch::kDouble).reshape({-1}));
  sharded_.sum_over_ranks(packed);
  auto host = to_host(packed);  // the one device->host copy
  const double* h = host.data_ptr<double>();
  GradStats s;
  s.tensor_norms.assign(params_.size(), 0.0);
  s.layer_norms.assign(groups_.names.size(), 0.0);
  double total = 0, after = 0;
  for (int64_t i = 0; i < T; ++i) {
    s.tensor_norms[i] = std::sqrt(h[i]);
    s.layer_norms[groups_.group_of[i]] += h[i];
    total += h[i];
    after += agc && row_clip->rows[i] ? h[after_at + i] : h[i];
  }
  for (auto& n : s.layer_norms) n = std::sqrt(n);
  s.global_norm = std::sqrt(total);
  if (agc) {
    // Cut rows: their factor from the summed pieces, in float32 as the device computes it;
    // each rank scales its piece.
    for (int64_t j = 0; j < J; ++j) {
      const auto& r = cut_rows[j];
      const float g_norm = static_cast<float>(std::sqrt(h[cut_at + 2 * j]));
      const float w_norm = std::max(static_cast<float>(std::sqrt(h[cut_at + 2 * j + 1])),
                                    static_cast<float>(row_clip->eps));
      const float limit = w_norm * static_cast<float>(row_clip->lambda);
      const float factor = g_norm > limit ? limit / std::max(g_norm, 1e-6f) : 1.0f;
      after += static_cast<double>(factor) * factor * h[cut_at + 2 * j];
      if (factor < 1.0f && r.length > 0) parts_all[r.tensor].narrow(0, r.from, r.length).mul_(factor);
    }
  }
  s.norm_after_device_clip = agc ? std::sqrt(after) : s.global_norm;
  for (int64_t j = 0; j < n_side; ++j) s.side.push_back(h[side_at + j]);
  s.nonfinite = !std::isfinite(s.global_norm);
  return s;
}

GradStats GradStatsComputer::compute(double inv_scale, const at::Tensor& side, const DeviceClipHook& hook,
                                     const RowClipRule* row_clip) {
  torch::NoGradGuard no_grad;
  if (sharded()) {
    TORCH_CHECK(!hook, "GradStatsComputer: sharded gradients take AGC as a RowClipRule, not a device hook");
    return compute_sharded(inv_scale, side, row_clip);
  }
  TORCH_CHECK(row_clip == nullptr, "GradStatsComputer: a RowClipRule is for sharded gradients");
  std::vector<at::Tensor> grads;  // [tensor with gradient]
  std::vector<size_t> index;      // [tensor with gradient] -> tensor
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined()) {
      grads.push_back(params_[i].grad());
      index.push_back(i);
    }
  GradStats s;
  s.tensor_norms.assign(params_.size(), 0.0);
  s.layer_norms.assign(groups_.names.size(), 0.0);
  const auto float_opts = torch::TensorOptions().dtype(torch::kFloat).device(
      grads.empty() ? torch::Device(torch::kCPU) : grads[0].device());
  std::vector<at::Tensor> parts;
  int64_t found_inf_slot = -1;  // index of the native kernel's inf flag in `parts`, if used
  if (!grads.empty()) {
    if (inv_scale != 1.0) {
      if (compat::native_unscale_available(grads[0].device().type())) {
        // GradScaler's own multi-tensor kernel: unscale and inf check in one pass; the
        // flag rides along in the single host copy below.
        auto found_inf = torch::zeros({1}, float_opts);
        compat::non_finite_check_and_unscale_(grads, found_inf, torch::full({1}, inv_scale, float_opts));
        found_inf_slot = static_cast<int64_t>(parts.size());
        parts.push_back(found_inf);
      } else {
        // Tensor factor rather than a Scalar: the faster CPU multiply (see clip.cpp).
        compat::foreach_mul_(grads, torch::full({}, inv_scale, grads[0].options()));
      }
    }
    auto norms = torch::stack(at::_foreach_norm(grads, 2));  // [tensor with gradient]
    parts.push_back(norms.to(torch::kFloat));
    parts.push_back(norms.norm(2).to(torch::kFloat).reshape({1}));
    if (hook) {
      hook(grads);
      parts.push_back(torch::stack(at::_foreach_norm(grads, 2)).norm(2).to(torch::kFloat).reshape({1}));
    }
  }
  const int64_t n_side = side.defined() ? side.numel() : 0;
  if (n_side > 0) parts.push_back(side.detach().to(float_opts.device()).to(torch::kFloat).reshape({-1}));
  if (parts.empty()) return s;
  auto host = to_host(torch::cat(parts));  // the one device->host copy
  const float* h = host.data_ptr<float>();
  size_t k = 0;
  bool found_inf = false;
  if (found_inf_slot >= 0) found_inf = h[k++] != 0;  // parts[0]
  if (!grads.empty()) {
    for (size_t j = 0; j < grads.size(); ++j) s.tensor_norms[index[j]] = h[k++];
    s.global_norm = h[k++];
    s.norm_after_device_clip = hook ? h[k++] : s.global_norm;
  }
  for (int64_t j = 0; j < n_side; ++j) s.side.push_back(h[k++]);
  s.nonfinite = found_inf || !std::isfinite(s.global_norm);
  for (size_t i = 0; i < params_.size(); ++i) {
    const double n = s.tensor_norms[i];
    s.layer_norms[groups_.group_of[i]] += n * n;
  }
  for (auto& n : s.layer_norms) n = std::sqrt(n);
  return s;
}

}  // namespace gradguard::grad
