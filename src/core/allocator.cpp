// mallopt-based allocator tuning (glibc only; elsewhere a no-op).
#include "gradguard/core/allocator.h"

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gradguard {

bool configure_allocator() {
  static std::once_flag once;
  static bool applied = false;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    // 32 MB is glibc's largest accepted mmap threshold on 64-bit; blocks above it are
    // rare and big enough that the mmap cost is amortised.
    applied = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#endif
  });
  return applied;
}

}  // namespace gradguard
