// The reading half of `bench natural` (apps/natural.h): one run's metrics from its
// metrics.jsonl, the per-setup summaries over the learning-rate sweep, and the three
// outputs (natural.md, natural.json, natural.html). Nothing here runs a model, so a table
// is recomputed from the run directories alone.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/apps/natural.h"
#include "report_assets.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/stats.h"

namespace gradguard::natural {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kExcursionSteps = 20;  // the window of the peak excursion
constexpr int64_t kFinalSteps = 5;       // the steps the final train loss averages
constexpr int64_t kCurveSteps = 30;      // the steps of each curve kept for the page

std::string fmt(double v, const char* f = "%.3f") {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A diverged run's final counts as +inf: every comparison treats it as worst.
double final_or_inf(const Run& r) {
  if (r.failed || !std::isfinite(r.m.final_val)) return kInf;
  return r.m.final_val;
}

struct Spread {
  double mean = kNaN, lo = kNaN, hi = kNaN;
};
Spread spread(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return s;
}
std::string fmt_spread(const Spread& s, const char* f = "%.3f") {
  if (std::isnan(s.mean)) return "-";
  if (s.lo == s.hi) return fmt(s.mean, f);
  return fmt(s.mean, f) + " (" + fmt(s.lo, f) + "–" + fmt(s.hi, f) + ")";
}

}  // namespace

std::string lr_label(double lr) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0e", lr);
  return b;
}

RunMetrics analyse_run(const std::string& path) {
  RunMetrics m;
  std::map<int64_t, double> loss;  // the trajectory the run ended on (a rollback's repeats win)
  double first_val = kNaN, last_val = kNaN;
  bool nonfinite = false;
  std::istringstream in(fs::read_file(path));
  for (std::string line; std::getline(in, line);) {
    const auto parsed = try_parse_json(line);
    if (!parsed || !parsed->is_object() || !parsed->contains("step") || !(*parsed)["step"].is_number_integer())
      continue;
    const auto& j = *parsed;
    if (j.contains("event")) continue;
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("val_loss")) {
      const double v = j["val_loss"].is_number() ? j["val_loss"].get<double>() : kInf;  // null: non-finite
      if (std::isnan(first_val)) first_val = v;
      last_val = v;
      continue;
    }
    if (!j.contains("loss")) continue;
    ++m.steps;
    if (j.contains("grad_norm_forecast")) ++m.judged;
    if (j.contains("forecast_breach") && j["forecast_breach"] == 1) {
      ++m.breaches;
      if (m.first_breach < 0 || step < m.first_breach) m.first_breach = step;
    }
    if (bool_field(j, "skipped")) ++m.skipped;
    const double l = j["loss"].is_number() ? j["loss"].get<double>() : kInf;
    if (!std::isfinite(l)) nonfinite = true;
    loss[step] = l;
  }
  if (loss.empty()) throw bad_input(path, "holds no step lines");
  m.initial_loss = loss.begin()->second;
  m.initial_val = first_val;
  m.final_val = last_val;
  double peak = -kInf;
  for (const auto& [step, l] : loss) {
    if (step < kExcursionSteps) peak = std::max(peak, std::isfinite(l) ? l : kInf);
    if (step < kCurveSteps) m.curve.push_back(std::isfinite(l) ? l : kNaN);
    if (m.back_at < 0 && step >= 1 && l <= m.initial_loss) m.back_at = step;
    if (m.onset < 0 && step >= 1 && !(l <= m.initial_loss + kOnsetMargin)) m.onset = step;
  }
  m.excursion = peak - m.initial_loss;
  double sum = 0;
  int64_t n = 0;
  for (auto it = loss.rbegin(); it != loss.rend() && n < kFinalSteps; ++it, ++n) sum += it->second;
  m.final_loss = sum / static_cast<double>(n);
  // Diverged: a non-finite loss, or ending worse than it started. The validation losses
  // (the same held-out batches at both ends) decide when the run has both.
  const bool worse = std::isfinite(m.initial_val) && !std::isnan(m.final_val) ? m.final_val > m.initial_val
                                                                               : m.final_loss > m.initial_loss;
  m.diverged = nonfinite || !std::isfinite(m.final_loss) || (!std::isnan(m.final_val) && !std::isfinite(m.final_val)) ||
               worse;
  return m;
}

