// The loop reads top to bottom: per step, set the lr, accumulate gradients over the
// micro-batches, measure and clip (the one host sync of the step, which also reads the
// loss, the per-micro-batch losses and the noise-scale norm), let the scaler and the
// anomaly detector judge the step, act on the verdict (guard_actions.cpp), step the
// optimizer unless the step is skipped, then write metrics, validate and checkpoint on
// their cadences. Checkpoints are written to a temporary directory and renamed, so a
// crash never leaves a half-written one behind. A step's micro-batches come from a
// single-slot prefetcher (data/prefetcher.h) that built them on its own thread while the
// previous step computed; it is keyed by (step, data offset, injected fault), so a
// rollback or a resume gets exactly the batches it would get without it.
#include "gradguard/train/trainer.h"

#include <chrono>
#include <limits>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/schedule.h"
#include "gradguard/report/html_report.h"
#include "gradguard/train/progress.h"
#include "gradguard/train/step.h"
#include "trainer_internal.h"

namespace gradguard::train {
using Clock = std::chrono::steady_clock;

TrainResult Trainer::run() {
  TrainResult result;
  try {
    result = run_steps();
  } catch (const std::exception& e) {
    // The other ranks quote this when their next collective fails.
    if (s_->comm) s_->comm->report_failure(e.what());
    write_report();  // a halted or failed run is the one most worth looking at
    throw;
  }
  result.report = write_report();
  return result;
}

// report.html on rank 0 when log.report is on. A report that cannot be written is a
// warning: the run itself succeeded, and `gradguard report RUN_DIR` can retry.
std::string Trainer::write_report() {
  if (!s_->cfg.log.report || !s_->main_rank()) return "";
  try {
    return report::write_html_report(s_->run_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: report.html not written: %s\n", e.what());  // stdout may be JSON lines
    return "";
  }
}

TrainResult Trainer::run_steps() {
  const auto& c = s_->cfg;
  const bool main_rank = s_->main_rank();
  auto& model = *s_->model;
  // min_lr scales with lr so the floor keeps its ratio to the peak.
  optim::ScheduleOptions schedule_options = c.schedule;
  schedule_options.min_lr *= s_->peak_lr / c.optim.lr;
  const optim::LrSchedule schedule(s_->peak_lr, schedule_options);
  // Only rank 0 writes the run directory; the others keep recent lines in memory only.
  MetricsWriter metrics(main_rank ? s_->run_dir + "/metrics.jsonl" : "",
                        static_cast<size_t>(c.guard.snapshot.history), c.log.tensorboard);
  s_->metrics = &metrics;
  struct MetricsReset {  // s_->metrics must not outlive `metrics`, exceptions included
    State* s;
    ~MetricsReset() { s->metrics = nullptr; }
  } metrics_reset{s_.get()};
  Progress progress(main_rank ? c.log.progress : "none", c.schedule.total_steps, c.log.every, s_->out);
  const double nan = std::numeric_limits<double>::quiet_NaN();

  TrainResult result;
  result.run_dir = s_->run_dir;
  result.rank = s_->env.rank;
  result.world_size = s_->env.world_size;
  result.parameters = model::count_parameters(model);
  result.initial_val_loss = result.final_val_loss = nan;
  char header[512];
  std::snprintf(header, sizeof header,
                "gradguard %s | model %lld params (%lld layers x %lld wide) | %lld seq x %lld tokens = %lld tokens/step "
                "(micro %lld x accum %lld) | threads: %lld ATen, %lld %s | run %s",
                GRADGUARD_VERSION, (long long)result.parameters, (long long)c.model.num_layers,
                (long long)c.model.hidden_size, (long long)c.batch.global_batch, (long long)c.data.seq_len,
                (long long)(c.batch.global_batch * c.data.seq_len), (long long)c.batch.micro_batch,
                (long long)c.batch.accum_steps, (long long)s_->threads.intra_op,
                (long long)s_->threads.blas_threads, s_->threads.blas.c_str(),
                s_->run_dir.c_str());
  progress.line(header);
  for (const auto& w : c.warnings) progress.line("warning: " + w);
  for (const auto& n : s_->resume_notes) progress.line(n);
  if (s_->sampler) {
    if (!s_->sampler->note().empty()) progress.line("telemetry: " + s_->sampler->note());
    s_->sampler->start();
  }
  if (s_->peak_lr != c.optim.lr) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "optim.lr_scaling %s: peak lr %.3e (optim.lr %.3e at base_batch %lld)",
                  c.optim.lr_scaling.c_str(), s_->peak_lr, c.optim.lr, (long long)c.optim.base_batch);
    progress.line(msg);
  }

