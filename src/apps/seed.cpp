// Each setup runs as a child `gradguard train` (bench/child_process.h), so its peak RSS
// and CPU time are its own. The analysis reads only metrics.jsonl and config.yaml, so
// the table can be recomputed from the run directories.
#include "gradguard/apps/seed.h"

#include "gradguard/apps/child_process.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/stats.h"
#include "gradguard/apps/html_report.h"

namespace gradguard::seed {
namespace stdfs = std::filesystem;
namespace {

const std::vector<std::string> kSetups = {"baseline", "history", "static_warmup", "tuned", "gradguard"};
const std::vector<std::string> kTinyOverrides = {
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "data.seq_len=16",
    "batch.global_batch=64", "schedule.total_steps=40", "guard.inject.spike_steps=[10,22,34]", "eval.batches=2"};

std::string first_comment(const std::string& path) {
  std::istringstream in(fs::read_file(path));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("# ", 0) == 0) return line.substr(2);
  return "";
}

std::string fmt(double v, const char* f = "%.3f") {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

SetupResult analyse_run(const std::string& path, const std::vector<int64_t>& injected, int64_t warmup,
                        int64_t global_batch) {
  SetupResult r;
  r.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  std::map<int64_t, double> final_loss;  // the trajectory the run ended on (later lines win)
  double elapsed = 0;
  std::istringstream in(fs::read_file(path));
  for (std::string line; std::getline(in, line);) {
    const auto parsed = try_parse_json(line);
    if (!parsed || !parsed->is_object() || !parsed->contains("step") || !(*parsed)["step"].is_number_integer())
      continue;  // not a line of ours: a crash's half line, a hand edit
    const auto& j = *parsed;
    const int64_t step = j["step"].get<int64_t>();
    if (string_field(j, "event") == "rollback") ++r.rollbacks;
    if (j.contains("val_loss") && j["val_loss"].is_number()) r.final_val_loss = j["val_loss"];
    if (j.contains("event") || !j.contains("loss")) continue;
    ++r.steps;
    if (bool_field(j, "skipped")) ++r.skipped;
    if (j.contains("elapsed_s") && j["elapsed_s"].is_number()) elapsed = j["elapsed_s"].get<double>();
    final_loss[step] = j["loss"].is_number() ? j["loss"].get<double>() : std::numeric_limits<double>::quiet_NaN();
  }
  if (r.steps == 0) throw bad_input(path, "holds no step lines");
  r.samples_per_s = elapsed > 0 ? static_cast<double>(r.steps * global_batch) / elapsed : 0;

  std::vector<std::pair<int64_t, double>> curve;  // after warmup, injected steps left out
  for (const auto& [step, loss] : final_loss)
    if (step >= warmup && std::find(injected.begin(), injected.end(), step) == injected.end() && std::isfinite(loss))
      curve.emplace_back(step, loss);
  double lo = 0, hi = 0;
  for (size_t i = 0; i < curve.size(); ++i) {
    std::vector<double> window;
    for (size_t k = i >= 5 ? i - 5 : 0; k < std::min(curve.size(), i + 6); ++k) window.push_back(curve[k].second);
    const double resid = curve[i].second - median(window);
    lo = std::min(lo, resid);
    hi = std::max(hi, resid);
    if (i >= 3) {
      std::vector<double> prev;
      for (size_t k = i >= 10 ? i - 10 : 0; k < i; ++k) prev.push_back(curve[k].second);
      if (curve[i].second > 1.05 * median(prev)) ++r.spikes;
    }
  }
  r.fluctuation = hi - lo;
  double ema = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [step, loss] : final_loss) {
    if (std::find(injected.begin(), injected.end(), step) != injected.end() || !std::isfinite(loss)) continue;
    ema = std::isfinite(ema) ? 0.9 * ema + 0.1 * loss : loss;
    r.curve.emplace_back(step, ema);
  }
  r.final_loss = ema;
  return r;
}

SeedReport run_seed_bench(const SeedOptions& o, std::FILE* progress) {
  if (o.mode != "full" && o.mode != "tiny") throw bad_input("--mode", "'" + o.mode + "' is not valid (valid: full, tiny)");
  const std::string base = o.presets_dir + "/base.yaml";
  for (const auto& s : kSetups)
    if (!fs::exists(o.presets_dir + "/" + s + ".yaml"))
      throw bad_input(o.presets_dir, "preset " + s + ".yaml is missing (expected base.yaml and one file per setup)");
  if (!fs::exists(base)) throw bad_input(o.presets_dir, "base.yaml is missing");
  if (fs::exists(o.out_dir + "/seed.json") && !o.overwrite)
    throw bad_input(o.out_dir, "already holds bench results; --force overwrites them");
  stdfs::create_directories(o.out_dir);
  const std::string exe = o.executable.empty() ? self_executable() : o.executable;

  SeedReport report;
  report.mode = o.mode;
  report.command = "gradguard bench seed --mode " + o.mode + " --out " + o.out_dir;
  for (const auto& ov : o.overrides) report.command += " --set " + ov;
  for (const auto& name : kSetups) {
    const std::string preset = o.presets_dir + "/" + name + ".yaml";
    std::vector<std::string> overrides = yaml_overrides(preset);
    if (o.mode == "tiny") overrides.insert(overrides.end(), kTinyOverrides.begin(), kTinyOverrides.end());
    overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
    overrides.insert(overrides.end(), {"run.dir=" + o.out_dir, "run.name=" + name, "run.overwrite=true",
                                       "log.progress=none"});
    // Validate here so a bad override fails before any child runs, naming the key.
    const auto cfg = config::load_config(base, overrides);
    std::vector<std::string> args = {exe, "train", "--config", base};
    for (const auto& ov : overrides) args.insert(args.end(), {"--set", ov});
    if (progress) std::fprintf(progress, "bench seed [%s]: %s ...\n", o.mode.c_str(), name.c_str()), std::fflush(progress);
    const std::string log = o.out_dir + "/" + name + ".log";
    const ChildResult child = run_child(args, log);
    if (child.exit_code != 0 && child.exit_code != 3)
      throw runtime_error(log, "setup " + name + " failed with exit code " + std::to_string(child.exit_code) + ":\n" +
                                   tail_of(log, 8));
    auto r = analyse_run(RunDir(o.out_dir + "/" + name).metrics(), cfg.guard.inject.spike_steps,
                         cfg.schedule.warmup_steps, cfg.batch.global_batch);
    r.name = name;
    r.title = first_comment(preset);
    r.exit_code = child.exit_code;
    r.peak_rss_mb = child.peak_rss_mb;
    r.wall_s = child.wall_s;
    const int64_t threads = cfg.run.threads > 0 ? cfg.run.threads : static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN));
    r.cpu_util = child.cpu_s / (child.wall_s * static_cast<double>(threads));
    if (progress)
      std::fprintf(progress, "  %s: %lld steps in %.1f s, final loss %.4f%s\n", name.c_str(), (long long)r.steps,
                   child.wall_s, r.final_loss, child.exit_code == 3 ? " (halted by its guard)" : "");
    report.setups.push_back(std::move(r));
  }
  report.target_loss = std::numeric_limits<double>::infinity();
  for (const auto& r : report.setups)
    if (std::isfinite(r.final_loss)) report.target_loss = std::min(report.target_loss, 1.1 * r.final_loss);
  for (auto& r : report.setups)
    for (const auto& [step, smoothed] : r.curve)
      if (smoothed <= report.target_loss) {
        r.steps_to_target = step;
        break;
      }
  fs::write_file_atomic(o.out_dir + "/seed.md", report.markdown());
  // Each setup's report carries the table and links to the other setups' reports.
  report::HtmlReportOptions page;
  page.appendix_title = "gradguard bench seed: all setups";
  page.appendix_text = report.markdown();
  for (const auto& r : report.setups) page.appendix_links.emplace_back(r.name, "../" + r.name + "/report.html");
  for (const auto& r : report.setups) {
    try {
      report::write_html_report(o.out_dir + "/" + r.name, page);
    } catch (const std::exception& e) {  // the table is the result; a page that fails is a note
      if (progress) std::fprintf(progress, "warning: %s/report.html not written: %s\n", r.name.c_str(), e.what());
    }
  }
  fs::write_file_atomic(o.out_dir + "/seed.json", report.to_json().dump(2) + "\n");
  return report;
}

