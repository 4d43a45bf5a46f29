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

GradStats GradStatsComputer::compute(double inv_scale, const at::Tensor& side, const DeviceClipHook& hook) {
  torch::NoGradGuard no_grad;
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
