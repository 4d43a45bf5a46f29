// The pieces of one training step that the loop (trainer.cpp) calls in order: the
// accumulation with the run's gradient reduction (which also carries the side values the
// guard reads), the evidence a snapshot needs, and the step's log lines. The step's
// batches come from the StepSource (step_source.h).
#include <limits>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/stop_signals.h"
#include "gradguard/guard/side_layout.h"
#include "trainer_internal.h"

namespace gradguard::train {

guard::StepInputs Trainer::State::accumulate_step(int64_t step, const StepData& data, double lr) {
  using Slot = guard::SideLayout::Slot;
  const auto& c = cfg;
  const int64_t world = env.world_size, accum = c.batch.accum_steps;
  const int64_t n_micro = world * accum;  // micro-batches of the global batch
  const bool measure_noise =
      c.guard.noise_scale.every > 0 && accum > 1 && step % c.guard.noise_scale.every == 0;
  const auto layout = guard::SideLayout::for_ranks(world, accum);
  reduction->begin_step(step, measure_noise, data.corrupt);

  // This rank's side vector: zeros in the other ranks' entries, so the sum over the ranks
  // gathers them. Built before the last backward, when the accumulation's values are complete.
  auto hand_off = [&](const Accumulation& partial) {
    torch::NoGradGuard no_grad;
    auto side = layout.zeros(device);
    layout.of(side, Slot::kLoss).copy_(partial.loss.reshape({1}));
    const auto micro = layout.of(side, Slot::kMicroLosses);  // by global micro-batch g = m * world + rank
    for (int64_t m = 0; m < static_cast<int64_t>(partial.micro_losses.size()); ++m)
      micro.narrow(0, m * world + env.rank, 1).copy_(partial.micro_losses[m].reshape({1}));
    const auto noise = reduction->grads_in_place() ? partial.first_sq_norm : reduction->noise_sample();
    if (noise.defined()) layout.of(side, Slot::kNoiseSqNorm).narrow(0, env.rank, 1).copy_(noise.reshape({1}));
    if (StopSignals::requested() != 0) layout.of(side, Slot::kStopRequest).fill_(1.0f);
    if (partial.z_loss.defined()) layout.of(side, Slot::kZLoss).copy_(partial.z_loss.reshape({1}));
    reduction->hand_off(side);
  };
  const int64_t trained = source->trained_targets(step);
  amp::AmpOptions amp = c.amp;  // wider while the recovery ladder's precision fallback lasts
  amp.dtype = guarded->compute_dtype(step, c.amp.dtype);
  accumulate(*model, data.batches.micro, trained, amp, device, guarded->loss_scale(),
             measure_noise && reduction->grads_in_place(), hand_off, LossTerms{c.loss.z_loss, c.loss.chunk_tokens},
             [this] { reduction->after_backward(); });
  // Summed over the ranks: identical on every rank from here on, so are the decisions
  // (with ZeRO-2 the guard's statistics all-reduce sums it before anything is read).
  const auto side = reduction->finish();

  guard::StepInputs in;
  in.lr = lr;
  in.injected = data.injected;
  in.loss = layout.of(side, Slot::kLoss)[0];
  in.micro_losses = layout.of(side, Slot::kMicroLosses);
  if (measure_noise) in.noise_sq_norm = layout.of(side, Slot::kNoiseSqNorm).mean();  // mean over the ranks
  in.stop_request = layout.of(side, Slot::kStopRequest)[0];
  if (c.loss.z_loss > 0) in.z_loss = layout.of(side, Slot::kZLoss)[0];
  // The first micro-batch's share of the step's trained targets (1 / micro-batches for a
  // stream file; for samples the ranks' first micro-batches differ: their mean share).
  in.noise_share = 1.0 / static_cast<double>(n_micro);
  if (measure_noise && train->has_samples()) {
    int64_t first = 0;
    for (int64_t r = 0; r < world; ++r)
      first += source->first_micro_batch_targets(step, r);
    in.noise_share = static_cast<double>(first) / static_cast<double>(world) / static_cast<double>(trained);
  }
  in.noise_micro_batch = static_cast<double>(c.batch.micro_batch);
  in.noise_global_batch = static_cast<double>(c.batch.global_batch);
  return in;
}

bool Trainer::State::stop_after(const guard::StepOutcome& outcome) const {
  // Ranks read the sum of their flags (the side vector), so they agree; one process also
  // sees a signal that arrived after its side vector was built.
  return outcome.stop_requested || (!comm && StopSignals::requested() != 0);
}

forensics::SnapshotEvidence Trainer::State::snapshot_evidence(const guard::StepOutcome& out) const {
  const auto& c = cfg;
  forensics::SnapshotEvidence ev;
  // A snapshot holds the whole global batch: every rank's micro-batches.
  data::StepBatches all;
  if (comm)
    all = source->global_batch(out.step, current != nullptr && current->spike);
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
              {"tokens_per_step", source->trained_targets(out.step)},
              {"data_offset", source->offset()}};
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
  const double v =
      evaluate(*model, *val, cfg.batch.micro_batch, cfg.eval.batches, cfg.amp, device, cfg.loss.chunk_tokens);
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

RunHeader Trainer::State::header(int64_t parameters) const {
  RunHeader h;
  h.cfg = &cfg;
  h.parameters = parameters;
  h.trainable = model::count_trainable_parameters(*model.ptr());
  h.threads = &threads;
  h.run_dir = run.root();
  h.length_note = length_note;
  h.resume_notes = resume_notes;
  if (comm) h.resume_notes.push_back("data parallel: " + env.describe() + ", " + reduction->describe());
  if (sampler) h.telemetry_note = sampler->note();
  h.train = train.get();
  h.val = val.get();
  h.sharded = sharded;
  h.memory = cfg.memory.resolve(env.world_size, env.rank);
  h.peak_lr = peak_lr;
  return h;
}

}  // namespace gradguard::train
