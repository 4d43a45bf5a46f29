// The tuning procedure of tune.h. Probes run one after another as child processes (a
// probe that diverges or crashes is evidence, not a failure of the command), and each is
// judged only from its metrics.jsonl, so the tables can be recomputed from probes/.
#include "gradguard/apps/tune.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/apps/child_process.h"
#include "gradguard/apps/plan.h"
#include "gradguard/apps/seed.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_number.h"

namespace gradguard::tune {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string num(double v, const char* f = "%.4g") {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

bool ascending(const std::vector<double>& v) { return std::is_sorted(v.begin(), v.end()); }

// The first stable probe (candidates are ordered safest first) whose loss is within
// `tolerance` of the best stable one; -1 when none is stable.
int choose(const std::vector<Probe>& probes, const std::vector<size_t>& idx, double tolerance) {
  double best = std::numeric_limits<double>::infinity();
  for (size_t i : idx)
    if (probes[i].stable) best = std::min(best, probes[i].final_loss);
  if (!std::isfinite(best)) return -1;
  for (size_t i : idx)
    if (probes[i].stable && probes[i].final_loss <= best + tolerance * std::abs(best)) return static_cast<int>(i);
  return -1;
}

}  // namespace

void TuneOptions::validate() const {
  if (probe_steps < 4) throw bad_input("--steps", "must be at least 4, got " + std::to_string(probe_steps));
  if (start_batch < 0) throw bad_input("--start-batch", "must be >= 0, got " + std::to_string(start_batch));
  if (max_batch < 0) throw bad_input("--max-batch", "must be >= 0, got " + std::to_string(max_batch));
  if (!(growth >= 2) || growth != std::floor(growth))
    throw bad_input("--growth", "must be an integer >= 2, got " + format_number(growth));
  if (clip_values.empty() || !ascending(clip_values) || clip_values.front() <= 0)
    throw bad_input("--clip", "needs positive values in ascending order (the safest, lowest first)");
  if (warmup_fractions.empty() || !std::is_sorted(warmup_fractions.rbegin(), warmup_fractions.rend()) ||
      warmup_fractions.back() < 0 || warmup_fractions.front() >= 1)
    throw bad_input("--warmup", "needs fractions in [0, 1) in descending order (the safest, longest first)");
  if (lr_scales.empty() || !ascending(lr_scales) || lr_scales.front() <= 0)
    throw bad_input("--lr-scale", "needs positive values in ascending order (the safest, lowest first)");
  if (!(tolerance >= 0)) throw bad_input("--tolerance", "must be >= 0, got " + format_number(tolerance));
  if (!(noise_ratio >= 0)) throw bad_input("--noise-ratio", "must be >= 0, got " + format_number(noise_ratio));
  if (!device.empty()) plan::find_device(device);
  if (!(memory_gb >= 0)) throw bad_input("--memory", "must be >= 0 GB, got " + format_number(memory_gb));
  if (gpus < 1) throw bad_input("--gpus", "must be at least 1, got " + std::to_string(gpus));
}

std::string memory_decision(const config::Config& recommended, const TuneOptions& o,
                            std::vector<std::string>* recommendation) {
  auto in = plan::PlanInputs::from_config(recommended, o.gpus);
  const auto gib = [](double b) { return num(b / (1024.0 * 1024.0 * 1024.0), "%.2f") + " GiB"; };
  if (o.device.empty() && o.memory_gb == 0) {
    in.ranks = 1;
    in.for_this_cpu();
    return "memory: the recommended run needs about " + gib(plan::estimate(in).total) +
           " per process on this CPU (`gradguard plan` breaks it down; --device or --memory fits it to a GPU)";
  }
  const plan::Device d = plan::device_for(o.device, o.memory_gb);
  const std::string where = std::to_string(o.gpus) + " x " + d.name + " (" + num(d.memory_gb, "%.0f") + " GB)";
  if (in.global_batch % o.gpus != 0)
    return "memory: the recommended global batch " + std::to_string(in.global_batch) + " does not divide over " +
           std::to_string(o.gpus) + " GPUs; pick a batch that does before fitting a micro-batch";
  const auto s = plan::suggest(in, d.memory_gb * 1e9);
  if (!s.fits)
    return "memory: no micro-batch of the recommended run fits " + where + " (at least " + gib(s.estimate.total) +
           " per GPU); `gradguard plan` compares memory layouts that may";
  recommendation->push_back("batch.micro_batch=" + std::to_string(s.micro_batch));
  if (s.checkpointing && !recommended.model.activation_checkpointing)
    recommendation->push_back("model.activation_checkpointing=true");
  return "memory: on " + where + " micro-batch " + std::to_string(s.micro_batch) + " x accumulation " +
         std::to_string(s.accum_steps) + (s.checkpointing ? " with" : " without") +
         " activation checkpointing fits (" + gib(s.estimate.total) + " per GPU by the estimate)";
}

void analyse_probe(const std::string& metrics_path, Probe* p) {
  const auto base = seed::analyse_run(metrics_path, {}, 0, std::max<int64_t>(p->global_batch, 1));
  p->steps = base.steps;
  p->skipped = base.skipped;
  p->rollbacks = base.rollbacks;
  p->spikes = base.spikes;
  p->fluctuation = base.fluctuation;
  p->samples_per_s = base.samples_per_s;
  p->final_loss = base.final_loss;
  int64_t clipped = 0, step_lines = 0;
  bool last_finite = true;
  std::vector<double> noise;
  std::istringstream in(fs::read_file(metrics_path));
  for (std::string line; std::getline(in, line);) {
    const auto parsed = try_parse_json(line);
    if (!parsed || !parsed->is_object()) continue;
    const auto& j = *parsed;
    if (string_field(j, "event") == "anomaly" && string_field(j, "severity") == "critical") ++p->critical;
    if (j.contains("event") || !j.contains("loss")) continue;
    ++step_lines;
    last_finite = j["loss"].is_number() && std::isfinite(j["loss"].get<double>());
    if (j.contains("clip_coef") && j["clip_coef"].is_number() && j["clip_coef"].get<double>() < 1) ++clipped;
    if (j.contains("noise_scale") && j["noise_scale"].is_number()) noise.push_back(j["noise_scale"].get<double>());
  }
  p->clip_fraction = step_lines ? static_cast<double>(clipped) / static_cast<double>(step_lines) : 0;
  if (!noise.empty()) {
    std::nth_element(noise.begin(), noise.begin() + noise.size() / 2, noise.end());
    p->noise_scale = noise[noise.size() / 2];
  } else {
    p->noise_scale = kNaN;
  }
  if (!last_finite) p->final_loss = kNaN;
  std::string why;
  if (p->exit_code == 3) why = "halted by its guard";
  else if (p->exit_code != 0) why = "exited with code " + std::to_string(p->exit_code);
  else if (!std::isfinite(p->final_loss)) why = "loss ended non-finite";
  else if (p->skipped > 0) why = std::to_string(p->skipped) + " skipped step(s)";
  else if (p->rollbacks > 0) why = std::to_string(p->rollbacks) + " rollback(s)";
  else if (p->critical > 0) why = std::to_string(p->critical) + " critical anomal" + (p->critical == 1 ? "y" : "ies");
  p->stable = why.empty();
  p->verdict = p->stable ? "stable" : why;
}

TuneResult run_tune(const TuneOptions& o, std::FILE* progress) {
  o.validate();
  const config::Config base = config::load_config(o.config_path, o.overrides);
  if (fs::exists(o.out_dir + "/tune.json") && !o.overwrite)
    throw bad_input(o.out_dir, "already holds tuning results; --force overwrites them");
  for (const char* f : {"tune.md", "tune.json", "tune.yaml"})  // no stale result survives a --force run
    std::filesystem::remove(o.out_dir + "/" + f);
  std::filesystem::create_directories(o.out_dir + "/probes");
  const std::string exe = o.executable.empty() ? seed::self_executable() : o.executable;

  const int64_t micro = base.batch.micro_batch;
  const auto round_batch = [&](int64_t b) { return std::max(micro, b / micro * micro); };
  const int64_t start = o.start_batch > 0 ? o.start_batch : round_batch(base.batch.global_batch / 4);
  const int64_t max_batch = o.max_batch > 0 ? o.max_batch : 2 * base.batch.global_batch;
  const double base_lr = base.optim.lr;
  const bool needs_strategy = base.clip.strategy == grad::ClipStrategy::kNone;

  // Settings every probe shares: short, quiet, no evaluation or periodic checkpoints.
  std::vector<std::string> common = o.overrides;
  common.insert(common.end(), {"schedule.epochs=0", "schedule.total_steps=" + std::to_string(o.probe_steps),
                               "schedule.warmup_ratio=0", "eval.every=0",
                               "checkpoint.every=0", "log.progress=none", "log.report=false",
                               "log.tensorboard=false", "run.overwrite=true", "run.dir=" + o.out_dir + "/probes",
                               "optim.lr_scaling=none"});  // tune sets optim.lr itself
  if (needs_strategy) common.push_back("clip.strategy=global");

  TuneResult result;
  auto warmup_steps = [&](double fraction, int64_t total) {
    return std::to_string(static_cast<int64_t>(std::llround(fraction * static_cast<double>(total))));
  };
  auto run_probe = [&](const std::string& phase, const std::vector<std::string>& settings, int64_t batch) {
    Probe p;
    p.phase = phase;
    p.name = phase + "-" + std::to_string(result.probes.size());
    p.settings = settings;
    p.global_batch = batch;
    std::vector<std::string> overrides = common;
    overrides.insert(overrides.end(), settings.begin(), settings.end());
    overrides.insert(overrides.end(), {"batch.global_batch=" + std::to_string(batch), "run.name=" + p.name});
    config::load_config(o.config_path, overrides);  // a rejected setting names its key here
    std::vector<std::string> args = {exe, "train"};
    if (!o.config_path.empty()) args.insert(args.end(), {"--config", o.config_path});
    for (const auto& ov : overrides) args.insert(args.end(), {"--set", ov});
    std::string shown;
    for (const auto& s : settings) shown += (shown.empty() ? "" : " ") + s;
    if (progress)
      std::fprintf(progress, "tune [%s] batch %lld %s ...", phase.c_str(), (long long)batch, shown.c_str()),
          std::fflush(progress);
    const std::string log = o.out_dir + "/probes/" + p.name + ".log";
    const auto child = seed::run_child(args, log);
    p.exit_code = child.exit_code;
    p.wall_s = child.wall_s;
    const std::string metrics = RunDir(o.out_dir + "/probes/" + p.name).metrics();
    if (child.exit_code == 2)  // the trainer rejected the input: not evidence, a mistake
      throw bad_input(log, "probe " + p.name + " was rejected:\n" + seed::tail_of(log, 6));
    try {
      analyse_probe(metrics, &p);
    } catch (const Error&) {  // no metrics, or no step completed (e.g. out of memory at step 0)
      p.final_loss = kNaN;
      p.stable = false;
      p.verdict = "exited with code " + std::to_string(child.exit_code) + " before completing a step";
    }
    if (progress)
      std::fprintf(progress, " loss %s, clipped %.0f%%, %s (%.1f s)\n", num(p.final_loss).c_str(),
                   100 * p.clip_fraction, p.verdict.c_str(), p.wall_s), std::fflush(progress);
    result.probes.push_back(p);
    return result.probes.size() - 1;
  };

  // Each phase fixes one knob, then the next phase starts from it.
  double clip = base.clip.max_norm;
  double warmup = static_cast<double>(base.schedule.warmup_steps) / static_cast<double>(base.schedule.total_steps);
  double lr_scale = 1;
  const auto sweep = [&](const std::string& phase, const std::vector<double>& values, double* chosen,
                         const std::function<std::vector<std::string>(double)>& settings, const std::string& what) {
    std::vector<size_t> idx;   // [candidate] probe index
    std::vector<double> tried; // [candidate] value
    std::vector<std::vector<std::string>> seen;
    for (double v : values) {
      const auto set = settings(v);
      if (std::find(seen.begin(), seen.end(), set) != seen.end()) continue;  // e.g. warmups rounding alike
      seen.push_back(set);
      idx.push_back(run_probe(phase, set, start));
      tried.push_back(v);
    }
    const int pick = choose(result.probes, idx, o.tolerance);
    if (pick < 0) {
      result.decisions.push_back(phase + ": no stable probe; kept " + what + " " + num(*chosen));
      return;
    }
    const double before = *chosen;
    const size_t k = std::find(idx.begin(), idx.end(), static_cast<size_t>(pick)) - idx.begin();
    *chosen = tried[k];
    const std::string edge = idx.size() > 1 && k + 1 == idx.size()
                                 ? "; the boldest value tried: the sweep may end too early, extend it"
                                 : "";
    double best = std::numeric_limits<double>::infinity();
    for (size_t i : idx)
      if (result.probes[i].stable) best = std::min(best, result.probes[i].final_loss);
    result.decisions.push_back(phase + ": " + what + " " + num(*chosen) + " (was " + num(before) + "): the safest stable probe within " +
                               num(100 * o.tolerance) + "% of the best loss " + num(best) + " (its loss " +
                               num(result.probes[pick].final_loss) + ")" + edge);
  };
  const auto clip_s = [&](double c) { return "clip.max_norm=" + num(c, "%.6g"); };
  const auto warm_s = [&](double w) { return "schedule.warmup_steps=" + warmup_steps(w, o.probe_steps); };
  const auto lr_s = [&](double s) { return "optim.lr=" + num(base_lr * s, "%.6g"); };
  sweep("clip", o.clip_values, &clip, [&](double c) { return std::vector<std::string>{clip_s(c), warm_s(warmup)}; },
        "clip.max_norm");
  sweep("warmup", o.warmup_fractions, &warmup,
        [&](double w) { return std::vector<std::string>{clip_s(clip), warm_s(w)}; }, "warmup fraction");
  sweep("lr", o.lr_scales, &lr_scale,
        [&](double s) { return std::vector<std::string>{clip_s(clip), warm_s(warmup), lr_s(s)}; }, "lr scale");

  // Grow the batch while the gradients behave.
  int64_t batch = start;
  double batch_loss = kNaN;
  for (const auto& p : result.probes)
    if (p.phase == "lr" && p.stable && p.settings.back() == lr_s(lr_scale)) batch_loss = p.final_loss;
  for (int64_t next = round_batch(batch * static_cast<int64_t>(o.growth)); next <= max_batch && next > batch;
       next = round_batch(batch * static_cast<int64_t>(o.growth))) {
    const double scale = lr_scale * std::sqrt(static_cast<double>(next) / static_cast<double>(start));
    const size_t i = run_probe("batch", {clip_s(clip), warm_s(warmup), lr_s(scale)}, next);
    const Probe& p = result.probes[i];
    std::string stop;
    if (!p.stable) stop = "unstable (" + p.verdict + ")";
    else if (o.noise_ratio > 0 && std::isfinite(p.noise_scale) && next > o.noise_ratio * p.noise_scale)
      stop = "batch " + std::to_string(next) + " is over " + num(o.noise_ratio) + "x the gradient noise scale B_simple ~ " +
             num(p.noise_scale) + " sequences: more batch buys little";
    else if (std::isfinite(batch_loss) && p.final_loss > batch_loss + o.tolerance * std::abs(batch_loss))
      stop = "loss " + num(p.final_loss) + " is worse than " + num(batch_loss) + " at the smaller batch";
    if (!stop.empty()) {
      result.decisions.push_back("batch: stopped growing at " + std::to_string(batch) + " (" + std::to_string(next) +
                                 ": " + stop + ")");
      break;
    }
    batch = next;
    batch_loss = p.final_loss;
    result.decisions.push_back("batch: " + std::to_string(next) + " accepted (loss " + num(p.final_loss) +
                               ", clipped " + num(100 * p.clip_fraction, "%.0f") + "% of steps, B_simple ~ " +
                               num(p.noise_scale) + ")");
  }

  const double final_lr = base_lr * lr_scale * std::sqrt(static_cast<double>(batch) / static_cast<double>(start));
  // A fine-tune's first full-size Adam updates jump the loss whatever the probes saw in
  // their few steps (bench natural, docs/natural.md): its warmup has a floor.
  std::string warm = warmup_steps(warmup, base.schedule.total_steps);
  const int64_t warm_floor = std::min(config::kFinetuneWarmupSteps, base.schedule.total_steps);
  if (!base.model.init_from.empty() && std::stoll(warm) < warm_floor) {
    result.decisions.push_back("warmup: " + warm + " steps raised to " + std::to_string(warm_floor) +
                               ": fine-tuning (model.init_from) with less, Adam's first full-size updates can throw "
                               "the trained model out of its basin (bench natural, docs/natural.md)");
    warm = std::to_string(warm_floor);
  }
  // With schedule.epochs the run's length comes from the data: the warmup stays a share
  // of it. Otherwise it is a step count, and a ratio the config may hold is switched off.
  const std::vector<std::string> warmup_keys =
      base.schedule.epochs > 0 ? std::vector<std::string>{"schedule.warmup_ratio=" + num(warmup, "%.6g")}
                               : std::vector<std::string>{"schedule.warmup_ratio=0", "schedule.warmup_steps=" + warm};
  result.recommendation = {"clip.max_norm=" + num(clip, "%.6g")};
  result.recommendation.insert(result.recommendation.end(), warmup_keys.begin(), warmup_keys.end());
  result.recommendation.insert(result.recommendation.end(), {"optim.lr=" + num(final_lr, "%.6g"), "optim.lr_scaling=none",
                                                             "batch.global_batch=" + std::to_string(batch)});
  if (needs_strategy) result.recommendation.insert(result.recommendation.begin(), "clip.strategy=global");
  std::vector<std::string> all = o.overrides;
  all.insert(all.end(), result.recommendation.begin(), result.recommendation.end());
  result.decisions.push_back(memory_decision(config::load_config(o.config_path, all), o, &result.recommendation));
  all = o.overrides;
  all.insert(all.end(), result.recommendation.begin(), result.recommendation.end());
  std::ostringstream yaml;
  yaml << "# Recommended by `gradguard tune` (" << result.probes.size() << " probes of " << o.probe_steps
       << " steps; evidence in tune.md).\n# Changed from the base config:";
  for (const auto& r : result.recommendation) yaml << " " << r;
  yaml << "\n" << config::to_yaml(config::load_config(o.config_path, all));
  result.yaml = yaml.str();

  fs::write_file_atomic(o.out_dir + "/tune.md", result.markdown());
  fs::write_file_atomic(o.out_dir + "/tune.json", result.to_json().dump(2) + "\n");
  const bool any_stable = std::any_of(result.probes.begin(), result.probes.end(), [](const Probe& p) { return p.stable; });
  if (!any_stable)
    throw runtime_error(o.out_dir + "/tune.md",
                        "no probe was stable: lower optim.lr or the start batch and tune again (evidence written)");
  fs::write_file_atomic(o.out_dir + "/tune.yaml", result.yaml);
  return result;
}

std::string TuneResult::markdown() const {
  std::ostringstream md;
  md << "# gradguard tune\n\n| probe | phase | settings | batch | final loss | fluctuation | clipped | B_simple | "
        "skipped | critical | rollbacks | samples/s | verdict |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& p : probes) {
    std::string s;
    for (const auto& x : p.settings) s += (s.empty() ? "" : " ") + x;
    md << "| " << p.name << " | " << p.phase << " | " << s << " | " << p.global_batch << " | " << num(p.final_loss)
       << " | " << num(p.fluctuation) << " | " << num(100 * p.clip_fraction, "%.0f") << "% | " << num(p.noise_scale)
       << " | " << p.skipped << " | " << p.critical << " | " << p.rollbacks << " | " << num(p.samples_per_s, "%.1f")
       << " | " << p.verdict << " |\n";
  }
  md << "\n## Decisions\n\n";
  for (const auto& d : decisions) md << "- " << d << "\n";
  md << "\n## Recommendation (tune.yaml)\n\n```\n";
  for (const auto& r : recommendation) md << r << "\n";
  md << "```\n\nfinal loss: EMA(0.9) of the training loss over the probe; fluctuation: max - min of the loss around "
        "its 11-step rolling median; clipped: steps whose clip coefficient was < 1; B_simple: median gradient noise "
        "scale (sequences).\n";
  return md.str();
}

nlohmann::ordered_json TuneResult::to_json() const {
  nlohmann::ordered_json j;
  j["probes"] = nlohmann::ordered_json::array();
  for (const auto& p : probes)
    j["probes"].push_back({{"name", p.name},
                           {"phase", p.phase},
                           {"settings", p.settings},
                           {"global_batch", p.global_batch},
                           {"exit_code", p.exit_code},
                           {"steps", p.steps},
                           {"final_loss", json_number(p.final_loss)},
                           {"fluctuation", json_number(p.fluctuation)},
                           {"clip_fraction", json_number(p.clip_fraction)},
                           {"noise_scale", json_number(p.noise_scale)},
                           {"skipped", p.skipped},
                           {"critical_anomalies", p.critical},
                           {"rollbacks", p.rollbacks},
                           {"spikes", p.spikes},
                           {"samples_per_s", json_number(p.samples_per_s)},
                           {"wall_s", json_number(p.wall_s)},
                           {"stable", p.stable},
                           {"verdict", p.verdict}});
  j["decisions"] = decisions;
  j["recommendation"] = recommendation;
  return j;
}

}  // namespace gradguard::tune