double lr_sensitivity(const std::vector<double>& finals, double initial) {
  if (finals.empty()) return kNaN;
  double best = kInf, sum = 0;
  for (double f : finals) {
    const double v = std::isfinite(f) ? f : kInf;
    best = std::min(best, v);
    sum += std::min(v, initial);
  }
  if (!std::isfinite(best)) return kNaN;  // nothing trained: no best to measure from
  return sum / static_cast<double>(finals.size()) - best;
}

std::pair<int64_t, int64_t> widest_range(const std::vector<double>& finals, double limit) {
  std::pair<int64_t, int64_t> best{-1, -1};
  int64_t start = -1;
  for (int64_t i = 0; i <= static_cast<int64_t>(finals.size()); ++i) {
    const bool ok = i < static_cast<int64_t>(finals.size()) && std::isfinite(finals[i]) && finals[i] <= limit;
    if (ok && start < 0) start = i;
    if (!ok && start >= 0) {
      if (best.first < 0 || i - 1 - start > best.second - best.first) best = {start, i - 1};
      start = -1;
    }
  }
  return best;
}

namespace {

// The seed's finals of one setup, in the order of `lrs` (inf where diverged or missing),
// and the loss it started from (Wortsman's l0).
std::vector<double> finals_of(const NaturalReport& r, const std::string& scenario, const std::string& setup,
                              int64_t seed, double* initial) {
  std::vector<double> f(r.lrs.size(), kInf);
  if (initial) *initial = kNaN;
  for (const auto& run : r.runs) {
    if (run.scenario != scenario || run.setup != setup || run.seed != seed) continue;
    const auto it = std::find(r.lrs.begin(), r.lrs.end(), run.lr);
    if (it != r.lrs.end()) f[static_cast<size_t>(it - r.lrs.begin())] = final_or_inf(run);
    if (initial && std::isnan(*initial) && !run.failed && std::isfinite(run.m.initial_val)) *initial = run.m.initial_val;
  }
  return f;
}

const Run* find_run(const NaturalReport& r, const std::string& scenario, const std::string& setup, double lr,
                    int64_t seed) {
  for (const auto& run : r.runs)
    if (run.scenario == scenario && run.setup == setup && run.lr == lr && run.seed == seed) return &run;
  return nullptr;
}

std::vector<std::string> scenarios_of(const NaturalReport& r) {
  std::vector<std::string> out;
  for (const char* s : {"finetune", "scratch"})
    if (std::any_of(r.runs.begin(), r.runs.end(), [&](const Run& run) { return run.scenario == s; })) out.push_back(s);
  return out;
}

std::vector<std::string> setups_of(const NaturalReport& r, const std::string& scenario) {
  std::vector<std::string> out;
  for (const auto& [name, title] : r.setup_titles)
    if (std::any_of(r.runs.begin(), r.runs.end(), [&](const Run& run) { return run.scenario == scenario && run.setup == name; }))
      out.push_back(name);
  return out;
}

int64_t seeds_of(const NaturalReport& r, const std::string& scenario, const std::string& setup) {
  int64_t n = 0;
  for (const auto& run : r.runs)
    if (run.scenario == scenario && run.setup == setup) n = std::max(n, run.seed);
  return n;
}

const char* scenario_heading(const std::string& s) {
  return s == "finetune" ? "Fine-tuning shock: from the pretrained base, on other data"
                         : "From scratch: random initialisation";
}

// The learning rate whose curves the page draws: where the plain loop's excursion is the
// largest finite one (the shock at its clearest), else the middle of the sweep.
double curve_lr(const NaturalReport& r, const std::string& scenario) {
  double lr = r.lrs.empty() ? 0 : r.lrs[r.lrs.size() / 2], worst = -kInf;
  for (double x : r.lrs)
    if (const Run* run = find_run(r, scenario, "plain", x, 1))
      if (!run->failed && std::isfinite(run->m.excursion) && run->m.excursion > worst) worst = run->m.excursion, lr = x;
  return lr;
}

}  // namespace

