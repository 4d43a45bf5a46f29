// Snapshot writing: everything goes into snapshots/.tmp-<name> first and is renamed
// when complete, like checkpoints.
#include "gradguard/forensics/snapshot.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/core/json_number.h"
#include "gradguard/forensics/diagnosis.h"

namespace gradguard::forensics {
namespace stdfs = std::filesystem;

int64_t SnapshotData::estimated_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : weights) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& [name, t] : optimizer_state) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& [name, t] : gradients) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto* t : {&inputs, &targets, &sample_index})
    if (t->defined()) bytes += t->numel() * 8;
  return bytes;
}

std::string write_snapshot(const std::string& run_dir, const SnapshotData& d) {
  char name[96];
  std::snprintf(name, sizeof name, "step-%07lld-%s", static_cast<long long>(d.step), d.kind.c_str());
  const stdfs::path root = RunDir(run_dir).snapshots();
  const stdfs::path final_dir = root / name;
  const stdfs::path tmp = root / (std::string(".tmp-") + name);
  try {
    stdfs::remove_all(tmp);
    stdfs::create_directories(tmp);
    if (!d.reference.is_null()) {
      // Over the disk budget: where replay starts instead of the weights (snapshot.h).
      fs::write_file_atomic((tmp / "reference.json").string(), d.reference.dump(2) + "\n");
    } else {
      if (d.write_model) {
        d.write_model((tmp / "model").string());
      } else {
        stdfs::create_directories(tmp / "model");
        checkpoint::save_safetensors((tmp / "model" / "model.safetensors").string(), d.weights);
      }
      checkpoint::save_safetensors((tmp / "optimizer.safetensors").string(), d.optimizer_state, d.optimizer_metadata);
      checkpoint::save_safetensors((tmp / "gradients.safetensors").string(), d.gradients);
    }
    if (d.inputs.defined()) {
      checkpoint::NamedTensors batch = {{"inputs", d.inputs}, {"targets", d.targets}};
      if (d.sample_index.defined()) batch.emplace_back("sample_index", d.sample_index);
      if (d.positions.defined()) batch.emplace_back("positions", d.positions);
      if (d.segments.defined()) batch.emplace_back("segments", d.segments);
      checkpoint::save_safetensors((tmp / "batch.safetensors").string(), batch);
    }
    auto lines = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& l : v) s += l + "\n";
      return s;
    };
    fs::write_file_atomic((tmp / "state.json").string(), d.state_json);
    fs::write_file_atomic((tmp / "metrics.jsonl").string(), lines(d.metrics_lines));
    fs::write_file_atomic((tmp / "telemetry.jsonl").string(), lines(d.telemetry_lines));
    fs::write_file_atomic((tmp / "config.yaml").string(), d.config_yaml);
    fs::write_file_atomic((tmp / "diagnosis.json").string(), d.diagnosis_json);
    fs::write_file_atomic((tmp / "diagnosis.md").string(), d.diagnosis_md);
    stdfs::remove_all(final_dir);  // a snapshot of the same step from before a rollback
    stdfs::rename(tmp, final_dir);
  } catch (const Error&) {
    std::error_code ignored;
    stdfs::remove_all(tmp, ignored);
    throw;
  } catch (const std::exception& e) {
    // A full disk surfaces as a filesystem_error, a c10::Error from LibTorch's writer or
    // a std::ios failure, depending on who was writing: all end as "not written".
    std::error_code ignored;
    stdfs::remove_all(tmp, ignored);
    throw runtime_error(final_dir.string(), std::string("cannot write the snapshot: ") + e.what());
  }
  return final_dir.string();
}

SnapshotBudget::SnapshotBudget(const guard::SnapshotOptions& options) : options_(options) { options_.validate(); }

bool SnapshotBudget::allow(int64_t step, bool force, int64_t bytes, std::string* reason) const {
  if (!options_.enabled) return *reason = "guard.snapshot.enabled is false", false;
  if (count_ >= options_.max_count)
    return *reason = "guard.snapshot.max_count (" + std::to_string(options_.max_count) + ") reached", false;
  if (!force && last_step_ >= 0 && step - last_step_ < options_.min_interval)
    return *reason = "within guard.snapshot.min_interval of the snapshot at step " + std::to_string(last_step_), false;
  const double mb = static_cast<double>(bytes_ + bytes) / (1024.0 * 1024.0);
  if (mb > options_.max_mb)
    return *reason = "it would bring snapshots to " + format_number(std::round(mb)) + " MiB, over guard.snapshot.max_mb (" +
                     format_number(options_.max_mb) + ")",
           false;
  return true;
}

