// CSV export of a run's metrics.jsonl, for spreadsheets, pandas and R: metrics.jsonl mixes
// step, validation and event lines of different shapes; the export splits it into two
// rectangular tables.
//
// steps.csv: one row per step line (see classify_metrics_line in report/tensorboard.h), in
// file order (a rolled-back run repeats steps). Columns: "step", then every field of the
// step lines in first-seen order, nested objects flattened with "/" and the layer norms
// named "layer_grad_norm/<layer>" (as in TensorBoard), then "val_loss": the validation
// line whose step matches the row's. A validation line is written before the step line
// of its step (the trainer validates after `step` steps), so it fills the next step line
// with that step; one left over (the final validation, at step == total steps) fills the
// last row of its step if that cell is empty, or else gets a row of its own at the end
// with only "step" and "val_loss".
//
// telemetry.csv: one row per telemetry line. Columns: "step", then every other field but
// "event" in first-seen order ("rank" for a data-parallel run, gpu0_name, ...).
//
// Cells: numbers in full precision, shortest text that reads back as the same double,
// always with a '.' whatever the locale; bools 1/0; strings as they are; arrays as their
// JSON text; empty for null (NaN/inf in the trainer) and for a field a line lacks. RFC 4180
// quoting (a cell holding , " CR or LF is put in double quotes, inner quotes doubled); rows
// end with LF, which every CSV reader accepts and Unix tools prefer to CRLF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::report {

struct CsvExport {
  std::string steps_path;      // <out_dir>/steps.csv
  std::string telemetry_path;  // <out_dir>/telemetry.csv (header only when there is no telemetry)
  int64_t step_rows = 0;       // rows below the header
  int64_t telemetry_rows = 0;
  std::vector<std::string> skipped;  // "<metrics_path>:<line>: why" for each malformed line left out
};

// Writes steps.csv and telemetry.csv into `out_dir` (created if missing), each atomically
// (temporary file, fsync, rename), so a reader never sees half a table. The input is read
// and checked before anything is written: a malformed line is left out and listed in
// `skipped`; output failures are gradguard::Error (runtime) naming the file.
CsvExport write_csv(const std::string& metrics_path, const std::string& out_dir);

}  // namespace gradguard::report