void NaturalReport::summarise() {
  summaries.clear();
  for (const auto& scenario : scenarios_of(*this)) {
    double best = kInf;
    for (const auto& setup : setups_of(*this, scenario))
      for (double f : finals_of(*this, scenario, setup, 1, nullptr)) best = std::min(best, f);
    for (const auto& setup : setups_of(*this, scenario)) {
      SetupSummary s;
      s.scenario = scenario;
      s.setup = setup;
      for (const auto& [name, title] : setup_titles)
        if (name == setup) s.title = title;
      double initial = kNaN;
      const auto finals = finals_of(*this, scenario, setup, 1, &initial);
      s.sensitivity = lr_sensitivity(finals, initial);
      const auto range = widest_range(finals, best + 0.1);
      if (range.first >= 0) {
        s.range_lo = lrs[static_cast<size_t>(range.first)];
        s.range_hi = lrs[static_cast<size_t>(range.second)];
      }
      for (const auto& run : runs)
        if (run.scenario == scenario && run.setup == setup && run.seed == 1) {
          s.failed += run.failed;
          s.diverged += !run.failed && run.m.diverged;
        }
      summaries.push_back(s);
    }
  }
}

namespace {

// The gradient-norm forecast as a precursor of loss excursions (natural.h), per learning
// rate over every setup and seed of the scenario.
std::string precursor_table(const NaturalReport& r, const std::string& scenario) {
  std::ostringstream md;
  md << "### The gradient-norm forecast as a precursor (all setups and seeds)\n\n"
     << "Onset: the first step whose train loss is " << fmt(kOnsetMargin, "%.2f")
     << " above the initial. A breach (the gradient norm above its forecast band, `guard.forecast_zscore` 4) "
        "warns when it comes at least one step before the onset; in a run without an onset it is a false "
        "alarm.\n\n"
     << "| lr | runs | with an onset | onset step (median) | warned ≥ 1 step ahead (median lead) | breach at the onset "
        "| breach later or none | runs without an onset | of them with a breach | breaches per 100 judged steps "
        "(runs without an onset) |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (double lr : r.lrs) {
    int64_t runs = 0, onsets = 0, warned = 0, at = 0, late = 0, stable = 0, alarmed = 0, breaches = 0, judged = 0;
    std::vector<double> onset_steps, leads;
    for (const auto& run : r.runs) {
      if (run.scenario != scenario || run.lr != lr || run.failed) continue;
      ++runs;
      const auto& m = run.m;
      if (m.onset >= 0) {
        ++onsets;
        onset_steps.push_back(static_cast<double>(m.onset));
        if (m.first_breach >= 0 && m.first_breach < m.onset) {
          ++warned;
          leads.push_back(static_cast<double>(m.onset - m.first_breach));
        } else if (m.first_breach == m.onset) {
          ++at;
        } else {
          ++late;
        }
      } else {
        ++stable;
        alarmed += m.breaches > 0;
        breaches += m.breaches;
        judged += m.judged;
      }
    }
    if (runs == 0) continue;
    md << "| " << lr_label(lr) << " | " << runs << " | " << onsets << " | " << fmt(median(onset_steps), "%.0f") << " | "
       << warned << (leads.empty() ? "" : " (" + fmt(median(leads), "%.0f") + ")") << " | " << at << " | " << late
       << " | " << stable << " | " << alarmed << " | "
       << (judged > 0 ? fmt(100.0 * static_cast<double>(breaches) / static_cast<double>(judged), "%.1f") : "-")
       << " |\n";
  }
  md << "\n";
  return md.str();
}

}  // namespace

