// How a run holds its weights and optimizer state (the config section `memory`):
// replicated or sharded optimizer state, the working weights' dtype with or without
// float32 masters, and optimizer state in host memory. docs/memory.md has the
// arithmetic of each layout; optim/sharded_optimizer.h the optimizer that implements them.
#pragma once

#include <cstdint>

#include "gradguard/amp/precision.h"

namespace gradguard::optim {

// What the memory options mean for one rank of a run: MemoryOptions::resolve. The one
// place memory.zero_stage is interpreted; the trainer, `plan` and the header read this.
struct MemoryLayout {
  bool sharded_optimizer = false;  // the ShardedOptimizer holds the state (else make_optimizer's)
  int64_t shard_rank = 0;          // this rank's place in the optimizer state's split
  int64_t shard_world = 1;         // ranks the optimizer state is split over; 1 = whole on each
  bool shards_gradients = false;   // each rank keeps only its shard of the summed gradient (ZeRO-2 on > 1 rank)
  bool masters = false;            // float32 master weights (bf16/fp16 weights with master_weights, or offload)
  bool offload = false;            // moments and masters in host memory
};

// How the weights and the optimizer state are held. The section `memory` of a config.
struct MemoryOptions {
  int64_t zero_stage = 0;                           // 0 replicated | 1 optimizer state sharded | 2 + gradients
  amp::AmpDtype weights_dtype = amp::AmpDtype::kFp32;
  bool master_weights = true;                       // float32 masters for bf16/fp16 weights
  bool offload_optimizer = false;                   // moments (and masters) in host memory
  void validate() const;  // throws gradguard::Error naming memory.<key>

  // Whether the optimizer keeps float32 master weights: bf16/fp16 weights with
  // master_weights, and always with offload (the host steps float32 copies).
  bool keeps_masters() const {
    return offload_optimizer || (weights_dtype != amp::AmpDtype::kFp32 && master_weights);
  }
  // Whether the run's optimizer is the ShardedOptimizer (otherwise make_optimizer's).
  bool sharded_optimizer() const { return zero_stage > 0 || keeps_masters(); }
  // The layout of rank `rank` of `world` ranks.
  MemoryLayout resolve(int64_t world, int64_t rank) const;

  template <class Field>
  void fields(Field&& field) {
    field("zero_stage", zero_stage,
          "0: every rank holds the whole optimizer state | 1: each rank holds 1/ranks of the AdamW moments (and "
          "master weights): ZeRO stage 1 | 2: as 1, and each rank keeps only its 1/ranks of the summed gradient, "
          "reduced to it every micro-batch (ZeRO stage 2; dist.hook none); adamw and "
          "adam_atan2 only");
    field("weights_dtype", weights_dtype,
          "dtype of the model's working weights and gradients: fp32 | bf16 | fp16 (amp.dtype must be the same); "
          "with master_weights the optimizer keeps float32 copies and steps those");
    field("master_weights", master_weights,
          "with bf16/fp16 weights: keep float32 master weights in the optimizer (false = update the low-precision "
          "weights themselves: small updates round away; for comparison only)");
    field("offload_optimizer", offload_optimizer,
          "keep the optimizer's moments and master weights in host memory and step them on the CPU (ZeRO-Offload)");
  }
};

}  // namespace gradguard::optim
