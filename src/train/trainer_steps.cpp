// The pieces of one training step that the loop (trainer.cpp) calls in order: the step's
// batches with any injected fault, the accumulation with data parallelism's all-reduce
// (which also sums the side values the guard reads), the evidence a snapshot needs, and
// the step's log lines. The batches come from a single-slot prefetcher keyed by (step,
// data offset, injected fault), so a rollback or a resume gets exactly the batches it
// would get without it.
#include <limits>
#include <random>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/stop_signals.h"
#include "trainer_internal.h"

namespace gradguard::train {

data::StepBatches Trainer::State::micro_batches(int64_t step, int64_t offset, bool inject_spike, int64_t rank) const {
  const auto& b = cfg.batch;
  const int64_t T = cfg.data.seq_len;
  const int64_t world = env.world_size;
  // Sample k = (((step + offset) * accum + m) * world + rank) * micro + row.
  auto out = data::step_batches(*train, {b.micro_batch, b.accum_steps, world}, step + offset, rank);
  if (!inject_spike) return out;
  const int64_t spike_rank = cfg.guard.inject.rank;
  // A corrupted batch: uniform random tokens, reproducible from (seed, step, rank); each
  // affected rank draws its micro-batches m = 0, 1, ... in order from its own generator.
  const int64_t ranks = rank >= 0 ? 1 : world;
  for (int64_t i = 0; i < ranks; ++i) {
    const int64_t r = rank >= 0 ? rank : i;
    if (spike_rank != -1 && spike_rank != r) continue;
    std::mt19937_64 rng(cfg.run.seed * 1000003ULL + static_cast<uint64_t>(step) +
                        static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ULL);
    std::uniform_int_distribution<int64_t> token(0, cfg.model.vocab_size - 1);
    for (int64_t m = 0; m < b.accum_steps; ++m) {
      auto& mb = out.micro[static_cast<size_t>(m * ranks + i)];
      auto window = torch::empty({b.micro_batch, T + 1}, torch::kLong);
      auto* w = window.data_ptr<int64_t>();
      for (int64_t j = 0; j < window.numel(); ++j) w[j] = token(rng);
      mb.inputs = window.narrow(1, 0, T).contiguous();
      mb.targets = window.narrow(1, 1, T).contiguous();
    }
  }
  return out;
}

StepData Trainer::State::next_step_data(int64_t step) {
  const auto& inject = cfg.guard.inject;
  StepData d;
  const bool first_visit = step > furthest_step;  // faults are injected once, not again after a rollback
  furthest_step = std::max(furthest_step, step);
  d.spike = first_visit && inject.spike_at(step);
  const bool nonfinite = first_visit && inject.nonfinite_at(step);
  d.corrupt = nonfinite && (inject.rank == -1 || inject.rank == env.rank);
  d.injected = d.spike ? "spike_batch" : nonfinite ? "nonfinite_gradients" : "";
  // Built in the background during the previous step unless a rollback, a resume or the
  // first step asks for a key nobody prefetched.
  d.batches = prefetcher->get(batch_key(step, data_offset, d.spike));
  // The next step's, built while this one computes. The guess is exact unless this step
  // rolls back (a new data offset: get() then misses and rebuilds).
  if (step + 1 < cfg.schedule.total_steps) {
    const bool next_spike = step + 1 > furthest_step && inject.spike_at(step + 1);
    prefetcher->prefetch(batch_key(step + 1, data_offset, next_spike));
  }
  return d;
}

guard::StepInputs Trainer::State::accumulate_step(int64_t step, const StepData& data, double lr) {
  const auto& c = cfg;
  const int64_t world = env.world_size, accum = c.batch.accum_steps;
  const int64_t n_micro = world * accum;  // micro-batches of the global batch
  const bool measure_noise =
      c.guard.noise_scale.every > 0 && accum > 1 && step % c.guard.noise_scale.every == 0;
  auto corrupt = [&] {
    torch::NoGradGuard no_grad;
    // ZeRO-2: into this rank's shard of the summed gradient (the guard combines the shards).
    auto g = shard_sync ? shard_sync->shard() : params[0].grad().view(-1);
    if (g.numel() > 0) g[0].fill_(std::numeric_limits<float>::infinity());
  };
  if (sync)
    sync->begin_step(step);  // .grad are views into the all-reduce buckets, zeroed
  else if (shard_sync)
    shard_sync->begin_step(step, measure_noise);  // the shard zeroed, every .grad dropped
  else
    for (auto& p : params) p.mutable_grad() = torch::Tensor();  // set_to_none: fresh buffers

  // This rank's side vector: zeros in the other ranks' slots, so the sum over the ranks
  // gathers them.
  auto local_side = [&](const Accumulation& partial, const at::Tensor& first_sq_norm) {
    torch::NoGradGuard no_grad;
    auto side = torch::zeros({side_slots()}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    side.narrow(0, 0, 1).copy_(partial.loss.reshape({1}));
    for (int64_t m = 0; m < static_cast<int64_t>(partial.micro_losses.size()); ++m)
      side.narrow(0, 1 + m * world + env.rank, 1).copy_(partial.micro_losses[m].reshape({1}));
    if (first_sq_norm.defined()) side.narrow(0, 1 + n_micro + env.rank, 1).copy_(first_sq_norm.reshape({1}));
    if (StopSignals::requested() != 0) side.narrow(0, 1 + n_micro + world, 1).fill_(1.0f);
    if (partial.z_loss.defined()) side.narrow(0, 2 + n_micro + world, 1).copy_(partial.z_loss.reshape({1}));
    return side;
  };
  std::function<void(const Accumulation&)> hand_off;
  if (sync)
    hand_off = [&](const Accumulation& partial) {
      if (data.corrupt) corrupt();  // before the last backward: the inf travels with the all-reduce
      sync->arm(local_side(partial, partial.first_sq_norm));  // summed with the gradients' last bucket
    };
  std::function<void()> after_backward;
  if (shard_sync) after_backward = [this] { shard_sync->end_micro_batch(); };
  // The step's samples over all ranks are (step + offset) * G .. + G - 1 (step_batches.h):
  // every rank counts the same trained targets from the data, with no collective.
  const int64_t G = c.batch.global_batch;
  const int64_t trained = std::max<int64_t>(1, train->trained_targets((step + data_offset) * G, G));
  amp::AmpOptions amp = c.amp;  // wider while the recovery ladder's precision fallback lasts
  amp.dtype = guarded->compute_dtype(step, c.amp.dtype);
  // With ZeRO-2 .grad is empty after each backward: the shard sync measures micro-batch 0.
  auto acc = accumulate(*model, data.batches.micro, trained, amp, device, guarded->loss_scale(),
                        measure_noise && !shard_sync, hand_off, c.loss.z_loss, after_backward);

  guard::StepInputs in;
  in.lr = lr;
  in.injected = data.injected;
  if (distributed()) {
    // With sync: summed over the ranks, identical on every rank from here on, so are the
    // decisions. With ZeRO-2: this rank's values, summed by the guard's statistics
    // all-reduce before anything is decided (every slot is a sum over the ranks).
    if (shard_sync && data.corrupt) corrupt();
    const auto side = sync ? sync->finish() : local_side(acc, shard_sync->first_sq_norm());
    in.loss = side[0];
    in.micro_losses = side.narrow(0, 1, n_micro);
    if (measure_noise) in.noise_sq_norm = side.narrow(0, 1 + n_micro, world).mean();  // mean over the ranks
    in.stop_request = side[1 + n_micro + world];
    if (c.loss.z_loss > 0) in.z_loss = side[2 + n_micro + world];
  } else {
    if (data.corrupt) corrupt();
    in.loss = acc.loss;
    in.micro_losses = torch::stack(acc.micro_losses);
    if (measure_noise) in.noise_sq_norm = acc.first_sq_norm;
    in.z_loss = acc.z_loss;
  }
  // The first micro-batch's share of the step's trained targets (1 / micro-batches for a
  // stream file; for samples the ranks' first micro-batches differ: their mean share).
  in.noise_share = 1.0 / static_cast<double>(n_micro);
  if (measure_noise && train->has_samples()) {
    int64_t first = 0;
    for (int64_t r = 0; r < world; ++r)
      first += train->trained_targets(((step + data_offset) * accum * world + r) * c.batch.micro_batch, c.batch.micro_batch);
    in.noise_share = static_cast<double>(first) / static_cast<double>(world) / static_cast<double>(trained);
  }
  in.noise_micro_batch = static_cast<double>(c.batch.micro_batch);
  in.noise_global_batch = static_cast<double>(c.batch.global_batch);
  return in;
}

bool Trainer::State::stop_after(const guard::StepOutcome& outcome) const {
  // One process reads its own flag; ranks read the sum of theirs, so they agree.
  return distributed() ? outcome.stop_requested : StopSignals::requested() != 0;
}

forensics::SnapshotEvidence Trainer::State::snapshot_evidence(const guard::StepOutcome& out) const {
  const auto& c = cfg;
  forensics::SnapshotEvidence ev;
  // A snapshot holds the whole global batch: every rank's micro-batches.
  data::StepBatches all;
  if (comm)
    all = micro_batches(out.step, data_offset, current != nullptr && current->spike, -1);
  else if (current != nullptr)
    all = current->batches;
  std::vector<torch::Tensor> inputs, targets, positions, segments;
  for (const auto& b : all.micro) {
    inputs.push_back(b.inputs.cpu());
    targets.push_back(b.targets.cpu());
    if (b.positions.defined()) positions.push_back(b.positions.cpu());
    if (b.segments.defined()) segments.push_back(b.segments.cpu());
  }
  if (!inputs.empty()) {
    ev.inputs = torch::stack(inputs);
    ev.targets = torch::stack(targets);
    ev.sample_index = all.sample_index;
    if (positions.size() == inputs.size()) ev.positions = torch::stack(positions);
    if (segments.size() == inputs.size()) ev.segments = torch::stack(segments);
  }
  if (metrics) ev.metrics_lines = metrics->recent();
  if (sampler) ev.telemetry = sampler->window();
  ev.config_yaml = config::to_yaml(c);
  ev.state = {{"device", c.run.device},
              {"micro_batch", c.batch.micro_batch},
              {"accum_steps", c.batch.accum_steps},
              {"seq_len", c.data.seq_len},
              {"tokens_per_step", std::max<int64_t>(1, train->trained_targets((out.step + data_offset) * c.batch.global_batch,
                                                                               c.batch.global_batch))},
              {"data_offset", data_offset}};
  return ev;
}

int64_t Trainer::State::log_step(const guard::StepOutcome& out, const StepMetrics& m) {
  const auto& c = cfg;
  const int64_t anomalies = metrics->write_events(out, c.batch.global_batch);
  if (out.noise_warning) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "warning: global batch %lld is %.0fx the gradient noise scale B_simple ~ %.1f sequences: "
                  "larger batches than this buy little; consider a smaller batch or a higher learning rate",
                  (long long)c.batch.global_batch, c.batch.global_batch / out.noise_scale, out.noise_scale);
    progress->line(msg);
  }
  if (out.skip_rule.skip) {
    char msg[256];
    std::snprintf(msg, sizeof msg, "step %lld: skipped by guard.skip_rule (loss %.4g, limit %.4g; grad norm %.4g, limit %.4g)",
                  (long long)out.step, out.loss, out.skip_rule.loss_limit, out.clip.grad_norm,
                  out.skip_rule.grad_norm_limit);
    progress->line(msg);
  }
  if (out.recovery) {
    const auto* primary = out.verdict.primary();
    progress->line("step " + std::to_string(out.step) + ": anomaly " + name_of(primary->kind) + " (" +
                   primary->message + "); action: " + name_of(out.recovery->action) +
                   (out.snapshot.dir.empty() ? "" : "; snapshot " + out.snapshot.dir));
  }
  metrics->write_step(m);
  drain_telemetry(out.step);
  anomalies_seen += anomalies;
  progress->step(m, anomalies_seen);
  return anomalies;
}

