#include "gradguard/optim/memory_options.h"

#include <string>

#include "gradguard/core/error.h"

namespace gradguard::optim {

void MemoryOptions::validate() const {
  if (zero_stage < 0 || zero_stage > 1)
    throw bad_input("memory.zero_stage", "must be 0 (replicated) or 1 (optimizer state sharded); got " +
                                             std::to_string(zero_stage) +
                                             " (stage 2, sharded gradients, is not available yet)");
}

}  // namespace gradguard::optim
