// Precision policy: which dtype the forward and backward compute in. Parameters,
// gradients and optimizer state stay float32 ("master weights"); under bf16 autocast the
// matmuls run in bfloat16 and reductions (softmax, norms, the loss) in float32.
#pragma once

#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "gradguard/amp/loss_scaler.h"

namespace gradguard::amp {

struct AmpOptions {
  std::string dtype = "fp32";  // fp32 | bf16 | fp16 (fp16 needs a GPU: the CPU has no fp16 autocast)
  LossScalerOptions scaler;    // amp.scaler.*: dynamic loss scaling (auto: on for fp16 only)
  void validate() const;       // throws gradguard::Error naming amp.dtype / amp.scaler.<key>
};

// Throws gradguard::Error (bad input, key amp.dtype) when `device` cannot compute in the
// requested dtype; called before a run starts so nothing is created for a bad config.
void check_supported(const AmpOptions& options, const c10::Device& device);

// Enables autocast for its lifetime (nothing for fp32) and restores the previous state.
// Throws gradguard::Error (bad input) for a dtype the device cannot autocast to.
class AutocastScope {
 public:
  AutocastScope(const AmpOptions& options, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::kCPU;
  bool previous_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
};

}  // namespace gradguard::amp