  auto validate = [&](int64_t step) {
    if (!s_->val || !main_rank) return nan;
    double v = evaluate(model, *s_->val, c.batch.micro_batch, c.eval.batches, c.amp, s_->device);
    metrics.write_validation(step, v);
    char msg[128];
    std::snprintf(msg, sizeof msg, "step %lld/%lld | val_loss %.4f", (long long)step,
                  (long long)c.schedule.total_steps, v);
    progress.line(msg);
    return v;
  };
  model.train();
  if (s_->start_step == 0) result.initial_val_loss = validate(0);
  result.resumed_from = s_->start_step > 0 ? s_->start_step : -1;
  auto save = [&](int64_t steps_done) -> std::string {
    if (!main_rank) return "";
    return checkpoint::save_checkpoint(s_->run_dir + "/checkpoints", steps_done, model, *s_->optimizer,
                                       s_->trainer_state(steps_done), config::to_yaml(c), c.checkpoint.keep_last);
  };
  auto drain_telemetry = [&](int64_t step) {
    if (!s_->sampler) return;
    // Every rank's samples reach rank 0's metrics through the store, tagged with the rank.
    if (!main_rank) {
      for (const auto& sample : s_->sampler->drain()) s_->comm->publish("telemetry", telemetry::to_json(sample).dump());
      return;
    }
    for (const auto& sample : s_->sampler->drain()) metrics.write_telemetry(step, sample, s_->comm ? 0 : -1);
    if (!s_->comm) return;
    for (const auto& [rank, payload] : s_->comm->collect("telemetry"))
      metrics.write_telemetry(step, nlohmann::ordered_json::parse(payload), rank);
  };