std::string NaturalReport::markdown() const {
  std::ostringstream md;
  md << "# gradguard bench natural (" << mode << ")\n\n"
     << date << ", " << cpu << ", `" << command << "`: " << runs.size() << " runs in "
     << static_cast<int>(wall_s) / 60 << " min " << static_cast<int>(wall_s) % 60 << " s.\n\n";
  if (!bases.empty()) {
    md << "Pretrained bases (one per seed):\n\n| seed | train loss | val loss | B_simple (sequences) | fine-tune batch / "
          "B_simple | cached |\n|---|---|---|---|---|---|\n";
    for (const auto& b : bases)
      md << "| " << b.seed << " | " << fmt(b.train_loss, "%.4f") << " | " << fmt(b.val_loss, "%.4f") << " | "
         << fmt(b.noise_scale, "%.1f") << " | " << fmt(static_cast<double>(global_batch) / b.noise_scale, "%.1f")
         << "x | " << (b.reused ? "reused" : "trained") << " |\n";
    md << "\n";
  }
  std::string lr_cols, lr_rule;
  for (double lr : lrs) lr_cols += " | " + lr_label(lr), lr_rule += "|---";
  for (const auto& scenario : scenarios_of(*this)) {
    const int64_t steps = scenario == "finetune" ? finetune_steps : scratch_steps;
    md << "## " << scenario_heading(scenario) << "\n\n"
       << steps << " steps of " << global_batch << " sequences, cosine decay to 0 unless the setup sets a floor; seed 1.\n\n"
       << "### Final validation loss per peak learning rate\n\n| setup" << lr_cols
       << " | LR sensitivity | LR range within 0.1 of the best | diverged |\n|---" << lr_rule << "|---|---|---|\n";
    for (const auto& s : summaries) {
      if (s.scenario != scenario) continue;
      md << "| " << s.setup;
      for (double lr : lrs) {
        const Run* run = find_run(*this, scenario, s.setup, lr, 1);
        md << " | " << (!run ? "" : run->failed ? "failed" : fmt(run->m.final_val) + (run->m.diverged ? " ✗" : ""));
      }
      md << " | " << fmt(s.sensitivity) << " | "
         << (s.range_lo > 0 ? lr_label(s.range_lo) + " – " + lr_label(s.range_hi) + " (" +
                                  fmt(std::log10(s.range_hi / s.range_lo), "%.1f") + " decades)"
                            : "-")
         << " | " << s.diverged << "/" << lrs.size() << " |\n";
    }
    md << "\n✗ diverged: a non-finite loss, or a final validation loss above the initial one.\n\n"
       << "### Peak excursion (max train loss in the first 20 steps − the initial) / the first step back at the "
          "initial loss\n\n| setup" << lr_cols << " |\n|---" << lr_rule << "|\n";
    for (const auto& s : summaries) {
      if (s.scenario != scenario) continue;
      md << "| " << s.setup;
      for (double lr : lrs) {
        const Run* run = find_run(*this, scenario, s.setup, lr, 1);
        md << " | ";
        if (run && !run->failed)
          md << fmt(run->m.excursion, "%+.2f") << " / " << (run->m.back_at >= 0 ? std::to_string(run->m.back_at) : "never");
        else if (run)
          md << "failed";
      }
      md << " |\n";
    }
    md << "\n";
    // The headline setups over their seeds.
    bool any = false;
    for (const auto& setup : setups_of(*this, scenario)) {
      const int64_t n = seeds_of(*this, scenario, setup);
      if (n < 2) continue;
      if (!any) md << "### Over seeds: mean (min–max)\n\n| setup | metric" << lr_cols << " | LR sensitivity |\n|---|---"
                   << lr_rule << "|---|\n";
      any = true;
      std::vector<double> sens;
      for (int64_t seed = 1; seed <= n; ++seed) {
        double initial = kNaN;
        const auto f = finals_of(*this, scenario, setup, seed, &initial);
        sens.push_back(lr_sensitivity(f, initial));
      }
      for (const char* metric : {"final val", "excursion"}) {
        md << "| " << setup << " (" << n << " seeds) | " << metric;
        for (double lr : lrs) {
          std::vector<double> v;
          for (int64_t seed = 1; seed <= n; ++seed)
            if (const Run* run = find_run(*this, scenario, setup, lr, seed); run && !run->failed)
              v.push_back(std::string(metric) == "excursion" ? run->m.excursion : run->m.final_val);
          md << " | " << fmt_spread(spread(v), std::string(metric) == "excursion" ? "%+.2f" : "%.3f");
        }
        md << " | " << (std::string(metric) == "excursion" ? "" : fmt_spread(spread(sens))) << " |\n";
      }
    }
    if (any) md << "\n";
    md << precursor_table(*this, scenario);
  }
  bool failed_header = false;
  for (const auto& run : runs)
    if (run.failed) {
      if (!failed_header) md << "## Failed runs\n\n";
      failed_header = true;
      md << "- " << run.scenario << " " << run.setup << " lr " << lr_label(run.lr) << " seed " << run.seed << ": exit code "
         << run.exit_code << ", log " << run.log << "\n";
    }
  if (failed_header) md << "\n";
  md << "## Setups\n\n";
  for (const auto& [name, title] : setup_titles) md << "- **" << name << "**: " << title << "\n";
  return md.str();
}

