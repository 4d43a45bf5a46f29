// The HTML report: what it reads from a run directory (kept trajectory after a rollback,
// heatmap binning, anomaly-to-diagnosis links, tolerance of a cut-off line), that the
// page is self-contained and injection-safe, and — in headless Chromium — that it loads
// without script errors and every chart puts ink in its plot area.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "gradguard/apps/html_report.h"
#include "test_util.h"

namespace gradguard::report {
namespace {

using test::TempDir;
using Json = nlohmann::ordered_json;

// A run of 12 step lines (steps 0..9, a rollback at step 7 back to 6, so 6..9 repeat and
// the first 6..7 are dropped), two validations, telemetry from two ranks with GPU
// readings, a loss-spike anomaly at step 5 with its recovery and snapshot, and config.
void write_run(const std::string& dir, bool with_bad_line = false) {
  std::filesystem::create_directories(dir + "/snapshots/step-0000005-loss_spike");
  test::write_text(dir + "/snapshots/step-0000005-loss_spike/diagnosis.md", "# Step 5: loss_spike\n\ndata </script>");
  test::write_text(dir + "/config.yaml", "run:\n  name: fixture\noptim:\n  lr: 0.001\n");
  std::ofstream m(dir + "/metrics.jsonl");
  m << Json{{"step", 0}, {"val_loss", 5.5}}.dump() << "\n";
  auto step_line = [&](int64_t s, double loss, bool skipped, double layer0) {
    Json j = {{"step", s},          {"loss", loss},       {"lr", 1e-3 * (s + 1)}, {"grad_norm", 1.0 + s},
              {"clip_coef", 0.5},   {"clip_threshold", 1.0}, {"loss_scale", 65536.0}, {"skipped", skipped},
              {"tokens", 1024},     {"tokens_per_s", 1000.0 + s}, {"elapsed_s", 0.5 * (s + 1)}};
    if (s % 3 == 0) j["noise_scale"] = 10.0 + s;
    j["layer_grad_norms"] = {{"embed", 0.1 * (s + 1)}, {"layers.0", layer0}, {"head", 2.0}};
    if (s >= 2) {  // the forecast has a band from step 2; step 5 breaches it
      j["grad_norm_forecast"] = {{"expected", 1.0 + s}, {"low", 0.8 + s}, {"high", 1.5 + s}};
      j["forecast_breach"] = s == 5 ? 1 : 0;
    }
    m << j.dump() << "\n";
  };
  for (int64_t s = 0; s < 8; ++s) {
    step_line(s, s == 5 ? 12.0 : 4.0 - 0.1 * s, s == 5, 1.0);
    if (s == 5) {
      m << Json{{"step", 5},           {"event", "anomaly"}, {"kind", "loss_spike"}, {"severity", "critical"},
                {"loss", 12.0},        {"message", "loss 12 <b>against</b> 3.6"}}
               .dump()
        << "\n";
      m << Json{{"step", 5}, {"event", "recovery"}, {"action", "skip"}, {"rung", 0}, {"anomaly", "loss_spike"},
                {"snapshot", dir + "/snapshots/step-0000005-loss_spike"}}
               .dump()
        << "\n";
    }
    for (int rank = 0; rank < 2; ++rank)
      m << Json{{"step", s},
                {"event", "telemetry"},
                {"rank", rank},
                {"t_s", 0.5 * s + 0.1 * rank},
                {"unix_time", 1.8e9 + s},
                {"cpu_percent", 90.0 + rank},
                {"rss_mb", 300.0 + s},
                {"gpu_count", 1},
                {"gpu0_name", "Fake GPU"},
                {"gpu0_temperature_c", 60.0 + s},
                {"gpu0_power_w", s == 2 ? Json(nullptr) : Json(300.0)},
                {"gpu0_utilization_pct", 97.0},
                {"gpu0_memory_used_mb", 40000.0 + rank},
                {"gpu0_sm_clock_mhz", 1980.0}}
               .dump()
        << "\n";
  }
  m << Json{{"step", 7}, {"event", "rollback"}, {"checkpoint", "checkpoints/step-0000006"}, {"to_step", 6}}.dump()
    << "\n";
  if (with_bad_line) m << "{\"step\": 7, \"loss\": \n";
  for (int64_t s = 6; s < 10; ++s) step_line(s, 3.0 - 0.1 * s, false, s == 9 ? 50.0 : 1.0);
  m << Json{{"step", 10}, {"val_loss", 3.25}}.dump() << "\n";
}

TEST(HtmlReport, CollectsTheKeptTrajectoryAndMarkers) {
  TempDir dir;
  write_run(dir.path(), /*with_bad_line=*/true);
  const Json d = collect_report_data(dir.path());
  // 0..5 from the first pass, 6..9 after the rollback: the first 6 and 7 are replaced.
  EXPECT_EQ(d["steps"]["step"], Json({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_DOUBLE_EQ(d["steps"]["loss"][6].get<double>(), 3.0 - 0.6);
  EXPECT_TRUE(d["steps"]["noise_scale"][1].is_null());
  EXPECT_DOUBLE_EQ(d["steps"]["noise_scale"][3].get<double>(), 13.0);
  EXPECT_EQ(d["markers"]["skipped"], Json({5}));
  EXPECT_EQ(d["markers"]["anomaly"], Json({5}));
  EXPECT_EQ(d["markers"]["rollback"], Json({7}));
  EXPECT_EQ(d["val"]["step"], Json({0, 10}));
  // The anomaly carries the action of its recovery and links to the snapshot's diagnosis.
  ASSERT_EQ(d["anomalies"].size(), 1u);
  EXPECT_EQ(d["anomalies"][0]["action"], "skip");
  EXPECT_EQ(d["anomalies"][0]["diagnosis"], 0);
  EXPECT_EQ(d["diagnoses"][0]["snapshot"], "snapshots/step-0000005-loss_spike");
  // Telemetry split by rank, GPU name (text) left out, a null reading kept as a gap.
  ASSERT_EQ(d["telemetry"].size(), 2u);
  EXPECT_EQ(d["telemetry"][1]["rank"], 1);
  EXPECT_FALSE(d["telemetry"][0]["fields"].contains("gpu0_name"));
  EXPECT_TRUE(d["telemetry"][0]["fields"]["gpu0_power_w"][2].is_null());
  EXPECT_EQ(d["telemetry"][0]["t_s"].size(), 8u);
  // The cut-off line is reported, not fatal.
  ASSERT_EQ(d["problems"].size(), 1u);
  EXPECT_NE(d["problems"][0].get<std::string>().find("line"), std::string::npos);
  EXPECT_EQ(d["summary"]["skipped"], 1);
  EXPECT_EQ(d["summary"]["rollbacks"], 1);
  EXPECT_DOUBLE_EQ(d["summary"]["best_val_loss"].get<double>(), 3.25);
  EXPECT_DOUBLE_EQ(d["summary"]["final_loss"].get<double>(), 3.0 - 0.9);
  EXPECT_NE(d["config"].get<std::string>().find("lr: 0.001"), std::string::npos);
}

TEST(HtmlReport, ResumedRunKeepsTimeIncreasing) {
  // A second process restarts elapsed_s and the sampler's t_s at 0: the report's time
  // axis continues from the first process's end instead of going back.
  TempDir dir;
  std::ofstream m(dir.file("metrics.jsonl"));
  for (int64_t s = 0; s < 6; ++s) {
    const double t = 10.0 * ((s < 3 ? s : s - 3) + 1);  // 10 20 30 | 10 20 30
    m << Json{{"step", s}, {"loss", 3.0}, {"tokens_per_s", 100.0}, {"elapsed_s", t}}.dump() << "\n";
    m << Json{{"step", s}, {"event", "telemetry"}, {"t_s", t - 5}, {"rss_mb", 100.0}}.dump() << "\n";
  }
  m.close();
  const Json d = collect_report_data(dir.path());
  std::vector<double> elapsed, t_s;
  for (const auto& v : d["steps"]["elapsed_s"]) elapsed.push_back(v.get<double>());
  for (const auto& v : d["telemetry"][0]["t_s"]) t_s.push_back(v.get<double>());
  EXPECT_EQ(elapsed, (std::vector<double>{10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(t_s, (std::vector<double>{5, 15, 25, 30, 40, 50}));
  EXPECT_DOUBLE_EQ(d["summary"]["wall_s"].get<double>(), 60);
}

TEST(HtmlReport, HeatmapBinsKeepEachBinsMaximum) {
  TempDir dir;
  write_run(dir.path());
  HtmlReportOptions o;
  o.max_heatmap_columns = 10;
  Json d = collect_report_data(dir.path(), o);
  EXPECT_EQ(d["layers"]["bin"], 1);
  EXPECT_EQ(d["layers"]["names"], Json({"embed", "layers.0", "head"}));
  // 25 steps into at most 10 columns: bins of 3; the spike at step 9 survives binning.
  std::ofstream m(dir.file("metrics.jsonl"), std::ios::app);
  for (int64_t s = 10; s < 25; ++s)
    m << Json{{"step", s}, {"loss", 2.0}, {"layer_grad_norms", {{"embed", 0.1}, {"layers.0", 1.0}, {"head", 2.0}}}}
             .dump()
      << "\n";
  m.close();
  d = collect_report_data(dir.path(), o);
  EXPECT_EQ(d["layers"]["bin"], 3);
  EXPECT_EQ(d["layers"]["step"], Json({0, 3, 6, 9, 12, 15, 18, 21, 24}));
  EXPECT_DOUBLE_EQ(d["layers"]["values"][1][3].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(d["layers"]["values"][1][4].get<double>(), 1.0);
}

TEST(HtmlReport, PageIsSelfContainedAndInjectionSafe) {
  TempDir dir;
  write_run(dir.path());
  const std::string path = write_html_report(dir.path());
  EXPECT_EQ(path, dir.file("report.html"));
  const std::string page = test::read_text(path);
  EXPECT_NE(page.find("uPlot"), std::string::npos);
  EXPECT_NE(page.find("MIT License"), std::string::npos);  // uPlot's license travels with it
  // No external resource: every script and style is inline.
  EXPECT_EQ(page.find("src=\""), std::string::npos);
  EXPECT_EQ(page.find("href=\"http"), std::string::npos);
  // The diagnosis text holds "</script>": it must not close the data block early.
  const size_t data_at = page.find("id=\"report-data\">");
  ASSERT_NE(data_at, std::string::npos);
  const size_t data_end = page.find("</script>", data_at);
  const std::string data = page.substr(data_at + 17, data_end - data_at - 17);
  EXPECT_EQ(data.find('<'), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(data)["diagnoses"][0]["markdown"], "# Step 5: loss_spike\n\ndata </script>");
}

TEST(HtmlReport, ErrorsNameThePath) {
  TempDir dir;
  std::string msg = test::bad_input_message([&] { collect_report_data(dir.file("nope")); });
  EXPECT_NE(msg.find(dir.file("nope")), std::string::npos);
  msg = test::bad_input_message([&] { collect_report_data(dir.path()); });
  EXPECT_NE(msg.find("metrics.jsonl"), std::string::npos);
  HtmlReportOptions o;
  o.max_heatmap_columns = 2;
  write_run(dir.path());
  msg = test::bad_input_message([&] { collect_report_data(dir.path(), o); });
  EXPECT_NE(msg.find("max_heatmap_columns"), std::string::npos);
  // An output path under a regular file cannot be created: a runtime error naming it.
  test::write_text(dir.file("blocker"), "x");
  o = {};
  o.out_path = dir.file("blocker/report.html");
  try {
    write_html_report(dir.path(), o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("blocker"), std::string::npos);
  }
}

TEST(HtmlReport, CliWritesTheReportAndRejectsBadInput) {
  TempDir dir;
  write_run(dir.path() + "/run");
  auto r = test::run_cli("report " + dir.path() + "/run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/run/report.html"));
  r = test::run_cli("report " + dir.path() + "/run -o " + dir.file("elsewhere.html"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("elsewhere.html")));
  // --csv and --tensorboard beside the page; a second --tensorboard finds the first file.
  r = test::run_cli("report " + dir.path() + "/run --csv --tensorboard --no-html");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("csv: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("scalars written"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/run/steps.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/run/telemetry.csv"));
  r = test::run_cli("report " + dir.path() + "/run --tensorboard --no-html");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already holds"), std::string::npos) << r.output;
  r = test::run_cli("report " + dir.path() + "/missing");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
}

// ---- headless Chromium -------------------------------------------------------------------

std::string chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

struct Browser {
  int exit_code = -1;
  std::string dom, log;
};

// Loads `page` headless (own profile dir, no sandbox: tests may run as root) and returns
// the DOM after scripts ran; with `screenshot` also writes a PNG of the page.
Browser load(const std::string& page, const TempDir& tmp, const std::string& screenshot = "") {
  const std::string base = chromium() + " --headless=new --no-sandbox --disable-gpu --hide-scrollbars " +
                           "--no-first-run --disable-extensions --user-data-dir=" + tmp.file("profile") +
                           " --window-size=1200,3200 --virtual-time-budget=10000 --enable-logging=stderr --v=0 ";
  const std::string what = screenshot.empty() ? "--dump-dom " : "--screenshot=" + screenshot + " ";
  const std::string cmd = "timeout 120 " + base + what + "file://" + page + " > " + tmp.file("dom.html") + " 2> " +
                          tmp.file("log.txt");
  Browser b;
  const int rc = std::system(cmd.c_str());
  b.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  b.dom = test::read_text(tmp.file("dom.html"));
  b.log = test::read_text(tmp.file("log.txt"));
  return b;
}

Json page_status(const Browser& b) {
  const std::string tag = "<script type=\"application/json\" id=\"report-status\">";
  const size_t at = b.dom.find(tag);
  if (at == std::string::npos) return nullptr;
  const size_t end = b.dom.find("</script>", at);
  return Json::parse(b.dom.substr(at + tag.size(), end - at - tag.size()));
}

TEST(HtmlReportBrowser, EveryChartDrawsWithoutErrors) {
  if (chromium().empty()) GTEST_SKIP() << "Chromium is not installed (scripts/setup.sh installs the chromium package)";
  TempDir dir;
  write_run(dir.path() + "/run");
  HtmlReportOptions o;
  o.appendix_title = "Comparison";
  o.appendix_text = "| setup | loss |\n| a <b> | 1 |";
  o.appendix_links = {{"other run", "../other/report.html"}};
  const std::string page = write_html_report(dir.path() + "/run", o);
  const Browser b = load(page, dir);
  ASSERT_EQ(b.exit_code, 0) << b.log;
  const Json status = page_status(b);
  ASSERT_FALSE(status.is_null()) << "the page did not finish its script; log:\n" << b.log;
  EXPECT_TRUE(status["errors"].empty()) << status.dump();
  for (const std::string line : {"Uncaught", ":ERROR:CONSOLE", "SyntaxError", "TypeError", "ReferenceError"})
    EXPECT_EQ(b.log.find(line), std::string::npos) << b.log;
  // Every chart the fixture feeds, and ink (opaque pixels) inside each plot area.
  for (const char* id : {"chart-loss", "chart-lr", "chart-grad", "chart-scale", "chart-noise", "heatmap", "chart-tps",
                         "chart-telemetry-cpu", "chart-telemetry-memory", "chart-telemetry-temperature",
                         "chart-telemetry-power", "chart-telemetry-gpu-utilisation", "chart-telemetry-clocks"}) {
    ASSERT_TRUE(status["charts"].contains(id)) << id << " missing: " << status.dump();
    EXPECT_GT(status["charts"][id]["ink"].get<int64_t>(), 30) << id << ": " << status.dump();
  }
  EXPECT_EQ(status["charts"]["chart-telemetry-memory"]["series"], 4);  // rss + GPU memory, two ranks
  EXPECT_EQ(status["charts"]["heatmap"]["series"], 3);
  // grad norm, clip threshold, the forecast, its band's two edges, the breach, clip coef.
  EXPECT_EQ(status["charts"]["chart-grad"]["series"], 7);
  // The anomalies table links its row to the diagnosis.
  EXPECT_NE(b.dom.find("href=\"#diagnosis-0\""), std::string::npos);
  // The appendix is shown as text (its markup escaped) with its links.
  EXPECT_NE(b.dom.find("href=\"../other/report.html\""), std::string::npos);
  EXPECT_NE(b.dom.find("| a &lt;b&gt; | 1 |"), std::string::npos);
}

TEST(HtmlReportBrowser, ScreenshotHasInkAndAnEmptyRunDoesNot) {
  if (chromium().empty()) GTEST_SKIP() << "Chromium is not installed (scripts/setup.sh installs the chromium package)";
  TempDir dir;
  write_run(dir.path() + "/run");
  std::filesystem::create_directories(dir.path() + "/empty");
  test::write_text(dir.path() + "/empty/metrics.jsonl", "");
  auto ink = [&](const std::string& run, const std::string& png) {
    const Browser b = load(write_html_report(dir.path() + "/" + run), dir, dir.file(png));
    EXPECT_EQ(b.exit_code, 0) << b.log;
    FILE* p = popen(("/usr/bin/python3 " + test::source_path("tests/apps/png_ink.py") + " " + dir.file(png)).c_str(),
                    "r");
    std::string out;
    char buf[512];
    while (p && std::fgets(buf, sizeof buf, p)) out += buf;
    EXPECT_EQ(p ? pclose(p) : -1, 0) << out;
    return Json::parse(out)["colour_fraction"].get<double>();
  };
  const double full = ink("run", "full.png");
  const double empty = ink("empty", "empty.png");
  // Saturated pixels (chart strokes, heatmap): the drawn page has many, the empty one
  // (text, grey panels and a pale notice only) next to none.
  EXPECT_GT(full, 0.01);
  EXPECT_LT(empty, 0.1 * full);
}

TEST(HtmlReportBrowser, EmptyRunSaysSoInsteadOfDrawing) {
  if (chromium().empty()) GTEST_SKIP() << "Chromium is not installed (scripts/setup.sh installs the chromium package)";
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/empty");
  test::write_text(dir.path() + "/empty/metrics.jsonl", "");
  const Browser b = load(write_html_report(dir.path() + "/empty"), dir);
  const Json status = page_status(b);
  ASSERT_FALSE(status.is_null()) << b.log;
  EXPECT_TRUE(status["errors"].empty()) << status.dump();
  EXPECT_FALSE(status["charts"].contains("chart-loss"));
  EXPECT_NE(b.dom.find("no step lines yet"), std::string::npos);
}

}  // namespace
}  // namespace gradguard::report
