// TensorBoard event files from gradguard metrics, without TensorFlow or protobuf.
//
// An event file is a TFRecord stream: each record is
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
//   `length` bytes of data        | uint32 masked CRC-32C of the data,
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. The data is a serialized
// tensorflow.Event protobuf, which has so few fields that it is encoded by hand here:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; every later record is one Event
// whose Summary holds all the scalars of one metrics line (same step and wall time).
// Scalars are float32 on disk (TensorBoard's simple_value): tokens or steps above 2^24 lose
// their last digits, and values beyond float range become +-inf.
//
// Tag mapping, one metrics.jsonl object -> scalars (the "step" field is the step of all):
//   step line (no "event", not a validation line)
//       every numeric or bool field F     -> "train/F"  (bool as 0/1)
//       "layer_grad_norms": {L: x, ...}    -> "layer_grad_norm/L"
//       any other nested object F: {K: x} -> "train/F/K" (recursively)
//   validation line (has "val_loss", no "loss")
//       "val_loss" -> "val/loss"; any other "val_X" -> "val/X"; other fields F -> "val/F"
//   "event": "telemetry"
//       every numeric field F -> "telemetry/F", or "telemetry/rank<R>/F" when the line has an
//       integer "rank"; "unix_time" is not a scalar (it is the event's wall time, and a
//       float32 could not hold it to the second)
//   "event": "anomaly"   -> "guard/anomaly" = 1, plus each numeric field F ->
//                           "guard/anomaly/<kind>/F"
//   "event": "recovery"  -> "guard/recovery/<action>" = rung, plus each other numeric
//                           field F (budget_left, ...) -> "guard/recovery/F"
//   any other "event": E -> each numeric field F -> "E/F"
// Everywhere: null (NaN/inf in the trainer), strings and arrays are skipped; nested
// objects are flattened with "/".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradguard::telemetry {

// ---- metrics.jsonl reading (shared with csv_export) ------------------------------------

enum class MetricsLineKind { kStep, kValidation, kTelemetry, kAnomaly, kRecovery, kOtherEvent };

// Which kind of line this is (see the mapping above). Throws gradguard::Error (bad input)
// when `line` is not an object or its "event" is not a string.
MetricsLineKind classify_metrics_line(const nlohmann::ordered_json& line);

// The line's "step": a non-negative integer (5.0 is accepted). Throws gradguard::Error
// (bad input) when it is missing or anything else.
int64_t metrics_line_step(const nlohmann::ordered_json& line);

// Calls `fn(line_number, object)` for every non-blank line of the metrics.jsonl at `path`
// (line numbers 1-based). A last line without its newline that does not parse is skipped:
// it is the line a crashed trainer was writing. A line that is not JSON (or nested past
// core/json_read.h's limits), and a line `fn` rejects with a bad-input Error, is handed
// to `on_bad_line(line_number, "<path>:<line>: why")` and skipped; without
// `on_bad_line` it is gradguard::Error (bad input) naming "<path>:<line>". A missing file
// is bad input naming the path.
void for_each_metrics_line(const std::string& path,
                           const std::function<void(int64_t, const nlohmann::ordered_json&)>& fn,
                           const std::function<void(int64_t, const std::string&)>& on_bad_line = {});

// ---- tags ------------------------------------------------------------------------------

struct TaggedValue {
  std::string tag;
  double value = 0;
};

// The scalars of one metrics line by the tag mapping above, in field order. Throws as
// classify_metrics_line() does.
std::vector<TaggedValue> metrics_line_scalars(const nlohmann::ordered_json& line);

// ---- writer ----------------------------------------------------------------------------

struct EventWriterOptions {
  // false: the constructor's path is a directory (created if missing) in which a new
  // file named by event_file_name() is created; true: the path is the file itself,
  // created or truncated.
  bool exact_path = false;
  // Hand the records to the OS after every add_scalar()/add_metrics_line() (one write(2),
  // no fsync: a few microseconds), so `tensorboard --logdir` sees a live run and a crash
  // loses nothing already added. false: only flush(), close() and every 1 MiB do.
  bool auto_flush = true;
  // Wall time of the first (file_version) record, unix seconds; 0 = now.
  double start_wall_time = 0;
};

