#include "gradguard/optim/memory_options.h"

#include <string>

#include "gradguard/core/error.h"

namespace gradguard::optim {

void MemoryOptions::validate() const {
  if (zero_stage < 0 || zero_stage > 2)
    throw bad_input("memory.zero_stage", "must be 0 (replicated), 1 (optimizer state sharded) or 2 (optimizer "
                                         "state and gradients sharded); got " + std::to_string(zero_stage));
}

MemoryLayout MemoryOptions::resolve(int64_t world, int64_t rank) const {
  MemoryLayout l;
  l.sharded_optimizer = sharded_optimizer();
  l.shard_world = zero_stage > 0 ? world : 1;
  l.shard_rank = zero_stage > 0 ? rank : 0;
  l.shards_gradients = zero_stage == 2 && world > 1;
  l.masters = keeps_masters();
  l.offload = offload_optimizer;
  return l;
}

}  // namespace gradguard::optim