nlohmann::ordered_json NaturalReport::to_json() const {
  nlohmann::ordered_json j;
  j["mode"] = mode;
  j["command"] = command;
  j["cpu"] = cpu;
  j["date"] = date;
  j["wall_s"] = wall_s;
  j["global_batch"] = global_batch;
  j["finetune_steps"] = finetune_steps;
  j["scratch_steps"] = scratch_steps;
  j["lrs"] = lrs;
  j["bases"] = nlohmann::ordered_json::array();
  for (const auto& b : bases)
    j["bases"].push_back({{"seed", b.seed},
                          {"checkpoint", b.checkpoint},
                          {"train_loss", json_number(b.train_loss)},
                          {"val_loss", json_number(b.val_loss)},
                          {"noise_scale", json_number(b.noise_scale)},
                          {"reused", b.reused}});
  j["setups"] = nlohmann::ordered_json::array();
  for (const auto& [name, title] : setup_titles) j["setups"].push_back({{"name", name}, {"title", title}});
  j["summaries"] = nlohmann::ordered_json::array();
  for (const auto& s : summaries)
    j["summaries"].push_back({{"scenario", s.scenario},
                              {"setup", s.setup},
                              {"lr_sensitivity", json_number(s.sensitivity)},
                              {"lr_range", s.range_lo > 0 ? nlohmann::ordered_json{s.range_lo, s.range_hi}
                                                          : nlohmann::ordered_json(nullptr)},
                              {"diverged", s.diverged},
                              {"failed", s.failed}});
  j["runs"] = nlohmann::ordered_json::array();
  for (const auto& r : runs) {
    nlohmann::ordered_json curve = nlohmann::ordered_json::array();
    for (double v : r.m.curve) curve.push_back(json_number(v));
    j["runs"].push_back({{"scenario", r.scenario},
                         {"setup", r.setup},
                         {"lr", r.lr},
                         {"seed", r.seed},
                         {"run_dir", r.run_dir},
                         {"log", r.log},
                         {"exit_code", r.exit_code},
                         {"failed", r.failed},
                         {"wall_s", r.wall_s},
                         {"initial_loss", json_number(r.m.initial_loss)},
                         {"initial_val_loss", json_number(r.m.initial_val)},
                         {"excursion", json_number(r.m.excursion)},
                         {"back_at", r.m.back_at},
                         {"final_loss", json_number(r.m.final_loss)},
                         {"final_val_loss", json_number(r.m.final_val)},
                         {"diverged", r.m.diverged},
                         {"steps", r.m.steps},
                         {"skipped", r.m.skipped},
                         {"curve", curve},
                         {"onset", r.m.onset},
                         {"first_breach", r.m.first_breach},
                         {"breaches", r.m.breaches},
                         {"judged_steps", r.m.judged}});
  }
  return j;
}

