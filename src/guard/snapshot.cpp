// Snapshot writing: everything goes into snapshots/.tmp-<name> first and is renamed
// when complete, like checkpoints.
#include "gradguard/guard/snapshot.h"

#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

namespace gradguard::guard {
namespace stdfs = std::filesystem;

int64_t SnapshotData::estimated_bytes() const {
  int64_t bytes = 0;
  if (model)
    for (const auto& p : model->parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  for (const auto& [name, t] : optimizer_state) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& [name, t] : gradients) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto* t : {&inputs, &targets, &sample_index})
    if (t->defined()) bytes += t->numel() * 8;
  return bytes;
}

std::string write_snapshot(const std::string& run_dir, const SnapshotData& d) {
  TORCH_INTERNAL_ASSERT(d.model != nullptr);
  char name[96];
  std::snprintf(name, sizeof name, "step-%07lld-%s", static_cast<long long>(d.step), d.kind.c_str());
  const stdfs::path root = stdfs::path(run_dir) / "snapshots";
  const stdfs::path final_dir = root / name;
  const stdfs::path tmp = root / (std::string(".tmp-") + name);
  try {
    stdfs::remove_all(tmp);
    stdfs::create_directories(tmp);
    checkpoint::save_hf_model((tmp / "model").string(), *d.model);
    checkpoint::save_safetensors((tmp / "optimizer.safetensors").string(), d.optimizer_state, d.optimizer_metadata);
    checkpoint::save_safetensors((tmp / "gradients.safetensors").string(), d.gradients);
    checkpoint::save_safetensors((tmp / "batch.safetensors").string(),
                                 {{"inputs", d.inputs}, {"targets", d.targets}, {"sample_index", d.sample_index}});
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
  } catch (const stdfs::filesystem_error& e) {
    std::error_code ignored;
    stdfs::remove_all(tmp, ignored);
    throw runtime_error(final_dir.string(), std::string("cannot write the snapshot: ") + e.what());
  } catch (...) {
    std::error_code ignored;
    stdfs::remove_all(tmp, ignored);
    throw;
  }
  return final_dir.string();
}

SnapshotBudget::SnapshotBudget(const SnapshotOptions& options) : options_(options) { options_.validate(); }

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

void SnapshotBudget::load_state_dict(const nlohmann::json& s) {
  try {
    count_ = s.at("count").get<int64_t>();
    bytes_ = s.at("bytes").get<int64_t>();
    last_step_ = s.at("last_step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("trainer_state.json: guard.snapshots", std::string("malformed: ") + e.what());
  }
}

}  // namespace gradguard::guard
