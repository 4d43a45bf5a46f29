// `report.html`: one self-contained page per run directory, written at the end of every
// run and by `gradguard report RUN_DIR`. The page carries the run's numbers as one JSON
// block plus the code that draws them (uPlot from npm and the report's own script, both
// inlined), so it opens from a mail attachment or an air-gapped cluster without network.
//
// What goes in: every step line of metrics.jsonl (after a rollback only the trajectory
// that was kept, the rolled-back steps marked), validation losses, per-layer gradient
// norms (binned to at most max_heatmap_columns columns, keeping each bin's maximum so a
// one-step spike stays visible), telemetry per rank, anomaly and recovery events with the
// diagnosis.md of each snapshot, and config.yaml. Malformed metrics lines do not stop the
// report: they are listed at the top of the page (a crash can cut the last line short).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::report {

struct HtmlReportOptions {
  std::string out_path;               // "" = <run_dir>/report.html
  int64_t max_heatmap_columns = 1500; // per-layer heatmap columns; more steps are binned (>= 10)
  // A section of text shown after the anomalies ("" = none), e.g. the comparison table of
  // the `bench seed` run this run was part of, with links (label, relative href).
  std::string appendix_title, appendix_text;
  std::vector<std::pair<std::string, std::string>> appendix_links;
  void validate() const;
};

// The numbers the page draws (the JSON embedded in it), read from run_dir. Throws
// gradguard::Error (bad input) naming the path when run_dir has no metrics.jsonl.
nlohmann::ordered_json collect_report_data(const std::string& run_dir, const HtmlReportOptions& options = {});

// Writes the page atomically and returns its path. Throws gradguard::Error like
// collect_report_data, or (runtime) naming the output path when it cannot be written.
std::string write_html_report(const std::string& run_dir, const HtmlReportOptions& options = {});

}  // namespace gradguard::report