// "events.out.tfevents.<unix seconds>.<hostname>.<pid>". TensorBoard only reads files
// whose name contains "tfevents" and orders a directory's files by name. The seconds and
// hostname alone collide when two processes start a file in the same second (two ranks of
// one job, the trainer and a `report` conversion, a quick restart), and the second would
// then overwrite the first; the pid keeps their names apart. (Within one process the
// writer adds ".1", ".2", ... to a name that already exists.)
std::string event_file_name();

// Not thread-safe: one writer is used by one thread at a time.
class EventWriter {
 public:
  // Opens the event file (see EventWriterOptions::exact_path) and writes the
  // file_version record. Throws gradguard::Error (runtime) naming the path when the
  // directory cannot be created or the file cannot be opened.
  explicit EventWriter(const std::string& path, EventWriterOptions options = {});
  // Flushes and closes; errors are swallowed here, so call close() to see them.
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // The event file being written.
  const std::string& path() const { return path_; }
  // Scalars added so far.
  int64_t scalars() const { return scalars_; }

  // One scalar as one Event. `wall_time`: unix seconds. `value` is stored as float32.
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time);
  // All scalars of one metrics.jsonl object (tag mapping above) as one Event at the line's
  // step. `wall_time` (unix seconds) is used unless the line is telemetry with a numeric
  // "unix_time". Returns the number of scalars (0 writes nothing). Throws gradguard::Error
  // (bad input) for a line classify_metrics_line()/metrics_line_step() reject.
  int64_t add_metrics_line(const nlohmann::ordered_json& line, double wall_time);
  // Hands buffered records to the OS (write(2), no fsync). Throws gradguard::Error
  // (runtime) naming the path when the write fails (e.g. disk full).
  void flush();
  // flush() and close the file; later adds are invariant violations. Throws as flush().
  void close();

 private:
  void write_summary(int64_t step, double wall_time, const std::vector<TaggedValue>& values);
  void write_record(const std::string& data);

  std::string path_;
  EventWriterOptions options_;
  int fd_ = -1;
  std::string pending_;  // framed records not yet written to fd_
  int64_t scalars_ = 0;
};

// Converts a whole metrics.jsonl into one new event file in `out_dir` (created if
// missing) and returns the number of scalars written. Every line is validated before the
// file is created, so a bad line leaves no partial file: gradguard::Error (bad input)
// naming "<metrics_path>:<line>". Output errors are gradguard::Error (runtime).
//
// Wall times. A step line gets start + its "elapsed_s", where `start` (the instant the
// trainer's elapsed clock started) is estimated per run segment (a resumed run restarts
// elapsed_s, which begins a new segment):
//   1. telemetry lines drained after a step line: their sample was taken no later than
//      that step ended, so start >= unix_time - elapsed_s(step); the largest such bound
//      is within one sampling interval of the truth (rank-0 / rank-less lines only);
//   2. else the first telemetry line's unix_time - t_s: the sampler's start, which comes
//      before model setup and the step-0 validation, so it is early by their duration
//      (1-2 s in runs/speed-check, where 1. and 2. can be compared);
//   3. else the next segment's start - this segment's last elapsed_s (a resume straight
//      after), and for the last segment the file's mtime - its last elapsed_s.
// Telemetry lines keep their own unix_time; validation and other event lines get the wall
// time of the latest step line before them (`start` before the first).
// TensorBoard merges every event file of a directory into one run, so convert into a
// directory that holds no other event file of the same run.
// Malformed lines are left out; `skipped`, when given, receives one "<path>:<line>: why"
// for each.
int64_t write_tensorboard(const std::string& metrics_path, const std::string& out_dir,
                          std::vector<std::string>* skipped = nullptr);

}  // namespace gradguard::telemetry
