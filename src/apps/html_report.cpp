// Reads a run directory into the JSON the report page draws, and fills the page
// template. The page's layout and drawing live in src/apps/report_assets/ (HTML, CSS, JS),
// embedded at build time; this file only gathers numbers, so a change to the charts
// never touches C++ and a change to the metrics format is handled in one place.
#include "gradguard/apps/html_report.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/stats.h"
#include "gradguard/core/run_dir.h"
#include "report_assets.h"

namespace gradguard::report {
namespace {

using Json = nlohmann::ordered_json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A clock that restarts with every process of a resumed run (elapsed_s, telemetry t_s)
// made continuous: when it goes back, the next segment starts where the last one ended.
struct SegmentClock {
  double offset = 0, last = kNaN;
  double continuous(double raw) {
    if (!std::isfinite(raw)) return raw;
    if (std::isfinite(last) && raw < last) offset += last;
    last = raw;
    return raw + offset;
  }
};

// The kept trajectory of step lines: a step number at or below the last one means the
// run rolled back (or resumed from an earlier checkpoint), so later entries replace it.
struct StepColumns {
  SegmentClock clock;
  static constexpr const char* kFields[] = {"loss",         "lr",       "grad_norm",    "clip_threshold",
                                            "clip_coef",    "loss_scale", "tokens_per_s", "elapsed_s",
                                            "noise_scale"};
  std::vector<int64_t> step;
  std::map<std::string, std::vector<double>> columns;        // [field][row]
  std::vector<bool> skipped;                                  // [row]
  std::vector<std::string> layer_names;                       // first-seen order
  std::map<std::string, std::vector<double>> layer_norms;     // [layer][row]

  void truncate_before(int64_t s) {
    size_t keep = step.size();
    while (keep > 0 && step[keep - 1] >= s) --keep;
    step.resize(keep);
    skipped.resize(keep);
    for (auto& [name, col] : columns) col.resize(keep);
    for (auto& [name, col] : layer_norms) col.resize(keep, kNaN);
  }

  void add(const Json& line) {
    const int64_t s = line.at("step").get<int64_t>();
    if (!step.empty() && s <= step.back()) truncate_before(s);
    step.push_back(s);
    for (const char* f : kFields) columns[f].push_back(number_or_nan(line, f));
    columns["elapsed_s"].back() = clock.continuous(columns["elapsed_s"].back());
    // The gradient-norm forecast (guard/forecast.h): its band, and the norm where it breached upward.
    const auto forecast = line.find("grad_norm_forecast");
    const bool has_forecast = forecast != line.end() && forecast->is_object();
    for (const char* f : {"expected", "low", "high"})
      columns[std::string("forecast_") + f].push_back(has_forecast ? number_or_nan(*forecast, f) : kNaN);
    const auto breach = line.find("forecast_breach");
    columns["forecast_breach"].push_back(breach != line.end() && breach->is_number() && breach->get<int>() > 0
                                             ? columns["grad_norm"].back()
                                             : kNaN);
    const auto sk = line.find("skipped");
    skipped.push_back(sk != line.end() && sk->is_boolean() && sk->get<bool>());
    const size_t row = step.size() - 1;
    const auto layers = line.find("layer_grad_norms");
    if (layers != line.end() && layers->is_object()) {
      for (const auto& [name, value] : layers->items()) {
        auto [it, fresh] = layer_norms.try_emplace(name);
        if (fresh) layer_names.push_back(name);
        it->second.resize(row, kNaN);
        it->second.push_back(value.is_number() ? value.get<double>() : kNaN);
      }
    }
    for (auto& [name, col] : layer_norms) col.resize(row + 1, kNaN);
  }
};

// Telemetry samples of one rank (-1 = a single-process run), fields aligned on t_s.
struct TelemetryColumns {
  std::vector<double> t_s;
  std::vector<std::string> names;                     // first-seen order
  std::map<std::string, std::vector<double>> fields;  // [field][sample]

  SegmentClock clock;