std::string SeedReport::markdown() const {
  std::ostringstream md;
  md << "| setup | loss fluctuation | samples/s | peak RSS MiB | spikes | skipped | rollbacks | steps to "
     << fmt(target_loss, "%.3f") << " | final val loss | CPU util |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : setups)
    md << "| " << r.name << (r.exit_code == 3 ? " (halted)" : "") << " | " << fmt(r.fluctuation) << " | "
       << fmt(r.samples_per_s, "%.1f") << " | " << fmt(r.peak_rss_mb, "%.0f") << " | " << r.spikes << " | "
       << r.skipped << " | " << r.rollbacks << " | " << (r.steps_to_target >= 0 ? std::to_string(r.steps_to_target) : "-")
       << " | " << fmt(r.final_val_loss, "%.4f") << " | " << fmt(100 * r.cpu_util, "%.0f%%") << " |\n";
  md << "\n";
  for (const auto& r : setups) md << "- **" << r.name << "**: " << r.title << "\n";
  return md.str();
}

nlohmann::ordered_json SeedReport::to_json() const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& r : setups)
    list.push_back({{"setup", r.name},
                    {"title", r.title},
                    {"exit_code", r.exit_code},
                    {"steps", r.steps},
                    {"loss_fluctuation", json_number(r.fluctuation)},
                    {"samples_per_s", json_number(r.samples_per_s)},
                    {"peak_rss_mb", json_number(r.peak_rss_mb)},
                    {"spikes", r.spikes},
                    {"skipped", r.skipped},
                    {"rollbacks", r.rollbacks},
                    {"steps_to_target", r.steps_to_target},
                    {"final_loss", json_number(r.final_loss)},
                    {"final_val_loss", json_number(r.final_val_loss)},
                    {"cpu_util", json_number(r.cpu_util)},
                    {"wall_s", r.wall_s}});
  return {{"mode", mode}, {"command", command}, {"target_loss", json_number(target_loss)}, {"setups", list}};
}

}  // namespace gradguard::seed
