// The micro-batches of one optimizer step, in the order docs/design.md fixes: rank r's
// micro-step m, row b of data step d reads global sample
//   k = ((d * accum + m) * world + r) * micro + b
// (with one rank exactly k = (d * accum + m) * micro + b). The data step d is the
// optimizer step plus the steps of data a rollback skipped (Trainer's data offset), so
// the batches are a pure function of (d, rank) and the dataset: a resumed, rolled-back
// or replayed step asks for d and gets the same tokens. This is the one function the
// trainer, its prefetcher and bench/loader_bench build a step's batches with.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/data/token_dataset.h"

namespace gradguard::data {

struct BatchLayout {
  int64_t micro_batch = 1;  // rows (sequences) per micro-batch per rank; >= 1
  int64_t accum_steps = 1;  // micro-batches per optimizer step per rank; >= 1
  int64_t world_size = 1;   // data-parallel ranks; >= 1
};

// One optimizer step's batches. Tensors are on the CPU unless a prefetcher moved them.
struct StepBatches {
  std::vector<Batch> micro;  // [micro-batch] each [micro_batch, T] int64
  at::Tensor sample_index;   // [micro-batches, micro_batch] int64 global sample numbers (CPU)
};

// rank in [0, world): that rank's accum_steps micro-batches, m = 0..accum-1.
// rank -1: every rank's, accum_steps * world_size micro-batches interleaved as
// g = m * world + r (consecutive samples in the order: what a snapshot records).
// Thread-safe (reads the dataset only).
StepBatches step_batches(const TokenDataset& dataset, const BatchLayout& layout, int64_t data_step,
                         int64_t rank);

}  // namespace gradguard::data
