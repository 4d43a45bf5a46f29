// The loop, in the shape of docs/design.md: per step, set the learning rate, get the
// step's batches (built in the background during the previous step), accumulate
// gradients over them, let the GuardedStep measure, clip, judge and apply (the step's
// one host read), log, and act on what the guard decided (roll back, halt); then
// validate and checkpoint on their cadences. The pieces it calls are in
// trainer_steps.cpp; setup, resume and rollback in trainer_setup.cpp.
#include "gradguard/train/trainer.h"

#include <chrono>
#include <limits>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/core/stop_signals.h"
#include "gradguard/optim/optimizer.h"
#include "trainer_internal.h"

namespace gradguard::train {
using Clock = std::chrono::steady_clock;

TrainResult Trainer::run_until(int64_t last_step, const std::function<void(model::LlamaForCausalLMImpl&)>& before_last) {
  s_->last_step = last_step;
  s_->before_last = before_last;
  return run();
}

TrainResult Trainer::run() {
  try {
    return run_steps();
  } catch (const std::exception& e) {
    // The other ranks quote this when their next collective fails.
    if (s_->comm) s_->comm->report_failure(e.what());
    throw;
  }
}

TrainResult Trainer::run_steps() {
  auto& s = *s_;
  const auto& c = s.cfg;
  TrainResult result = s.result_so_far();
  if (s.complete) return result;  // a resumed run that had finished: nothing to do
  const optim::LrSchedule schedule = s.schedule();
  // Only rank 0 writes the run directory; the others keep recent lines in memory only.
  MetricsWriter metrics(s.main_rank() ? s.run.metrics() : "", static_cast<size_t>(c.guard.snapshot.history),
                        c.log.tensorboard);
  Progress progress(s.main_rank() ? c.log.progress : config::ProgressMode::kQuiet, c.schedule.total_steps, c.log.every, s.out);
  struct Attach {  // the loggers must not outlive this function, exceptions included
    State& s;
    ~Attach() { s.metrics = nullptr, s.progress = nullptr; }
  } attach{s};
  s.metrics = &metrics;
  s.progress = &progress;
  for (const auto& line : header_lines(s.header(result.parameters))) progress.line(line);
  if (s.sampler) s.sampler->start();
  s.model->train();
  if (s.start_step == 0) result.initial_val_loss = s.validate(0);

  StopSignals stop_signals;  // SIGTERM/SIGINT: finish the step, checkpoint, stop (a second one: at once)
  const int64_t tokens_per_step = c.batch.global_batch * c.data.seq_len;
  const auto start = Clock::now();
  s.source->start_at(s.start_step);
  bool until = false;  // stopped at run_until's last step
  for (int64_t step = s.start_step; step < c.schedule.total_steps; ++step) {
    if (step == s.last_step && s.before_last) s.before_last(*s.model);
    const auto step_start = Clock::now();
    const double lr = schedule.lr_at(step) * s.guarded->lr_factor(step);
    optim::set_learning_rate(*s.optimizer, lr);
    const StepData data = s.source->next(step);
    const guard::StepInputs inputs = s.accumulate_step(step, data, lr);
    s.current = &data;
    const guard::StepOutcome out = s.guarded->step(step, inputs);  // the one host read
    s.current = nullptr;
    if (s.comm && c.dist.check_every > 0 && (step + 1) % c.dist.check_every == 0)
      dist::verify_parameters(*s.comm, s.params, s.names, step + 1);

    StepMetrics m = step_metrics(out, s.guarded->groups().names);
    if (const auto d = s.guarded->compute_dtype(step, c.amp.dtype); d != c.amp.dtype) m.compute_dtype = name_of(d);
    m.tokens = tokens_per_step;
    m.tokens_per_s = tokens_per_step / std::chrono::duration<double>(Clock::now() - step_start).count();
    m.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    result.anomalies += s.log_step(out, m);
    result.skipped_steps += out.applied ? 0 : 1;
    result.recovery_actions += out.recovery ? 1 : 0;
    if (!out.snapshot.dir.empty()) ++result.snapshots, result.last_snapshot = out.snapshot.dir;
    if (out.halt)
      throw Error(ErrorKind::kHalted,
                  out.recovery ? (out.snapshot.dir.empty() ? s.run.root() : out.snapshot.dir) : "amp.scaler.min_scale",
                  out.halt_message + (out.recovery ? "" : ". Run directory: " + s.run.root()));
    if (step == s.start_step) result.first_loss = out.loss;
    result.final_loss = out.loss;
    result.steps = step + 1;
    if (step == s.last_step) {
      until = true;
      break;
    }

    if (out.rollback()) {
      std::string dir;
      const int64_t to = s.rollback(step, &dir);
      metrics.write(nlohmann::ordered_json{{"step", step}, {"event", "rollback"}, {"checkpoint", dir},
                                           {"to_step", to}, {"data_offset", s.source->offset()}});
      progress.line("step " + std::to_string(step) + ": rolled back to " + dir + "; skipping " +
                    std::to_string(step + 1 - to + c.guard.recovery.rollback_skip_steps) + " steps of data");
      ++result.rollbacks;
      step = to - 1;  // the loop's ++ continues at `to`
      continue;
    }
    const bool last = step + 1 == c.schedule.total_steps;
    const bool stop = !last && s.stop_after(out);
    if (c.eval.every > 0 && (step + 1) % c.eval.every == 0 && !last && !stop) s.validate(step + 1);
    std::string checkpoint;
    if (c.checkpoint.every > 0 && (step + 1) % c.checkpoint.every == 0 && !last)
      checkpoint = s.save(step + 1, /*periodic=*/true);
    if (stop) {
      // Preempted: the step is complete; its checkpoint (unless the cadence just wrote it)
      // lets `--resume` continue exactly here.
      result.checkpoint_dir = checkpoint.empty() ? s.save(step + 1) : checkpoint;
      result.preempted = true;
      result.stop_signal = StopSignals::name(StopSignals::requested());
      if (result.stop_signal.empty()) result.stop_signal = "a stop signal on another rank";
      metrics.write(nlohmann::ordered_json{{"step", step + 1}, {"event", "preempted"}, {"signal", result.stop_signal},
                                           {"checkpoint", result.checkpoint_dir}});
      progress.line("stopped by " + result.stop_signal + " after step " + std::to_string(step + 1) +
                    "; checkpoint " + result.checkpoint_dir + "; continue with: train --resume " + s.run.root());
      break;
    }
  }
  if (s.sampler) {
    s.sampler->stop();
    s.drain_telemetry(result.steps);
  }
  result.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  result.tokens_per_s = (result.steps - s.start_step) * tokens_per_step / std::max(result.elapsed_s, 1e-9);
  if (!result.preempted && !until) {
    result.final_val_loss = s.validate(result.steps);
    result.checkpoint_dir = s.save(result.steps);
  }
  progress.finish();
  return result;
}

}  // namespace gradguard::train
