// Precision policy: which dtype the forward and backward compute in. Parameters,
// gradients and optimizer state stay float32 ("master weights"); under bf16 autocast the
// matmuls run in bfloat16 and reductions (softmax, norms, the loss) in float32.
#pragma once

#include <array>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "gradguard/amp/loss_scaler.h"
#include "gradguard/core/option_fields.h"

namespace gradguard::amp {

enum class AmpDtype { kFp32, kBf16, kFp16 };
constexpr std::array<Choice<AmpDtype>, 3> choices(AmpDtype) {
  return {{{AmpDtype::kFp32, "fp32"}, {AmpDtype::kBf16, "bf16"}, {AmpDtype::kFp16, "fp16"}}};
}

struct AmpOptions {
  AmpDtype dtype = AmpDtype::kFp32;
  LossScalerOptions scaler;
  void validate() const;  // throws gradguard::Error naming amp.dtype / amp.scaler.<key>

  template <class Field>
  void fields(Field&& field) {
    field("dtype", dtype,
          "compute dtype of forward and backward: fp32 | bf16 (autocast; faster only where the hardware has bf16 "
          "units: GPUs, AVX-512-BF16/AMX CPUs; `gradguard doctor` measures it) | fp16 (GPU only, with loss scaling)");
    nested(field, "scaler", scaler);
  }
};

// The effective loss-scaler mode: the one asked for, or for `auto` dynamic under fp16
// and off otherwise (bf16 and fp32 have float32's exponent range and need no scaling).
ScalerMode resolve_scaler_mode(const LossScalerOptions& options, AmpDtype dtype);

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