double Trainer::State::validate(int64_t step) {
  if (!val || !main_rank()) return std::numeric_limits<double>::quiet_NaN();
  const double v = evaluate(*model, *val, cfg.batch.micro_batch, cfg.eval.batches, cfg.amp, device);
  metrics->write_validation(step, v);
  char msg[128];
  std::snprintf(msg, sizeof msg, "step %lld/%lld | val_loss %.4f", (long long)step,
                (long long)cfg.schedule.total_steps, v);
  progress->line(msg);
  return v;
}

void Trainer::State::drain_telemetry(int64_t step) {
  if (!sampler) return;
  // Every rank's samples reach rank 0's metrics through the store, tagged with the rank.
  if (!main_rank()) {
    for (const auto& sample : sampler->drain()) comm->publish("telemetry", telemetry::to_json(sample).dump());
    return;
  }
  for (const auto& sample : sampler->drain()) metrics->write_telemetry(step, sample, comm ? 0 : -1);
  if (!comm) return;
  for (const auto& [rank, payload] : comm->collect("telemetry"))
    metrics->write_telemetry(step, nlohmann::ordered_json::parse(payload), rank);
}

std::vector<std::string> Trainer::State::header(int64_t parameters) const {
  const auto& c = cfg;
  char text[512];
  std::snprintf(text, sizeof text,
                "gradguard %s | model %lld params (%lld layers x %lld wide) | %lld seq x %lld tokens = %lld tokens/step "
                "(micro %lld x accum %lld) | threads: %lld ATen, %lld %s | run %s",
                GRADGUARD_VERSION, (long long)parameters, (long long)c.model.num_layers, (long long)c.model.hidden_size,
                (long long)c.batch.global_batch, (long long)c.data.seq_len,
                (long long)(c.batch.global_batch * c.data.seq_len), (long long)c.batch.micro_batch,
                (long long)c.batch.accum_steps, (long long)threads.intra_op, (long long)threads.blas_threads,
                threads.blas.c_str(), run.root().c_str());
  std::vector<std::string> out = {text};
  if (!length_note.empty()) out.push_back(length_note);
  for (const auto& w : c.warnings) out.push_back("warning: " + w);
  for (const auto& n : resume_notes) out.push_back(n);
  if (sampler && !sampler->note().empty()) out.push_back("telemetry: " + sampler->note());
  for (const auto* d : {train.get(), val.get()}) {
    if (d == nullptr || !d->has_samples()) continue;
    const auto& st = d->sample_stats();
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "data %s: %lld samples -> %lld rows of %lld tokens (%s), %lld trained targets; %lld truncated to "
                  "seq_len + 1, %lld dropped as longer (data.overlong), %lld dropped with no trained target",
                  d->file().path().c_str(), (long long)st.samples, (long long)st.rows, (long long)c.data.seq_len,
                  c.data.packing ? "packed" : "one per row", (long long)st.trained_targets, (long long)st.truncated,
                  (long long)st.dropped_long, (long long)st.dropped_untrainable);
    out.push_back(msg);
  }
  if (c.lora.enabled()) {
    std::string targets;
    for (auto t : c.lora.targets) targets += (targets.empty() ? "" : ",") + std::string(name_of(t));
    char msg[256];
    std::snprintf(msg, sizeof msg, "lora: rank %lld, alpha %s on %s: %lld of %lld parameters train",
                  (long long)c.lora.rank, format_number(c.lora.alpha).c_str(), targets.c_str(),
                  (long long)model::count_trainable_parameters(*model.ptr()), (long long)parameters);
    out.push_back(msg);
  }
  if (sharded) {
    // What this rank holds of the optimizer state, next to what a replicated AdamW holds.
    const auto& l = sharded->layout();
    const int64_t elem = sharded->exp_avg().element_size();
    const int64_t replicated = l.total * (2 * elem + (sharded->has_masters() ? 4 : 0));
    auto size = [](int64_t bytes) {
      char b[32];
      if (bytes < (int64_t{1} << 20)) std::snprintf(b, sizeof b, "%.1f KiB", bytes / 1024.0);
      else if (bytes < (int64_t{1} << 30)) std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
      else std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
      return std::string(b);
    };
    char msg[320];
    const std::string where =
        c.memory.zero_stage == 0 ? std::string("whole on each rank")
        : shard_sync             ? "and gradients sharded (ZeRO-2) over " + std::to_string(l.world_size) + " ranks"
                                 : "sharded (ZeRO-1) over " + std::to_string(l.world_size) + " ranks";
    std::snprintf(msg, sizeof msg, "memory: %s weights%s, optimizer state %s%s: %s on this rank (%s whole)",
                  name_of(c.memory.weights_dtype), sharded->has_masters() ? " with fp32 masters" : "", where.c_str(),
                  c.memory.offload_optimizer ? " in host memory" : "", size(sharded->state_bytes()).c_str(),
                  size(replicated).c_str());
    out.push_back(msg);
  }
  if (peak_lr != c.optim.lr) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "optim.lr_scaling %s: peak lr %.3e (optim.lr %.3e at base_batch %lld)",
                  name_of(c.optim.lr_scaling), peak_lr, c.optim.lr, (long long)c.optim.base_batch);
    out.push_back(msg);
  }
  return out;
}

}  // namespace gradguard::train
