// JSON-lines metrics. Non-finite numbers (a diverged loss) are written as null, since
// JSON has no NaN or Infinity, and readers must not choke on a line. With TensorBoard on,
// each line's scalars follow into the event file right after the line itself, so the
// two never disagree about what was recorded.
#include "gradguard/train/metrics.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_number.h"
#include "gradguard/telemetry/tensorboard.h"

namespace gradguard::train {

MetricsWriter::MetricsWriter(const std::string& path, size_t keep_recent, bool tensorboard)
    : path_(path), keep_recent_(keep_recent) {
  if (path.empty()) return;  // discard: ranks other than 0 of a distributed run
  const auto dir = std::filesystem::path(path).parent_path();
  std::filesystem::create_directories(dir);
  // The event writer first: if it throws, no FILE* is open yet to leak.
  if (tensorboard) events_ = std::make_unique<telemetry::EventWriter>(dir.empty() ? "." : dir.string());
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) throw runtime_error(path, std::string("cannot open for appending: ") + std::strerror(errno));
}

std::string MetricsWriter::events_path() const { return events_ ? events_->path() : ""; }

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}  // events_ flushes and closes itself

void MetricsWriter::write(const nlohmann::ordered_json& line) {
  std::string text = line.dump();
  if (keep_recent_ > 0) {
    recent_.push_back(text);
    while (recent_.size() > keep_recent_) recent_.pop_front();
  }
  if (file_ == nullptr) return;
  text += "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    throw runtime_error(path_, std::string("write failed: ") + std::strerror(errno));
  if (events_) {
    // Telemetry carries its own sampling time; everything else happens now.
    const auto t = line.find("unix_time");
    const double wall = t != line.end() && t->is_number()
                            ? t->get<double>()
                            : std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    events_->add_metrics_line(line, wall);
  }
}

void MetricsWriter::write_step(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = json_number(m.loss);
  j["lr"] = m.lr;
  j["grad_norm"] = json_number(m.grad_norm);
  j["clip_coef"] = json_number(m.clip_coef);
  j["clip_threshold"] = json_number(m.clip_threshold);
  j["loss_scale"] = m.loss_scale;
  j["skipped"] = m.skipped;
  j["tokens"] = m.tokens;
  j["tokens_per_s"] = json_number(m.tokens_per_s);
  j["elapsed_s"] = m.elapsed_s;
  if (std::isfinite(m.noise_scale)) j["noise_scale"] = m.noise_scale;
  if (!std::isnan(m.z_loss)) j["z_loss"] = json_number(m.z_loss);
  if (!m.compute_dtype.empty()) j["compute_dtype"] = m.compute_dtype;
  if (!m.layer_grad_norms.empty()) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::object();
    for (const auto& [name, norm] : m.layer_grad_norms) layers[name] = json_number(norm);
    j["layer_grad_norms"] = layers;
  }
  if (m.forecast.ready) {
    j["grad_norm_forecast"] = {{"expected", json_number(m.forecast.expected)},
                               {"low", json_number(m.forecast.low)},
                               {"high", json_number(m.forecast.high)}};
    j["forecast_breach"] = m.forecast.breach;
  }
  if (!m.forecast_layers.empty()) j["forecast_breach_layers"] = m.forecast_layers;
  write(j);
}

StepMetrics step_metrics(const guard::StepOutcome& o, const std::vector<std::string>& layer_names) {
  StepMetrics m;
  m.step = o.step;
  m.loss = o.loss;
  m.lr = o.lr;
  m.grad_norm = o.clip.grad_norm;
  m.clip_coef = o.clip.clip_coef;
  m.clip_threshold = o.clip.threshold;
  m.loss_scale = o.loss_scale;
  m.skipped = !o.applied;
  m.noise_scale = o.noise_scale;
  m.z_loss = o.z_loss;
  for (size_t k = 0; k < o.stats.layer_norms.size() && k < layer_names.size(); ++k)
    m.layer_grad_norms.emplace_back(layer_names[k], o.stats.layer_norms[k]);
  m.forecast = o.verdict.forecast;
  m.forecast_layers = o.verdict.forecast_layers;
  return m;
}

int64_t MetricsWriter::write_events(const guard::StepOutcome& o, int64_t global_batch) {
  const int64_t step = o.step;
  if (o.noise_warning)
    write(nlohmann::ordered_json{{"step", step}, {"event", "warning"}, {"kind", "noise_scale"},
                                 {"noise_scale", o.noise_scale}, {"global_batch", global_batch}});
  if (o.scaler.skipped)
    write(nlohmann::ordered_json{{"step", step}, {"event", "skip"}, {"reason", "nonfinite_gradients"},
                                 {"loss_scale", o.loss_scale}, {"next_loss_scale", o.scaler.next_scale}});
  if (o.skip_rule.skip)
    write(nlohmann::ordered_json{{"step", step},
                                 {"event", "skip"},
                                 {"reason", "skip_rule"},
                                 {"loss", json_number(o.loss)},
                                 {"loss_limit", json_number(o.skip_rule.loss_limit)},
                                 {"grad_norm", json_number(o.clip.grad_norm)},
                                 {"grad_norm_limit", json_number(o.skip_rule.grad_norm_limit)}});
  for (const auto& a : o.verdict.anomalies) write(guard::to_event(step, a));
  if (o.recovery) {
    const auto& r = *o.recovery;
    const auto* primary = o.verdict.primary();
    nlohmann::ordered_json event = {{"step", step},
                                    {"event", "recovery"},
                                    {"action", name_of(r.action)},
                                    {"rung", r.rung},
                                    {"budget_left", r.budget_left},
                                    {"anomaly", primary ? name_of(primary->kind) : ""}};
    event["snapshot"] = o.snapshot.dir.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.snapshot.dir);
    if (o.snapshot.dir.empty() && !o.snapshot.skipped.empty()) event["snapshot_skipped"] = o.snapshot.skipped;
    if (!r.note.empty()) event["note"] = r.note;
    if (r.action == guard::RecoveryAction::kResetMoments) event["tensors_reset"] = o.tensors_reset;
    write(event);
  }
  return static_cast<int64_t>(o.verdict.anomalies.size());
}

void MetricsWriter::write_telemetry(int64_t step, const telemetry::Sample& sample, int64_t rank) {
  write_telemetry(step, telemetry::to_json(sample), rank);
}

void MetricsWriter::write_telemetry(int64_t step, const nlohmann::ordered_json& fields, int64_t rank) {
  nlohmann::ordered_json j = {{"step", step}, {"event", "telemetry"}};
  if (rank >= 0) j["rank"] = rank;
  for (auto& [key, value] : fields.items()) j[key] = value;
  write(j);
}

void MetricsWriter::write_validation(int64_t step, double val_loss) {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["val_loss"] = json_number(val_loss);
  write(j);
}

}  // namespace gradguard::train