  const int64_t tokens_per_step = c.batch.global_batch * c.data.seq_len;
  const auto& inject = c.guard.inject;
  const auto start = Clock::now();
  bool noise_warned = false;
  result.steps = s_->start_step;
  s_->furthest_step = s_->start_step - 1;
  for (int64_t step = s_->start_step; step < c.schedule.total_steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = schedule.lr_at(step) * s_->ladder->lr_factor(step);
    optim::set_learning_rate(*s_->optimizer, lr);
    if (s_->sync)
      s_->sync->begin_step(step);  // .grad are views into the all-reduce buckets, zeroed
    else
      for (auto& p : s_->params) p.mutable_grad() = torch::Tensor();  // set_to_none: fresh buffers

    StepRecord rec;
    rec.step = step;
    rec.lr = lr;
    const bool first_visit = step > s_->furthest_step;  // faults are injected once, not again after a rollback
    s_->furthest_step = std::max(s_->furthest_step, step);
    const bool inject_spike = first_visit && inject.spike_at(step);
    const bool inject_nonfinite = first_visit && inject.nonfinite_at(step);
    {
      // This step's batches, built in the background during the previous step unless a
      // rollback, a resume or the first step asks for a key nobody prefetched.
      auto batches = s_->prefetcher->get(State::batch_key(step, s_->data_offset, inject_spike));
      rec.micro = std::move(batches.micro);
      rec.sample_index = batches.sample_index;
      // The next step's, built while this one computes. The guess is exact unless this
      // step rolls back (a new data offset: get() then misses and rebuilds).
      if (step + 1 < c.schedule.total_steps) {
        const bool next_spike = step + 1 > s_->furthest_step && inject.spike_at(step + 1);
        s_->prefetcher->prefetch(State::batch_key(step + 1, s_->data_offset, next_spike));
      }
    }
    rec.injected = inject_spike ? "spike_batch" : inject_nonfinite ? "nonfinite_gradients" : "";
    rec.loss_scale = s_->scaler->scale();
    const bool measure_noise = c.guard.noise_scale.every > 0 && c.batch.accum_steps > 1 &&
                               step % c.guard.noise_scale.every == 0;
    const bool corrupt_here = inject_nonfinite && (inject.rank == -1 || inject.rank == s_->env.rank);
    auto corrupt = [&] {
      torch::NoGradGuard no_grad;
      s_->params[0].grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
    };
    std::function<void(const Accumulation&)> hand_off;
    if (s_->sync)
      hand_off = [&](const Accumulation& partial) {
        if (corrupt_here) corrupt();  // before the last backward: the inf travels with the all-reduce
        s_->sync->arm(s_->side_values(partial));
      };
    auto acc = accumulate(model, rec.micro, tokens_per_step, c.amp, s_->device, rec.loss_scale, measure_noise,
                          hand_off);
    std::vector<torch::Tensor> extras;
    if (s_->sync) {
      // The gradients, the loss, every rank's micro-batch losses and noise norms, summed
      // over the ranks: identical on every rank from here on, so are the decisions.
      const auto side = s_->sync->finish();
      for (int64_t k = 0; k < side.numel(); ++k) extras.push_back(side[k]);
    } else {
      if (corrupt_here) corrupt();
      extras = {acc.loss};
      extras.insert(extras.end(), acc.micro_losses.begin(), acc.micro_losses.end());
      if (measure_noise) extras.push_back(acc.first_sq_norm);
    }

    // The guarded step: one statistics pass (the step's single host sync, which also
    // reads the losses and the noise-scale norm), then host-side decisions.
    const auto stats = s_->stats->compute(1.0 / rec.loss_scale, extras, s_->clipper->device_hook());
    rec.stats = &stats;
    rec.clip = s_->clipper->apply(stats);
    const int64_t world = s_->env.world_size;
    const int64_t n_micro = world * c.batch.accum_steps;  // micro-batches of the global batch
    rec.micro_losses.assign(stats.extras.begin() + 1, stats.extras.begin() + 1 + n_micro);
    double first_sq_norm = 0;  // mean over ranks of the first micro-batch's squared norm
    if (measure_noise) {
      if (s_->sync) {
        for (int64_t r = 0; r < world; ++r) first_sq_norm += stats.extras[1 + n_micro + r];
        first_sq_norm /= static_cast<double>(world);
      } else {
        first_sq_norm = stats.extras.back();
      }
    }
    const auto scaler = s_->scaler->update(stats.nonfinite);
    if (scaler.grew) s_->last_scale_growth = step;
    StepMetrics m;
    m.step = step;
    m.loss = stats.extras[0];
    m.lr = lr;
    m.grad_norm = rec.clip.grad_norm;
    m.clip_coef = rec.clip.clip_coef;
    m.clip_threshold = rec.clip.threshold;
    m.loss_scale = rec.loss_scale;
    for (size_t k = 0; k < stats.layer_norms.size(); ++k)
      m.layer_grad_norms.emplace_back(s_->stats->groups().names[k], stats.layer_norms[k]);
    if (measure_noise && !stats.nonfinite) {
      // The first micro-batch's gradient is its mean gradient times its share of the
      // global tokens (1 / (accum x ranks)) times the loss scale.
      const double share = static_cast<double>(n_micro) / rec.loss_scale;
      m.noise_scale = s_->noise->update(first_sq_norm * share * share, static_cast<double>(c.batch.micro_batch),
                                        rec.clip.grad_norm * rec.clip.grad_norm,
                                        static_cast<double>(c.batch.global_batch));
      const auto& ns = c.guard.noise_scale;
      if (!noise_warned && ns.warn_ratio > 0 && s_->noise->count() >= ns.warn_after && m.noise_scale > 0 &&
          c.batch.global_batch > ns.warn_ratio * m.noise_scale) {
        noise_warned = true;
        char msg[256];
        std::snprintf(msg, sizeof msg,
                      "warning: global batch %lld is %.0fx the gradient noise scale B_simple ~ %.1f sequences: "
                      "larger batches than this buy little; consider a smaller batch or a higher learning rate",
                      (long long)c.batch.global_batch, c.batch.global_batch / m.noise_scale, m.noise_scale);
        progress.line(msg);
        metrics.write(nlohmann::ordered_json{{"step", step}, {"event", "warning"}, {"kind", "noise_scale"},
                                             {"noise_scale", m.noise_scale}, {"global_batch", c.batch.global_batch}});
      }
    }

    bool apply = !scaler.skipped;
    if (scaler.skipped)
      metrics.write(nlohmann::ordered_json{{"step", step}, {"event", "skip"}, {"reason", "nonfinite_gradients"},
                                           {"loss_scale", rec.loss_scale}, {"next_loss_scale", scaler.next_scale}});
    guard::Verdict verdict;
    if (c.guard.enabled) {
      guard::StepObservation obs;
      obs.step = step;
      obs.loss = m.loss;
      obs.grad_norm = rec.clip.grad_norm;
      // The explosion rule compares the global norm with a global-norm threshold; AGC's
      // (a ratio) and the per-layer one are not, so those runs use the recent mean.
      const bool global_threshold = c.clip.strategy == "global" || c.clip.strategy == "history" ||
                                    c.clip.strategy == "zscore";
      obs.clip_threshold = global_threshold ? rec.clip.threshold : std::numeric_limits<double>::infinity();
      obs.update_bounded = c.clip.strategy != "none";
      obs.layer_norms = stats.layer_norms;
      obs.scaler_dynamic = s_->scaler->mode() == "dynamic";
      obs.scaler_backed_off = scaler.backed_off;
      obs.scaler_stuck = scaler.stuck;
      verdict = s_->detector->observe(obs);
    } else if (scaler.stuck) {
      metrics.write_step(m);
      throw Error(ErrorKind::kHalted, "amp.scaler.min_scale",
                  "step " + std::to_string(step) + ": gradients overflow even at the minimum loss scale " +
                      format_number(c.amp.scaler.min_scale) + "; training cannot make progress. Run directory: " +
                      s_->run_dir);
    }
    for (const auto& a : verdict.anomalies) {
      metrics.write(guard::to_event(step, a));
      ++result.anomalies;
    }
    s_->recent_norms.push_back(rec.clip.grad_norm);
    s_->recent_seconds.push_back(std::chrono::duration<double>(Clock::now() - step_start).count());
    while (s_->recent_norms.size() > 50) s_->recent_norms.pop_front(), s_->recent_seconds.pop_front();

    std::string action;
    if (verdict.critical()) {
      apply = false;
      const auto* primary = verdict.primary();
      bool has_checkpoint = fs::exists(s_->run_dir + "/checkpoints/latest");
      if (s_->comm)  // rank 0 holds the checkpoints: its answer decides for all
        has_checkpoint = s_->comm->broadcast_string(has_checkpoint ? "1" : "0", "checkpoint check") == "1";
      const auto decision = s_->ladder->decide(step, primary->kind, has_checkpoint);
      action = decision.action;
      std::string why = "written by rank 0";
      std::string snapshot;
      if (main_rank) {
        why.clear();
        // A snapshot holds the whole global batch: every rank's micro-batches.
        if (s_->comm) {
          auto all = s_->micro_batches(step, s_->data_offset, inject_spike, -1);
          rec.micro = std::move(all.micro);
          rec.sample_index = all.sample_index;
        }
        snapshot = s_->take_snapshot(rec, verdict, action == "halt", &why);
      }
      if (!snapshot.empty()) {
        ++result.snapshots;
        result.last_snapshot = snapshot;
      }
      nlohmann::ordered_json event = {{"step", step}, {"event", "recovery"}, {"action", action},
                                      {"rung", decision.rung}, {"budget_left", decision.budget_left},
                                      {"anomaly", primary->kind}};
      event["snapshot"] = snapshot.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(snapshot);
      if (!why.empty()) event["snapshot_skipped"] = why;
      if (!decision.note.empty()) event["note"] = decision.note;
      if (action == "reset_moments") event["tensors_reset"] = s_->reset_moments(primary->layers);
      metrics.write(event);
      ++result.recovery_actions;
      progress.line("step " + std::to_string(step) + ": anomaly " + primary->kind + " (" + primary->message +
                    "); action: " + action + (snapshot.empty() ? "" : "; snapshot " + snapshot));
      if (action == "halt") {
        m.skipped = true;
        metrics.write_step(m);
        throw Error(ErrorKind::kHalted, snapshot.empty() ? s_->run_dir : snapshot,
                    "step " + std::to_string(step) + ": " + primary->kind + " (" + primary->message +
                        "); the recovery ladder is spent" + (decision.note.empty() ? "" : " (" + decision.note + ")") +
                        ". Snapshot: " + (snapshot.empty() ? "none (" + why + ")" : snapshot));
      }
    }
    if (apply) s_->optimizer->step();
    s_->detector->record_outcome(apply);
    if (s_->comm && c.dist.check_every > 0 && (step + 1) % c.dist.check_every == 0)
      dist::verify_parameters(*s_->comm, s_->params, s_->names, step + 1);
    m.skipped = !apply;
    if (!apply) ++result.skipped_steps;
    m.tokens = tokens_per_step;
    const double dt = std::chrono::duration<double>(Clock::now() - step_start).count();
    m.tokens_per_s = tokens_per_step / dt;
    m.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    metrics.write_step(m);
    drain_telemetry(step);
    progress.step(m, result.anomalies);
    if (step == s_->start_step) result.first_loss = m.loss;
    result.final_loss = m.loss;
    result.steps = step + 1;

    if (action == "rollback") {
      std::string dir;
      const int64_t to = s_->rollback(step, &dir);
      metrics.write(nlohmann::ordered_json{{"step", step}, {"event", "rollback"}, {"checkpoint", dir},
                                           {"to_step", to}, {"data_offset", s_->data_offset}});
      progress.line("step " + std::to_string(step) + ": rolled back to " + dir + "; skipping " +
                    std::to_string(step + 1 - to + c.guard.recovery.rollback_skip_steps) + " steps of data");
      ++result.rollbacks;
      step = to - 1;  // the loop's ++ continues at `to`
      continue;
    }
    const bool last = step + 1 == c.schedule.total_steps;
    if (c.eval.every > 0 && (step + 1) % c.eval.every == 0 && !last) validate(step + 1);
    if (c.checkpoint.every > 0 && (step + 1) % c.checkpoint.every == 0 && !last)
      save(step + 1);
  }
  if (s_->sampler) {
    s_->sampler->stop();
    drain_telemetry(result.steps);
  }
  result.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  result.tokens_per_s = (result.steps - s_->start_step) * tokens_per_step / std::max(result.elapsed_s, 1e-9);
  result.final_val_loss = validate(result.steps);
  result.checkpoint_dir = save(result.steps);
  progress.finish();
  return result;
}

}  // namespace gradguard::train