std::string NaturalReport::html() const {
  // The page's data: per scenario, final val loss per setup over the sweep, the curves at
  // one learning rate, and the sensitivity bars.
  nlohmann::ordered_json data;
  data["lrs"] = lrs;
  data["scenarios"] = nlohmann::ordered_json::array();
  for (const auto& scenario : scenarios_of(*this)) {
    nlohmann::ordered_json sc;
    sc["name"] = scenario;
    sc["heading"] = scenario_heading(scenario);
    const double clr = curve_lr(*this, scenario);
    sc["curve_lr"] = clr;
    sc["setups"] = nlohmann::ordered_json::array();
    for (const auto& s : summaries) {
      if (s.scenario != scenario) continue;
      nlohmann::ordered_json finals = nlohmann::ordered_json::array(), curve = nlohmann::ordered_json::array();
      for (double lr : lrs) {
        const Run* run = find_run(*this, scenario, s.setup, lr, 1);
        finals.push_back(run && !run->failed ? json_number(run->m.final_val) : nlohmann::ordered_json(nullptr));
      }
      if (const Run* run = find_run(*this, scenario, s.setup, clr, 1); run && !run->failed)
        for (double v : run->m.curve) curve.push_back(json_number(v));
      sc["setups"].push_back({{"name", s.setup},
                              {"finals", finals},
                              {"curve", curve},
                              {"sensitivity", json_number(s.sensitivity)}});
    }
    data["scenarios"].push_back(sc);
  }
  const std::string json = report::assets::script_safe(data.dump());
  std::string table = markdown();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}})
    for (size_t p = 0; (p = table.find(from, p)) != std::string::npos; p += to.size()) table.replace(p, from.size(), to);

  namespace assets = report::assets;
  std::ostringstream h;
  h << "<!doctype html><html><head><meta charset=\"utf-8\"><title>gradguard bench natural</title>\n"
    << "<!-- uPlot, inlined below under its MIT license:\n"
    << assets::comment_safe(std::string(assets::kUplotLicense)) << "\n-->\n<style>"
    << assets::script_safe(std::string(assets::kUplotCss))
    << "body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}h2{margin-top:32px}"
       ".row{display:flex;flex-wrap:wrap;gap:24px}.bar{display:flex;align-items:center;gap:8px;margin:2px 0}"
       ".bar span{width:120px;text-align:right}.bar div{background:#4a7fb5;height:14px}"
       "pre{background:#f6f6f6;padding:12px;overflow-x:auto;font-size:12px}</style></head><body>"
       "<h1>gradguard bench natural</h1><p>"
    << date << ", " << cpu << ". Final validation loss against the peak learning rate (log scale) for every setup, "
    << "the train loss of the first steps at one learning rate, and each setup's LR sensitivity (Wortsman et al. "
       "2023: lower is more robust).</p><div id=\"charts\"></div><h2>Tables</h2><pre>"
    << table << "</pre><script>" << assets::script_safe(std::string(assets::kUplotJs))
    << "</script><script>const D=" << json << ";\n"
    << R"JS(
const colors=['#1f77b4','#ff7f0e','#2ca02c','#d62728','#9467bd','#8c564b','#e377c2','#7f7f7f','#bcbd22','#17becf','#393b79','#637939','#8c6d31','#843c39','#7b4173','#3182bd','#e6550d','#31a354'];
const root=document.getElementById('charts');
for(const sc of D.scenarios){
  const h=document.createElement('h2');h.textContent=sc.heading;root.appendChild(h);
  const row=document.createElement('div');row.className='row';root.appendChild(row);
  const series=[{label:'lr'}].concat(sc.setups.map((s,i)=>({label:s.name,stroke:colors[i%colors.length],width:1.5,points:{show:true}})));
  new uPlot({title:'final validation loss vs peak learning rate',width:520,height:360,series:series,
    scales:{x:{time:false,distr:3}},axes:[{label:'peak lr'},{label:'final val loss'}]},
    [D.lrs].concat(sc.setups.map(s=>s.finals)),row);
  const n=Math.max(0,...sc.setups.map(s=>s.curve.length));
  const steps=Array.from({length:n},(_,i)=>i);
  new uPlot({title:'train loss, first steps, lr '+sc.curve_lr.toExponential(0),width:520,height:360,
    series:[{label:'step'}].concat(sc.setups.map((s,i)=>({label:s.name,stroke:colors[i%colors.length],width:1.5}))),
    scales:{x:{time:false}},axes:[{label:'step'},{label:'loss'}]},
    [steps].concat(sc.setups.map(s=>steps.map(i=>i<s.curve.length?s.curve[i]:null))),row);
  const bars=document.createElement('div');
  const t=document.createElement('h3');t.textContent='LR sensitivity (lower is better)';bars.appendChild(t);
  const max=Math.max(1e-9,...sc.setups.map(s=>s.sensitivity||0));
  for(const s of sc.setups){const b=document.createElement('div');b.className='bar';
    const l=document.createElement('span');l.textContent=s.name;const d=document.createElement('div');
    d.style.width=(s.sensitivity===null?0:400*s.sensitivity/max)+'px';const v=document.createElement('em');
    v.textContent=s.sensitivity===null?'-':s.sensitivity.toFixed(3);b.append(l,d,v);bars.appendChild(b);}
  root.appendChild(bars);
}
)JS"
    << "</script></body></html>\n";
  return h.str();
}

}  // namespace gradguard::natural
