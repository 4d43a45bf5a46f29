// Where a step's batches come from: the data a step reads, the faults guard.inject puts
// into it, and the prefetcher that builds step N+1's batches while step N computes.
// Private to src/train; Trainer::State owns one (made in build()), the loop calls next(),
// a rollback skip(), a resume restores the offset, snapshots ask for global_batch().
//
// Step s reads the data of step s + offset(): a rollback moves the offset past the window
// that led to an anomaly, so the continuation reads fresh batches. Batches come from a
// single-slot prefetcher keyed by (step, offset, injected spike), so a rollback or a resume
// gets exactly the batches it would get without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "gradguard/config/config.h"
#include "gradguard/data/prefetcher.h"
#include "gradguard/data/token_dataset.h"

namespace gradguard::train {

// One step's batches and the fault injected into it (if any).
struct StepData {
  data::StepBatches batches;  // this rank's micro-batches
  std::string injected;       // "spike_batch" | "nonfinite_gradients" | ""
  bool spike = false;         // the batch was replaced by random tokens
  bool corrupt = false;       // this rank puts an inf into its gradients
};

// guard.inject: which steps get a fault, once each -- the first time the run reaches the
// step, not again after a rollback brings it back -- and the random batch of a spike.
class FaultInjector {
 public:
  // cfg.guard.inject, for this `rank`; the spike's batch shape and vocabulary from `cfg`.
  FaultInjector(const config::Config& cfg, int64_t rank);
  // The run (re)starts at `step`: no step before it counts as visited.
  void start_at(int64_t step) { furthest_ = step - 1; }
  // The faults of `step` (spike, injected, corrupt), marking it visited.
  StepData visit(int64_t step);
  // Whether `step` will get a spike when it is reached next (the prefetcher's guess).
  bool spike_ahead(int64_t step) const { return step > furthest_ && inject_.spike_at(step); }
  // Replaces the micro-batches of the affected ranks in `out` by uniform random tokens,
  // reproducible from (seed, step, rank). `rank` >= 0: `out` holds that rank's micro-batches;
  // -1: every rank's, in global order g = m * world + rank.
  void spike(data::StepBatches& out, int64_t step, int64_t rank, int64_t world) const;

 private:
  guard::InjectOptions inject_;
  int64_t rank_;
  uint64_t seed_;
  int64_t vocab_, micro_batch_, accum_, seq_len_;
  int64_t furthest_ = -1;  // furthest step visited so far
};

class StepSource {
 public:
  // `cfg` must outlive the source (it is the trainer's own, final after build()).
  StepSource(const config::Config& cfg, std::shared_ptr<data::TokenDataset> train, int64_t rank, int64_t world,
             const torch::Device& device);
  // This step's batches (prefetched during the previous step) and faults; starts building
  // the next step's.
  StepData next(int64_t step);
  // Every rank's micro-batches of `step` in global order (what a snapshot records).
  data::StepBatches global_batch(int64_t step, bool spike) const;
  // Trained targets of `step`'s global batch (at least 1), and of rank r's first micro-batch.
  int64_t trained_targets(int64_t step) const;
  int64_t first_micro_batch_targets(int64_t step, int64_t rank) const;

  void start_at(int64_t step) { faults_.start_at(step); }
  int64_t offset() const { return offset_; }
  void set_offset(int64_t offset) { offset_ = offset; }  // a resume: the checkpoint's
  void skip(int64_t steps) { offset_ += steps; }         // a rollback: past the bad window

 private:
  // The micro-batches of `step` reading the data of step + offset for `rank` (-1: every
  // rank's). Reads only what is fixed after construction, so the prefetcher may call it
  // on its thread.
  data::StepBatches micro_batches(int64_t step, int64_t offset, bool spike, int64_t rank) const;
  // The prefetcher's key for `step`: everything micro_batches() reads that changes.
  data::BatchPrefetcher::Key key(int64_t step, bool spike) const { return {step, offset_, spike ? 1 : 0}; }

  const config::Config& cfg_;
  std::shared_ptr<data::TokenDataset> train_;
  int64_t rank_, world_;
  FaultInjector faults_;
  int64_t offset_ = 0;
  // Declared last so it is destroyed first: its thread calls micro_batches().
  std::unique_ptr<data::BatchPrefetcher> prefetcher_;
};

}  // namespace gradguard::train