  void add(const Json& line) {
    static const char* kSkip[] = {"step", "event", "rank", "t_s", "unix_time", "gpu_count"};
    t_s.push_back(clock.continuous(number_or_nan(line, "t_s")));
    const size_t row = t_s.size() - 1;
    for (const auto& [key, value] : line.items()) {
      if (std::find(std::begin(kSkip), std::end(kSkip), key) != std::end(kSkip)) continue;
      if (!value.is_number() && !value.is_null()) continue;  // names and other text
      auto [it, fresh] = fields.try_emplace(key);
      if (fresh) names.push_back(key);
      it->second.resize(row, kNaN);
      it->second.push_back(value.is_number() ? value.get<double>() : kNaN);
    }
    for (auto& [name, col] : fields) col.resize(row + 1, kNaN);
  }
};

Json column(const std::vector<double>& values) {
  Json a = Json::array();
  for (double v : values) a.push_back(json_number(v));
  return a;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// Fills the template's "@NAME@" slots in one pass, so text put into one slot (a run
// name, a metrics string) is never searched for another. A slot without a value, or a
// value without its slot, is a build mistake and asserts.
std::string render(std::string_view page, const std::map<std::string, std::string>& slots) {
  std::string out;
  out.reserve(page.size() + 200000);
  size_t pos = 0, used = 0;
  for (;;) {
    const size_t a = page.find('@', pos);
    const size_t b = a == std::string_view::npos ? a : page.find('@', a + 1);
    if (b == std::string_view::npos) break;
    const std::string name(page.substr(a + 1, b - a - 1));
    const auto it = slots.find(name);
    if (it == slots.end()) {  // an '@' that is not a slot
      out.append(page.substr(pos, a + 1 - pos));
      pos = a + 1;
      continue;
    }
    out.append(page.substr(pos, a - pos));
    out += it->second;
    pos = b + 1;
    ++used;
  }
  out.append(page.substr(pos));
  if (used != slots.size()) throw std::logic_error("report template: a slot is missing or repeated");
  return out;
}

std::string uplot_version() {
  const std::string_view js = assets::kUplotJs;
  const size_t v = js.find("(v");
  const size_t end = js.find(')', v);
  return v == std::string_view::npos || end == std::string_view::npos ? "?" : std::string(js.substr(v + 2, end - v - 2));
}

}  // namespace

void HtmlReportOptions::validate() const {
  if (max_heatmap_columns < 10)
    throw Error(ErrorKind::kBadInput, "max_heatmap_columns",
                "must be at least 10, got " + std::to_string(max_heatmap_columns));
}

nlohmann::ordered_json collect_report_data(const std::string& run_dir, const HtmlReportOptions& options) {
  options.validate();
  namespace sfs = std::filesystem;
  const RunDir run(run_dir);
  const std::string metrics_path = run.metrics();
  if (!sfs::is_directory(run_dir)) throw Error(ErrorKind::kBadInput, run_dir, "is not a run directory (no such directory)");
  std::ifstream in(metrics_path);
  if (!in) throw Error(ErrorKind::kBadInput, metrics_path, "cannot be read (is this a gradguard run directory?)");

  StepColumns steps;
  std::map<int64_t, TelemetryColumns> telemetry;  // [rank]
  std::vector<std::pair<int64_t, double>> val;    // (step, loss), kept trajectory
  Json anomalies = Json::array(), problems = Json::array();
  std::vector<int64_t> rollback_steps;
  int64_t skipped_total = 0, step_lines = 0;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const auto parsed = try_parse_ordered_json(line);
    if (!parsed) {
      problems.push_back("metrics.jsonl line " + std::to_string(n) + " is not JSON (" + line.substr(0, 60) +
                         (line.size() > 60 ? "…" : "") + "); left out");
      continue;
    }
    const Json& j = *parsed;
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      problems.push_back("metrics.jsonl line " + std::to_string(n) + " has no integer \"step\"; left out");
      continue;
    }
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("event")) {
      const std::string event = j["event"].is_string() ? j["event"].get<std::string>() : "";
      if (event == "telemetry") {
        telemetry[j.contains("rank") && j["rank"].is_number_integer() ? j["rank"].get<int64_t>() : -1].add(j);
      } else if (event == "anomaly") {
        anomalies.push_back(Json{{"step", step},
                                 {"kind", string_field(j, "kind", "?")},
                                 {"severity", string_field(j, "severity", "?")},
                                 {"message", string_field(j, "message")},
                                 {"action", nullptr},
                                 {"diagnosis", nullptr}});
      } else if (event == "recovery") {
        // The action answers the primary anomaly of the same step: the last one logged.
        for (auto it = anomalies.rbegin(); it != anomalies.rend(); ++it)
          if ((*it)["step"] == step && (*it)["kind"] == string_field(j, "anomaly")) {
            (*it)["action"] = string_field(j, "action");
            break;
          }
      } else if (event == "rollback") {
        rollback_steps.push_back(step);
      }
    } else if (j.contains("val_loss")) {
      while (!val.empty() && val.back().first >= step) val.pop_back();
      val.emplace_back(step, number_or_nan(j, "val_loss"));
    } else if (j.contains("loss")) {
      steps.add(j);
      ++step_lines;
      if (steps.skipped.back()) ++skipped_total;
    }
  }

  Json data;
  const std::string name = sfs::path(run_dir).lexically_normal().filename().string();
  data["run"] = {{"name", name.empty() ? run_dir : name},
                 {"dir", run_dir},
                 {"generated", now_text()},
                 {"version", GRADGUARD_VERSION},
                 {"uplot_version", uplot_version()}};

  Json cols;
  cols["step"] = steps.step;
  for (const auto& [field, values] : steps.columns) cols[field] = column(values);
  for (const char* f : StepColumns::kFields)
    if (!cols.contains(f)) cols[f] = Json::array();
  data["steps"] = cols;

  Json val_json = {{"step", Json::array()}, {"loss", Json::array()}};
  for (const auto& [s, v] : val) {
    val_json["step"].push_back(s);
    val_json["loss"].push_back(json_number(v));
  }
  data["val"] = val_json;

  // Per-layer norms binned into at most max_heatmap_columns columns (max per bin).
  const size_t rows = steps.step.size();
  const size_t bin = std::max<size_t>(1, (rows + options.max_heatmap_columns - 1) / options.max_heatmap_columns);
  Json layers = {{"names", steps.layer_names}, {"bin", bin}, {"step", Json::array()}, {"values", Json::array()}};
  for (size_t r = 0; r < rows; r += bin) layers["step"].push_back(steps.step[r]);
  for (const auto& layer : steps.layer_names) {
    const auto& col = steps.layer_norms.at(layer);
    Json out = Json::array();
    for (size_t r = 0; r < rows; r += bin) {
      double m = kNaN;
      for (size_t k = r; k < std::min(rows, r + bin); ++k)
        if (std::isfinite(col[k]) && !(col[k] <= m)) m = col[k];
      out.push_back(json_number(m));
    }
    layers["values"].push_back(out);
  }
  data["layers"] = layers;

  Json tel = Json::array();
  for (const auto& [rank, t] : telemetry) {
    Json fields = Json::object();
    for (const auto& f : t.names) fields[f] = column(t.fields.at(f));
    tel.push_back(Json{{"rank", rank}, {"t_s", column(t.t_s)}, {"fields", fields}});
  }
  data["telemetry"] = tel;

  // Snapshots with a diagnosis, linked from the anomalies of their step.
  Json diagnoses = Json::array();
  const sfs::path snap_dir = run.snapshots();
  std::error_code ec;
  if (sfs::is_directory(snap_dir, ec)) {
    std::vector<std::string> names;
    for (const auto& entry : sfs::directory_iterator(snap_dir, ec))
      if (sfs::exists(entry.path() / "diagnosis.md")) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    for (const auto& snap : names) {
      std::string text;
      try {
        text = fs::read_file((snap_dir / snap / "diagnosis.md").string());
      } catch (const Error& e) {
        problems.push_back(std::string("snapshot ") + snap + ": " + e.what());
        continue;
      }
      const int64_t index = static_cast<int64_t>(diagnoses.size());
      diagnoses.push_back(Json{{"snapshot", "snapshots/" + snap}, {"markdown", text}});
      char prefix[32];
      for (auto& a : anomalies) {
        std::snprintf(prefix, sizeof prefix, "step-%07lld-", static_cast<long long>(a["step"].get<int64_t>()));
        if (a["diagnosis"].is_null() && snap.rfind(prefix, 0) == 0) a["diagnosis"] = index;
      }
    }
  }
  data["anomalies"] = anomalies;
  data["diagnoses"] = diagnoses;

  Json skipped_steps = Json::array();
  for (size_t r = 0; r < rows; ++r)
    if (steps.skipped[r]) skipped_steps.push_back(steps.step[r]);
  Json anomaly_steps = Json::array();
  for (const auto& a : anomalies)
    if (anomaly_steps.empty() || anomaly_steps.back() != a["step"]) anomaly_steps.push_back(a["step"]);
  data["markers"] = {{"skipped", skipped_steps}, {"anomaly", anomaly_steps}, {"rollback", rollback_steps}};

  const auto& loss = steps.columns["loss"];
  double final_loss = kNaN, best_val = kNaN;
  for (auto it = loss.rbegin(); it != loss.rend(); ++it)
    if (std::isfinite(*it)) { final_loss = *it; break; }
  for (const auto& [s, v] : val)
    if (std::isfinite(v) && !(v >= best_val)) best_val = v;
  const auto& elapsed = steps.columns["elapsed_s"];
  data["summary"] = {{"steps_logged", step_lines},
                     {"first_step", rows ? Json(steps.step.front()) : Json(nullptr)},
                     {"last_step", rows ? Json(steps.step.back()) : Json(nullptr)},
                     {"final_loss", json_number(final_loss)},
                     {"best_val_loss", json_number(best_val)},
                     {"median_tokens_per_s", json_number(median(steps.columns["tokens_per_s"]))},
                     {"wall_s", json_number(elapsed.empty() ? kNaN : elapsed.back())},
                     {"skipped", skipped_total},
                     {"anomalies", anomalies.size()},
                     {"rollbacks", rollback_steps.size()}};
  if (step_lines == 0) problems.push_back("metrics.jsonl holds no step lines yet: nothing to chart");

  const std::string config_path = run.config();
  data["config"] = fs::exists(config_path) ? fs::read_file(config_path) : std::string();
  data["problems"] = problems;
  if (!options.appendix_title.empty()) {
    Json links = Json::array();
    for (const auto& [label, href] : options.appendix_links) links.push_back(Json{{"label", label}, {"href", href}});
    data["appendix"] = {{"title", options.appendix_title}, {"text", options.appendix_text}, {"links", links}};
  }
  return data;
}

