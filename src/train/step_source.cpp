// The step's batches and faults (step_source.h). The spike's random batch is drawn from a
// generator of its own, never torch's, so the prefetcher thread may build it.
#include "step_source.h"

#include <algorithm>
#include <random>

namespace gradguard::train {

FaultInjector::FaultInjector(const config::Config& cfg, int64_t rank)
    : inject_(cfg.guard.inject),
      rank_(rank),
      seed_(static_cast<uint64_t>(cfg.run.seed)),
      vocab_(cfg.model.vocab_size),
      micro_batch_(cfg.batch.micro_batch),
      accum_(cfg.batch.accum_steps),
      seq_len_(cfg.data.seq_len) {}

StepData FaultInjector::visit(int64_t step) {
  StepData d;
  const bool first_visit = step > furthest_;  // faults are injected once, not again after a rollback
  furthest_ = std::max(furthest_, step);
  d.spike = first_visit && inject_.spike_at(step);
  const bool nonfinite = first_visit && inject_.nonfinite_at(step);
  d.corrupt = nonfinite && (inject_.rank == -1 || inject_.rank == rank_);
  d.injected = d.spike ? "spike_batch" : nonfinite ? "nonfinite_gradients" : "";
  return d;
}

void FaultInjector::spike(data::StepBatches& out, int64_t step, int64_t rank, int64_t world) const {
  // A corrupted batch: uniform random tokens, reproducible from (seed, step, rank); each
  // affected rank draws its micro-batches m = 0, 1, ... in order from its own generator.
  const int64_t ranks = rank >= 0 ? 1 : world;
  for (int64_t i = 0; i < ranks; ++i) {
    const int64_t r = rank >= 0 ? rank : i;
    if (inject_.rank != -1 && inject_.rank != r) continue;
    std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(step) +
                        static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ULL);
    std::uniform_int_distribution<int64_t> token(0, vocab_ - 1);
    for (int64_t m = 0; m < accum_; ++m) {
      auto& mb = out.micro[static_cast<size_t>(m * ranks + i)];
      const int64_t T = seq_len_;
      auto window = torch::empty({micro_batch_, T + 1}, torch::kLong);
      auto* w = window.data_ptr<int64_t>();
      for (int64_t j = 0; j < window.numel(); ++j) w[j] = token(rng);
      mb.inputs = window.narrow(1, 0, T).contiguous();
      mb.targets = window.narrow(1, 1, T).contiguous();
    }
  }
}

StepSource::StepSource(const config::Config& cfg, std::shared_ptr<data::TokenDataset> train, int64_t rank,
                       int64_t world, const torch::Device& device)
    : cfg_(cfg),
      train_(std::move(train)),
      rank_(rank),
      world_(world),
      faults_(cfg, rank) {
  prefetcher_ = std::make_unique<data::BatchPrefetcher>(
      [this](const data::BatchPrefetcher::Key& k) { return micro_batches(k[0], k[1], k[2] != 0, rank_); }, device);
}

data::StepBatches StepSource::micro_batches(int64_t step, int64_t offset, bool spike, int64_t rank) const {
  const auto& b = cfg_.batch;
  // Sample k = (((step + offset) * accum + m) * world + rank) * micro + row.
  auto out = data::step_batches(*train_, {b.micro_batch, b.accum_steps, world_}, step + offset, rank);
  if (spike) faults_.spike(out, step, rank, world_);
  return out;
}

StepData StepSource::next(int64_t step) {
  StepData d = faults_.visit(step);
  // Built in the background during the previous step unless a rollback, a resume or the
  // first step asks for a key nobody prefetched.
  d.batches = prefetcher_->get(key(step, d.spike));
  // The next step's, built while this one computes. The guess is exact unless this step
  // rolls back (a new data offset: get() then misses and rebuilds).
  if (step + 1 < cfg_.schedule.total_steps) prefetcher_->prefetch(key(step + 1, faults_.spike_ahead(step + 1)));
  return d;
}

data::StepBatches StepSource::global_batch(int64_t step, bool spike) const {
  return micro_batches(step, offset_, spike, -1);
}

int64_t StepSource::trained_targets(int64_t step) const {
  // The step's samples over all ranks are (step + offset) * G .. + G - 1 (step_batches.h):
  // every rank counts the same trained targets from the data, with no collective.
  const int64_t G = cfg_.batch.global_batch;
  return std::max<int64_t>(1, train_->trained_targets((step + offset_) * G, G));
}

int64_t StepSource::first_micro_batch_targets(int64_t step, int64_t rank) const {
  const auto& b = cfg_.batch;
  return train_->trained_targets(((step + offset_) * b.accum_steps * world_ + rank) * b.micro_batch, b.micro_batch);
}

}  // namespace gradguard::train
