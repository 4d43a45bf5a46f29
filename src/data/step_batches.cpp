// Builds one optimizer step's micro-batches from the global sample order (see the
// header for the formula). Each micro-batch is a run of consecutive sample numbers, so
// it is one TokenDataset::batch(first, count) call: a copy out of the token map into
// two fresh int64 tensors, nothing else.
#include "gradguard/data/step_batches.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

namespace gradguard::data {

StepBatches step_batches(const TokenDataset& dataset, const BatchLayout& layout, int64_t data_step,
                         int64_t rank) {
  const int64_t micro = layout.micro_batch, accum = layout.accum_steps, world = layout.world_size;
  TORCH_INTERNAL_ASSERT(micro >= 1 && accum >= 1 && world >= 1, "bad batch layout ", micro, "x", accum, "x", world);
  TORCH_INTERNAL_ASSERT(data_step >= 0, "data step must be >= 0, got ", data_step);
  TORCH_INTERNAL_ASSERT(rank >= -1 && rank < world, "rank ", rank, " outside [-1, ", world, ")");
  const int64_t first_rank = rank >= 0 ? rank : 0;
  const int64_t ranks = rank >= 0 ? 1 : world;
  StepBatches out;
  out.sample_index = torch::empty({accum * ranks, micro}, torch::kLong);
  int64_t* idx = out.sample_index.data_ptr<int64_t>();
  out.micro.reserve(static_cast<size_t>(accum * ranks));
  // Rank-major within a micro-step: g = m * ranks + (r - first_rank).
  for (int64_t m = 0; m < accum; ++m) {
    for (int64_t r = first_rank; r < first_rank + ranks; ++r) {
      const int64_t first = ((data_step * accum + m) * world + r) * micro;
      for (int64_t row = 0; row < micro; ++row) *idx++ = first + row;
      out.micro.push_back(dataset.batch(first, micro));
    }
  }
  return out;
}

}  // namespace gradguard::data