void SnapshotBudget::record(int64_t step, int64_t bytes) {
  ++count_;
  bytes_ += bytes;
  last_step_ = step;
}

nlohmann::json SnapshotBudget::state_dict() const {
  return {{"count", count_}, {"bytes", bytes_}, {"last_step", last_step_}};
}

void SnapshotBudget::load_state_dict(const nlohmann::json& s, const std::string& where) {
  const JsonReader r(s, where, "guard.snapshots");
  const int64_t count = r.integer("count", 0), bytes = r.integer("bytes", 0), last_step = r.integer("last_step", -1);
  count_ = count, bytes_ = bytes, last_step_ = last_step;
}

SnapshotWriter::SnapshotWriter(std::string run_dir, const guard::SnapshotOptions& options,
                               std::function<SnapshotEvidence(const guard::StepOutcome&)> evidence,
                               std::function<void(const std::string& dir)> write_model,
                               std::function<nlohmann::json(int64_t step)> reference)
    : run_dir_(std::move(run_dir)),
      budget_(options),
      evidence_(std::move(evidence)),
      write_model_(std::move(write_model)),
      reference_(std::move(reference)) {}

guard::SnapshotResult SnapshotWriter::operator()(const guard::GuardedStep& guarded, const guard::StepOutcome& out,
                                                 bool force) {
  guard::SnapshotResult result;
  const auto* primary = out.verdict.primary();
  const auto& params = guarded.params();
  const auto& names = guarded.names();
  const auto& groups = guarded.groups();
  const auto& detector = guarded.detector();
  const auto& hooks = guarded.hooks();
  const auto& o = guarded.options();
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

  // What the snapshot holds, then the budget check before any further work: the
  // diagnosis below reads whole layers, and is only ever written into a snapshot.
  SnapshotData d;
  d.step = out.step;
  d.kind = primary ? name_of(primary->kind) : "anomaly";
  d.write_model = write_model_;
  for (size_t i = 0; i < params.size(); ++i) {
    d.weights.emplace_back(names[i], params[i].detach());
    if (hooks.moments) {
      const auto m = hooks.moments(i);
      if (m.exp_avg.defined()) d.optimizer_state.emplace_back("exp_avg/" + names[i], m.exp_avg);
      if (m.exp_avg_sq.defined()) d.optimizer_state.emplace_back("exp_avg_sq/" + names[i], m.exp_avg_sq);
      if (m.momentum_buffer.defined()) d.optimizer_state.emplace_back("momentum_buffer/" + names[i], m.momentum_buffer);
      if (m.step > 0) d.optimizer_metadata["step/" + names[i]] = std::to_string(m.step);
    }
    if (params[i].grad().defined()) d.gradients.emplace_back(names[i], params[i].grad());
  }
  SnapshotEvidence ev = evidence_ ? evidence_(out) : SnapshotEvidence{};
  d.inputs = ev.inputs;
  d.targets = ev.targets;
  d.sample_index = ev.sample_index;
  d.positions = ev.positions;
  d.segments = ev.segments;
  int64_t bytes = d.estimated_bytes();
  if (!budget_.allow(out.step, force, bytes, &result.skipped)) {
    // The model does not fit the budget (a 7B model's weights, gradients and moments are
    // over 100 GB): when the loop can name where its state came from, the snapshot keeps
    // that reference and the batch instead, and replay re-executes the run to this step.
    nlohmann::json reference = reference_ ? reference_(out.step) : nlohmann::json();
    if (reference.is_null()) return result;
    d.weights.clear(), d.optimizer_state.clear(), d.gradients.clear(), d.optimizer_metadata.clear();
    d.write_model = nullptr;
    std::string reason;  // the skip stays reported as the full snapshot's
    if (!budget_.allow(out.step, force, d.estimated_bytes(), &reason)) return result;
    reference["full_bytes"] = bytes;
    d.reference = std::move(reference);
    bytes = d.estimated_bytes();
    result.skipped.clear();
  }

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
      const double t = detector.layer_typical(k);
      return t > 0 ? out.stats.layer_norms[k] / t : out.stats.layer_norms[k];
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratio(a) > ratio(b); });
    order.resize(std::min<size_t>(3, order.size()));
    layer_ids = order;
  }

  DiagnosisInput in;
  in.step = out.step;
  in.unix_time = now;
  in.anomalies = out.verdict.anomalies;
  in.injected = out.injected;
  in.loss = out.loss;
  in.loss_mean = detector.loss_mean();
  in.loss_std = detector.loss_std();
  in.grad_norm = out.clip.grad_norm;
  in.clip_threshold = out.clip.threshold;
  in.grad_norm_factor = o.guard.grad_norm_factor;
  in.lr = out.lr;
  in.peak_lr = o.peak_lr;
  in.warmup_steps = o.warmup_steps;
  in.micro_losses = out.micro_losses;
  in.scaler_mode = guarded.scaler().mode();
  in.loss_scale = out.loss_scale;
  in.last_scale_growth = guarded.last_scale_growth();
  in.recent_grad_norms.assign(guarded.recent_grad_norms().begin(), guarded.recent_grad_norms().end());
  in.recent_step_seconds.assign(guarded.recent_step_seconds().begin(), guarded.recent_step_seconds().end());
  in.telemetry = ev.telemetry;
  const double beta1 = o.adam_betas[0], beta2 = o.adam_betas[1];
  for (size_t k : layer_ids) {
    std::vector<size_t> tensors;
    for (size_t i = 0; i < params.size(); ++i)
      if (groups.group_of[i] == static_cast<int64_t>(k)) tensors.push_back(i);
    in.layers.push_back(layer_evidence(hooks.moments, groups.names[k], params, tensors, beta1, beta2, o.adam_eps,
                                       out.stats.layer_norms[k], detector.layer_typical(k)));
  }
  const auto diagnosis = diagnose(in);
  const auto diagnosis_json = diagnosis.to_json(in);

  nlohmann::ordered_json layer_norms = nlohmann::ordered_json::object();
  for (size_t k = 0; k < groups.names.size(); ++k) layer_norms[groups.names[k]] = json_number(out.stats.layer_norms[k]);
  nlohmann::ordered_json anomalies = nlohmann::ordered_json::array();
  for (const auto& a : out.verdict.anomalies) anomalies.push_back(guard::to_event(out.step, a));
  nlohmann::ordered_json state = {{"step", out.step},
                                  {"time", diagnosis_json.at("time")},
                                  {"unix_time", now},
                                  {"kind", d.kind},
                                  {"anomalies", anomalies},
                                  {"injected", out.injected},
                                  {"loss", json_number(out.loss)},
                                  {"micro_losses", out.micro_losses},
                                  {"grad_norm", json_number(out.clip.grad_norm)},
                                  {"nonfinite", out.stats.nonfinite},
                                  {"clip_coef", json_number(out.clip.clip_coef)},
                                  {"clip_threshold", json_number(out.clip.threshold)},
                                  {"layer_grad_norms", layer_norms},
                                  {"lr", json_number(out.lr)},
                                  {"loss_scale", out.loss_scale},
                                  {"scaler_mode", name_of(guarded.scaler().mode())},
                                  {"amp_dtype", name_of(o.amp_dtype)}};
  for (const auto& [key, value] : ev.state.items()) state[key] = value;
  d.state_json = state.dump(2) + "\n";
  d.metrics_lines = std::move(ev.metrics_lines);
  for (const auto& s : ev.telemetry) d.telemetry_lines.push_back(telemetry::to_json(s).dump());
  d.config_yaml = std::move(ev.config_yaml);
  d.diagnosis_json = diagnosis_json.dump(2) + "\n";
  d.diagnosis_md = diagnosis.to_markdown(in, "Step " + std::to_string(out.step) + ": " + d.kind);
  try {
    result.dir = write_snapshot(run_dir_, d);
  } catch (const Error& e) {
    result.skipped = e.what();
    return result;
  }
  budget_.record(out.step, bytes);
  return result;
}

std::set<std::string> pinned_checkpoints(const std::string& run_dir) {
  std::set<std::string> pinned;
  std::error_code ec;
  for (stdfs::directory_iterator it(RunDir(run_dir).snapshots(), ec), end; !ec && it != end; it.increment(ec)) {
    const auto path = it->path() / "reference.json";
    if (!fs::exists(path.string())) continue;
    try {
      const auto j = nlohmann::json::parse(fs::read_file(path.string(), 1 << 16));
      const std::string c = j.value("checkpoint", std::string());
      if (!c.empty()) pinned.insert(stdfs::path(c).filename().string());
    } catch (const std::exception&) {
      // An unreadable reference pins nothing; replay names the file when it is used.
    }
  }
  return pinned;
}

}  // namespace gradguard::forensics
