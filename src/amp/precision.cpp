// Autocast on/off through the compat layer; the autocast weight cache is cleared when
// the outermost scope ends, as torch.autocast's __exit__ does.
#include "gradguard/amp/precision.h"

#include <ATen/autocast_mode.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"

namespace gradguard::amp {

void AmpOptions::validate() const { scaler.validate(); }

ScalerMode resolve_scaler_mode(const LossScalerOptions& options, AmpDtype dtype) {
  if (options.mode != ScalerMode::kAuto) return options.mode;
  return dtype == AmpDtype::kFp16 ? ScalerMode::kDynamic : ScalerMode::kOff;
}

void check_supported(const AmpOptions& options, const c10::Device& device) {
  options.validate();
  if (options.dtype == AmpDtype::kFp32) return;
  // CUDA (and ROCm, which LibTorch also calls "cuda") autocasts to fp16 and bf16.
  if (device.is_cuda()) return;
  if (!device.is_cpu())
    throw bad_input("amp.dtype", "autocast on " + device.str() + " is not available in this build");
  if (options.dtype == AmpDtype::kFp16)
    throw bad_input("amp.dtype", "fp16 autocast needs a GPU; on the CPU use bf16 or fp32");
}

AutocastScope::AutocastScope(const AmpOptions& options, const c10::Device& device) {
  check_supported(options, device);
  if (options.dtype == AmpDtype::kFp32) return;
  device_ = device.type();
  previous_ = compat::autocast_enabled(device_);
  previous_dtype_ = compat::autocast_dtype(device_);
  compat::set_autocast(device_, true, options.dtype == AmpDtype::kFp16 ? at::kHalf : at::kBFloat16);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast(device_, previous_, previous_dtype_);
}

}  // namespace gradguard::amp
