// Everything that differs between LibTorch 1.13 and 2.x lives here, behind
// TORCH_VERSION_MAJOR / TORCH_VERSION_MINOR checks, so the rest of the code base is
// written once.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#define GRADGUARD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gradguard::compat {

// Turns CPU autocast on with `dtype` (bf16), or off. The device-generic API replaced
// the CPU-specific one in 2.4.
inline void set_cpu_autocast(bool enabled, c10::ScalarType dtype) {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

inline bool cpu_autocast_enabled() {
#if GRADGUARD_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
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

}  // namespace gradguard::compat
