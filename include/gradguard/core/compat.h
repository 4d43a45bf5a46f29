// Everything that differs between LibTorch 1.13 and 2.x lives here, behind
// TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR checks, so the rest of the code base is
// written once.
#pragma once

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#define GRADGUARD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gradguard::compat {

// ---- autocast --------------------------------------------------------------------
// Turns autocast for `device` (CPU or CUDA; ROCm builds call their GPU "cuda" too) on
// with `dtype`, or off. The device-generic API replaced the per-device one in 2.4.
inline void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::kCPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    TORCH_CHECK(device == c10::kCUDA, "autocast: unsupported device type ", device);
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

inline bool autocast_enabled(c10::DeviceType device) {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  if (device == c10::kCPU) return at::autocast::is_cpu_enabled();
  TORCH_CHECK(device == c10::kCUDA, "autocast: unsupported device type ", device);
  return at::autocast::is_enabled();
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

// ---- attention -------------------------------------------------------------------
// at::scaled_dot_product_attention is public since 2.0; its `scale` argument came in
// 2.1 and `enable_gqa` (K/V heads shared by groups of query heads, not repeated) in 2.5.
// Below 2.1 the model uses its own matmul/softmax attention (model/attention.cpp).
#define GRADGUARD_HAS_SDPA GRADGUARD_TORCH_AT_LEAST(2, 1)

// Causal attention through LibTorch's fused kernels (flash / memory-efficient / CPU
// flash, chosen by LibTorch): q [B, H, T, hd], k/v [B, KV, T, hd] with KV dividing H.
inline at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
#if GRADGUARD_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
#elif GRADGUARD_HAS_SDPA
  const int64_t groups = q.size(1) / k.size(1);
  if (groups == 1) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), {},
                                          0.0, true, scale);
#else
  (void)q, (void)k, (void)v, (void)scale;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch 2.1 or newer");
#endif
}

// The same with an explicit mask instead of causality: allowed [B, 1, T, T] bool (true =
// the query may attend the key; broadcast over heads), e.g. causal within packed
// segments. LibTorch picks a kernel that accepts a mask (memory-efficient on GPUs, the
// math kernel otherwise).
inline at::Tensor masked_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& allowed, double scale) {
#if GRADGUARD_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, /*is_causal=*/false, scale,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
#elif GRADGUARD_HAS_SDPA
  const int64_t groups = q.size(1) / k.size(1);
  if (groups == 1) return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, scale);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                          allowed, 0.0, false, scale);
#else
  (void)q, (void)k, (void)v, (void)allowed, (void)scale;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch 2.1 or newer");
#endif
}

// ---- fused optimizer and AMP kernels ---------------------------------------------
// at::_fused_adamw_ exists since 2.0 with a CUDA kernel; the CPU kernel came in 2.4.
inline bool fused_adamw_available(c10::DeviceType device) {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  return device == c10::kCUDA || device == c10::kCPU;
#elif GRADGUARD_TORCH_AT_LEAST(2, 0)
  return device == c10::kCUDA;
#else
  (void)device;
  return false;
#endif
}

// One AdamW update (decoupled weight decay, bias correction from `steps`, which hold
// the step number after this update) of every tensor in the lists, in one kernel.
inline void fused_adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                         double weight_decay, double eps) {
#if GRADGUARD_TORCH_AT_LEAST(2, 0)
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                    weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps;
  (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  TORCH_CHECK(false, "fused AdamW needs LibTorch 2.0 or newer");
#endif
}

// GradScaler's fused unscale + inf check (_amp_foreach_non_finite_check_and_unscale_):
// CUDA kernel in every supported version, CPU kernel since 2.3.
inline bool native_unscale_available(c10::DeviceType device) {
#if GRADGUARD_TORCH_AT_LEAST(2, 3)
  return device == c10::kCUDA || device == c10::kCPU;
#else
  return device == c10::kCUDA;
#endif
}

// Multiplies every gradient by `inv_scale` (float32, one element, on the gradients'
// device) and sets `found_inf` (float32, one element) to 1 when any value is inf/NaN.
inline void non_finite_check_and_unscale_(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                          const at::Tensor& inv_scale) {
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

// Multiplies every tensor by a 0-dim tensor factor (no host read of the factor);
// _foreach_mul_(TensorList, Tensor) exists since 2.1.
inline void foreach_mul_(std::vector<at::Tensor>& tensors, const at::Tensor& factor) {
#if GRADGUARD_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(tensors, factor);
#else
  for (auto& t : tensors) t.mul_(factor.scalar_type() == t.scalar_type() ? factor : factor.to(t.scalar_type()));
#endif
}

// Optimizer state is keyed by the parameter's TensorImpl: LibTorch 1.x uses its address
// printed as a string, 2.x the pointer itself. Deduced from the map's key type, so it
// follows whichever LibTorch is compiled against and matches what its load() writes.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key = OptimizerStateKey>
Key state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << static_cast<void*>(p.unsafeGetTensorImpl());
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// ---- c10d TCPStore -----------------------------------------------------------------
// Newer TCPStoreOptions carry useLibUV, and from 2.4 it defaults to true; a LibTorch
// built without libuv (Debian's 2.6) then refuses every rendezvous ("use_libuv was
// requested but PyTorch was build without libuv support"). gradguard asks for the
// classic socket backend wherever the option exists; detected by the member itself, so
// it needs no version check.
template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>> : std::true_type {};

template <typename Options>
void use_classic_tcpstore(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

}  // namespace gradguard::compat
