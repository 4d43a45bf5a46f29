// What the trainer does once the detector has called a step critical: gather the
// evidence into a snapshot with its diagnosis, and carry out the recovery action the
// ladder chose (moment reset, rollback). Runs only on anomalous steps, so it may sync
// and copy freely.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/fs.h"
#include "gradguard/guard/diagnosis.h"
#include "gradguard/optim/optimizer.h"
#include "trainer_internal.h"

namespace gradguard::train {

std::string Trainer::State::take_snapshot(const StepRecord& rec, const guard::Verdict& verdict, bool force,
                                          std::string* why) {
  const auto& c = cfg;
  const auto* primary = verdict.primary();
  const auto& groups = stats->groups();
  const auto& st = *rec.stats;

  // What the snapshot holds, then the budget check before any further work: the
  // diagnosis below syncs and reads whole layers, and is only ever written into a
  // snapshot.
  guard::SnapshotData d;
  d.step = rec.step;
  d.kind = primary ? primary->kind : "anomaly";
  d.model = model.get();
  for (size_t i = 0; i < params.size(); ++i) {
    auto m = optim::moments_of(*optimizer, params[i]);
    if (m.exp_avg.defined()) d.optimizer_state.emplace_back("exp_avg/" + names[i], m.exp_avg);
    if (m.exp_avg_sq.defined()) d.optimizer_state.emplace_back("exp_avg_sq/" + names[i], m.exp_avg_sq);
    if (m.momentum_buffer.defined()) d.optimizer_state.emplace_back("momentum_buffer/" + names[i], m.momentum_buffer);
    if (m.step > 0) d.optimizer_metadata["step/" + names[i]] = std::to_string(m.step);
    if (params[i].grad().defined()) d.gradients.emplace_back(names[i], params[i].grad());
  }
  std::vector<torch::Tensor> inputs, targets;
  for (const auto& b : rec.micro) {
    inputs.push_back(b.inputs);
    targets.push_back(b.targets);
  }
  d.inputs = torch::stack(inputs);
  d.targets = torch::stack(targets);
  d.sample_index = rec.sample_index;
  const int64_t bytes = d.estimated_bytes();
  if (!snapshots->allow(rec.step, force, bytes, why)) return "";

  // The layers to examine: those the anomaly names, else the three furthest above normal.
  std::vector<size_t> layer_ids;
  if (primary)
    for (const auto& name : primary->layers) {
      auto it = std::find(groups.names.begin(), groups.names.end(), name);
      if (it != groups.names.end() && layer_ids.size() < 6) layer_ids.push_back(it - groups.names.begin());
    }
  if (layer_ids.empty()) {
    std::vector<size_t> order(groups.names.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    auto ratio = [&](size_t k) {
      const double t = detector->layer_typical(k);
      return t > 0 ? st.layer_norms[k] / t : st.layer_norms[k];
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratio(a) > ratio(b); });
    order.resize(std::min<size_t>(3, order.size()));
    layer_ids = order;
  }

  guard::DiagnosisInput in;
  in.step = rec.step;
  in.anomalies = verdict.anomalies;
  in.injected = rec.injected;
  in.loss = st.extras.at(0);
  in.loss_mean = detector->loss_mean();
  in.loss_std = detector->loss_std();
  in.grad_norm = rec.clip.grad_norm;
  in.clip_threshold = rec.clip.threshold;
  in.grad_norm_factor = c.guard.grad_norm_factor;
  in.lr = rec.lr;
  in.peak_lr = peak_lr;
  in.warmup_steps = c.schedule.warmup_steps;
  in.micro_losses = rec.micro_losses;
  in.scaler_mode = scaler->mode();
  in.loss_scale = rec.loss_scale;
  in.last_scale_growth = last_scale_growth;
  in.recent_grad_norms.assign(recent_norms.begin(), recent_norms.end());
  in.recent_step_seconds.assign(recent_seconds.begin(), recent_seconds.end());
  if (sampler) in.telemetry = sampler->window();
  for (size_t k : layer_ids) {
    std::vector<size_t> tensors;
    for (size_t i = 0; i < params.size(); ++i)
      if (groups.group_of[i] == static_cast<int64_t>(k)) tensors.push_back(i);
    in.layers.push_back(guard::layer_evidence(*optimizer, groups.names[k], params, tensors, c.optim.betas[0],
                                              c.optim.betas[1], c.optim.eps, st.layer_norms[k],
                                              detector->layer_typical(k)));
  }
  const auto diagnosis = guard::diagnose(in);

  nlohmann::ordered_json layer_norms = nlohmann::ordered_json::object();
  for (size_t k = 0; k < groups.names.size(); ++k) layer_norms[groups.names[k]] = json_number(st.layer_norms[k]);
  nlohmann::ordered_json anomalies = nlohmann::ordered_json::array();
  for (const auto& a : verdict.anomalies) anomalies.push_back(guard::to_event(rec.step, a));
  nlohmann::ordered_json state = {{"step", rec.step},
                                  {"kind", d.kind},
                                  {"anomalies", anomalies},
                                  {"injected", rec.injected},
                                  {"loss", json_number(in.loss)},
                                  {"micro_losses", rec.micro_losses},
                                  {"grad_norm", json_number(rec.clip.grad_norm)},
                                  {"nonfinite", st.nonfinite},
                                  {"clip_coef", json_number(rec.clip.clip_coef)},
                                  {"clip_threshold", json_number(rec.clip.threshold)},
                                  {"layer_grad_norms", layer_norms},
                                  {"lr", rec.lr},
                                  {"loss_scale", rec.loss_scale},
                                  {"scaler_mode", scaler->mode()},
                                  {"amp_dtype", c.amp.dtype},
                                  {"device", c.run.device},
                                  {"micro_batch", c.batch.micro_batch},
                                  {"accum_steps", c.batch.accum_steps},
                                  {"seq_len", c.data.seq_len},
                                  {"tokens_per_step", c.batch.global_batch * c.data.seq_len},
                                  {"data_offset", data_offset}};
  d.state_json = state.dump(2) + "\n";
  d.metrics_lines = metrics ? metrics->recent() : std::vector<std::string>{};
  for (const auto& s : in.telemetry) d.telemetry_lines.push_back(telemetry::to_json(s).dump());
  d.config_yaml = config::to_yaml(c);
  d.diagnosis_json = diagnosis.to_json(in).dump(2) + "\n";
  d.diagnosis_md = diagnosis.to_markdown(in, "Step " + std::to_string(rec.step) + ": " + d.kind);
  const std::string dir = guard::write_snapshot(run_dir, d);
  snapshots->record(rec.step, bytes);
  return dir;
}

int64_t Trainer::State::reset_moments(const std::vector<std::string>& layers) {
  const auto& groups = stats->groups();
  int64_t n = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& layer = groups.names[groups.group_of[i]];
    if (!layers.empty() && std::find(layers.begin(), layers.end(), layer) == layers.end()) continue;
    n += optim::reset_moments(*optimizer, params[i]) ? 1 : 0;
  }
  return n;
}

int64_t Trainer::State::rollback(int64_t step, std::string* checkpoint_dir) {
  std::vector<std::string> rejected;
  // Rank 0 picks the checkpoint; every rank loads it (the run directory must be visible
  // to all ranks, as on a shared filesystem) and the replicas are verified equal.
  if (main_rank()) *checkpoint_dir = checkpoint::find_resumable(run_dir, &rejected);
  if (comm) *checkpoint_dir = comm->broadcast_string(*checkpoint_dir, "rollback checkpoint choice");
  const int64_t to = restore(*checkpoint_dir, /*with_guard=*/false);
  if (comm) dist::verify_parameters(*comm, params, names, to);
  TORCH_INTERNAL_ASSERT(to <= step + 1);
  // The window that led to the anomaly is steps [to, step]; skip its data (and any extra
  // steps asked for) so the continuation reads fresh batches.
  data_offset += step + 1 - to + cfg.guard.recovery.rollback_skip_steps;
  return to;
}

}  // namespace gradguard::train