std::string write_html_report(const std::string& run_dir, const HtmlReportOptions& options) {
  const Json data = collect_report_data(run_dir, options);
  std::string title = "gradguard: " + data["run"]["name"].get<std::string>();
  for (size_t at = 0; (at = title.find_first_of("<&", at)) != std::string::npos; ++at)
    title.replace(at, 1, title[at] == '<' ? "&lt;" : "&amp;");
  const std::string license = assets::comment_safe(std::string(assets::kUplotLicense));  // in an HTML comment
  // error_handler_t::replace: a metrics line may carry invalid UTF-8 in a string.
  const std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string safe;
  safe.reserve(json.size());
  for (char ch : json) {
    if (ch == '<') safe += "\\u003c";  // only inside strings: JSON's syntax has no '<'
    else safe += ch;
  }
  const std::string page = render(assets::kPageHtml, {{"VERSION", GRADGUARD_VERSION},
                                                      {"TITLE", title},
                                                      {"UPLOT_VERSION", uplot_version()},
                                                      {"UPLOT_LICENSE", license},
                                                      {"UPLOT_CSS", assets::script_safe(std::string(assets::kUplotCss))},
                                                      {"REPORT_CSS", assets::script_safe(std::string(assets::kReportCss))},
                                                      {"DATA", safe},
                                                      {"UPLOT_JS", assets::script_safe(std::string(assets::kUplotJs))},
                                                      {"REPORT_JS", assets::script_safe(std::string(assets::kReportJs))}});
  const std::string out = options.out_path.empty() ? RunDir(run_dir).report() : options.out_path;
  fs::write_file_atomic(out, page);
  return out;
}

}  // namespace gradguard::report
