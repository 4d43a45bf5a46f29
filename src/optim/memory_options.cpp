#include "gradguard/optim/memory_options.h"

#include <string>

#include "gradguard/core/error.h"

namespace gradguard::optim {

void MemoryOptions::validate() const {
  if (zero_stage < 0 || zero_stage > 2)
    throw bad_input("memory.zero_stage", "must be 0 (replicated), 1 (optimizer state sharded) or 2 (optimizer "
                                         "state and gradients sharded); got " + std::to_string(zero_stage));
}

}  // namespace gradguard::optim
