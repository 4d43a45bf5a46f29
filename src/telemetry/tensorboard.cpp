// TensorBoard event files: the metrics-line tag mapping, a hand-rolled protobuf encoder
// for the three messages involved, TFRecord framing with masked CRC-32C, and the
// whole-file converter. Records are buffered in memory and written with one write(2) per
// flush, so a flush per training step costs a system call, not an fsync; the file is
// append-only, so a reader tailing it sees whole records or a short tail it retries.
#include "gradguard/telemetry/tensorboard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "gradguard/core/crc32c.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/json_number.h"

namespace gradguard::telemetry {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kAutoFlushBytes = size_t{1} << 20;  // flush the buffer past 1 MiB
constexpr const char* kFileVersion = "brain.Event:2";

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- mapping ---------------------------------------------------------------------------

// Appends `value` under `name` when it is a number or bool; recurses into objects.
void flatten(const Json& value, const std::string& name, std::vector<TaggedValue>* out) {
  if (value.is_boolean()) {
    out->push_back({name, value.get<bool>() ? 1.0 : 0.0});
  } else if (value.is_number()) {
    out->push_back({name, value.get<double>()});
  } else if (value.is_object()) {
    for (const auto& [key, inner] : value.items()) flatten(inner, name + "/" + key, out);
  }  // null, strings, arrays: not scalars
}

std::string string_field(const Json& line, const char* key, const char* fallback) {
  const auto it = line.find(key);
  return it != line.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// ---- protobuf wire format --------------------------------------------------------------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void put_key(std::string* out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A double as fixed64 or a float as fixed32: its IEEE bits, little-endian.
template <typename Bits, typename T>
void put_fixed(std::string* out, uint32_t field, T v) {
  static_assert(sizeof(Bits) == sizeof(T), "Bits must be T's size");
  Bits bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, sizeof bits == 8 ? kFixed64 : kFixed32);
  put_le(out, bits, sizeof bits);
}

void put_bytes(std::string* out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out->append(bytes);
}

// Event header: wall_time (1) and step (2, int64 as a two's-complement varint).
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_fixed<uint64_t>(&event, 1, wall_time);
  put_key(&event, 2, kVarint);
  put_varint(&event, static_cast<uint64_t>(step));
  return event;
}

// A double as float32. Out-of-range values become +-inf explicitly: a plain conversion of
// a double beyond FLT_MAX is undefined behaviour.
float to_float(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (v > kMax) return std::numeric_limits<float>::infinity();
  if (v < -kMax) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);
}

uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

// ---- metrics.jsonl reading -------------------------------------------------------------

MetricsLineKind classify_metrics_line(const Json& line) {
  if (!line.is_object())
    throw bad_input("", "a metrics line must be a JSON object, got " + describe(line));
  const auto event = line.find("event");
  if (event == line.end()) {
    return line.contains("val_loss") && !line.contains("loss") ? MetricsLineKind::kValidation
                                                               : MetricsLineKind::kStep;
  }
  if (!event->is_string()) throw bad_input("", "\"event\" must be a string, got " + describe(*event));
  const std::string& name = event->get_ref<const std::string&>();
  if (name == "telemetry") return MetricsLineKind::kTelemetry;
  if (name == "anomaly") return MetricsLineKind::kAnomaly;
  if (name == "recovery") return MetricsLineKind::kRecovery;
  return MetricsLineKind::kOtherEvent;
}

int64_t metrics_line_step(const Json& line) {
  const auto it = line.is_object() ? line.find("step") : line.end();
  if (!line.is_object() || it == line.end()) throw bad_input("", "the line has no \"step\"");
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()})
    return static_cast<int64_t>(it->get<uint64_t>());
  if (it->is_number_integer() && it->get<int64_t>() >= 0) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (v >= 0 && v < 9.2e18 && std::floor(v) == v) return static_cast<int64_t>(v);
  }
  throw bad_input("", "\"step\" must be a non-negative integer, got " + describe(*it));
}

void for_each_metrics_line(const std::string& path, const std::function<void(int64_t, const Json&)>& fn,
                           const std::function<void(int64_t, const std::string&)>& on_bad_line) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw bad_input(path, "is a directory, not a metrics.jsonl file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_input(path, std::string("cannot open: ") + errno_text());
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    const bool unterminated = in.eof();  // getline stopped at the end, not at '\n'
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    Json line;
    try {
      line = parse_ordered_json(text, where, {}, /*require_object=*/false);
    } catch (const Error& e) {
      if (unterminated) return;  // the line a crashed writer left half-written
      if (!on_bad_line) throw;
      on_bad_line(number, e.what());
      continue;
    }
    try {
      fn(number, line);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kBadInput) throw;
      if (!on_bad_line) throw bad_input(where, e.what());
      on_bad_line(number, where + ": " + e.what());
    }
  }
  if (in.bad()) throw bad_input(path, "read failed");
}

// ---- tags ------------------------------------------------------------------------------

std::vector<TaggedValue> metrics_line_scalars(const Json& line) {
  const MetricsLineKind kind = classify_metrics_line(line);
  std::vector<TaggedValue> out;
  std::string prefix;  // for the fields not named below
  switch (kind) {
    case MetricsLineKind::kStep:
      for (const auto& [key, value] : line.items()) {
        if (key == "step") continue;
        if (key == "layer_grad_norms" && value.is_object())
          flatten(value, "layer_grad_norm", &out);
        else
          flatten(value, "train/" + key, &out);
      }
      return out;
    case MetricsLineKind::kValidation:
      for (const auto& [key, value] : line.items())
        if (key != "step")
          flatten(value, "val/" + (key.rfind("val_", 0) == 0 ? key.substr(4) : key), &out);
      return out;
    case MetricsLineKind::kTelemetry: {
      prefix = "telemetry/";
      const auto rank = line.find("rank");
      if (rank != line.end() && rank->is_number_integer()) prefix += "rank" + rank->dump() + "/";
      for (const auto& [key, value] : line.items())
        if (key != "step" && key != "event" && key != "rank" && key != "unix_time")
          flatten(value, prefix + key, &out);
      return out;
    }
    case MetricsLineKind::kAnomaly:
      out.push_back({"guard/anomaly", 1.0});
      prefix = "guard/anomaly/" + string_field(line, "kind", "unknown") + "/";
      break;
    case MetricsLineKind::kRecovery: {
      const auto rung = line.find("rung");
      if (rung != line.end() && rung->is_number())
        out.push_back(
            {"guard/recovery/" + string_field(line, "action", "unknown"), rung->get<double>()});
      prefix = "guard/recovery/";
      break;
    }
    case MetricsLineKind::kOtherEvent:
      prefix = line["event"].get<std::string>() + "/";
      break;
  }
  for (const auto& [key, value] : line.items()) {
    if (key == "step" || key == "event" || (kind == MetricsLineKind::kRecovery && key == "rung"))
      continue;
    flatten(value, prefix + key, &out);
  }
  return out;
}

// ---- writer ----------------------------------------------------------------------------

std::string event_file_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const auto seconds = static_cast<long long>(std::floor(now_unix()));
  return "events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
         std::to_string(::getpid());
}

EventWriter::EventWriter(const std::string& path, EventWriterOptions options) : options_(options) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  if (options_.exact_path) {
    path_ = path;
    std::error_code ec;
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) throw runtime_error(parent.string(), "cannot create directory: " + ec.message());
    fd_ = ::open(path_.c_str(), flags | O_TRUNC, 0644);
    if (fd_ < 0) throw runtime_error(path_, "cannot open for writing: " + errno_text());
  } else {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) throw runtime_error(path, "cannot create directory: " + ec.message());
    const std::string base = path + "/" + event_file_name();
    for (int k = 0; fd_ < 0; ++k) {
      path_ = k == 0 ? base : base + "." + std::to_string(k);
      fd_ = ::open(path_.c_str(), flags | O_EXCL, 0644);
      if (fd_ < 0 && (errno != EEXIST || k == 1000))
        throw runtime_error(path_, "cannot create event file: " + errno_text());
    }
  }
  std::string event =
      event_header(options_.start_wall_time > 0 ? options_.start_wall_time : now_unix(), 0);
  put_bytes(&event, 3, kFileVersion);
  write_record(event);
  if (options_.auto_flush) flush();
}

EventWriter::~EventWriter() {
  try {
    close();
  } catch (const Error&) {  // reported by an explicit close()
  }
}

void EventWriter::write_record(const std::string& data) {
  std::string header;
  put_le(&header, data.size(), 8);
  pending_ += header;
  put_le(&pending_, masked_crc(header.data(), header.size()), 4);
  pending_ += data;
  put_le(&pending_, masked_crc(data.data(), data.size()), 4);
  if (pending_.size() >= kAutoFlushBytes) flush();
}

void EventWriter::write_summary(int64_t step, double wall_time,
                                const std::vector<TaggedValue>& values) {
  std::string summary;
  for (const TaggedValue& v : values) {
    std::string value;
    put_bytes(&value, 1, v.tag);
    put_fixed<uint32_t>(&value, 2, to_float(v.value));
    put_bytes(&summary, 1, value);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(&event, 5, summary);
  write_record(event);
  scalars_ += static_cast<int64_t>(values.size());
  if (options_.auto_flush) flush();
}

void EventWriter::add_scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  write_summary(step, wall_time, {{tag, value}});
}

int64_t EventWriter::add_metrics_line(const Json& line, double wall_time) {
  const std::vector<TaggedValue> values = metrics_line_scalars(line);
  const int64_t step = metrics_line_step(line);
  if (values.empty()) return 0;
  if (classify_metrics_line(line) == MetricsLineKind::kTelemetry) {
    const auto unix_time = line.find("unix_time");
    if (unix_time != line.end() && unix_time->is_number()) wall_time = unix_time->get<double>();
  }
  write_summary(step, wall_time, values);
  return static_cast<int64_t>(values.size());
}

void EventWriter::flush() {
  if (fd_ < 0 || pending_.empty()) return;
  size_t written = 0;
  while (written < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + written, pending_.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = errno_text();
      pending_.erase(0, written);  // a retry must not write those bytes twice
      throw runtime_error(path_, "write failed: " + why);
    }
    written += static_cast<size_t>(n);
  }
  pending_.clear();
}

void EventWriter::close() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw runtime_error(path_, "close failed: " + errno_text());
}

// ---- whole-file conversion -------------------------------------------------------------

namespace {

// Per run segment (see write_tensorboard in the header): what pass 1 learns about `start`.
struct Segment {
  double bound = -std::numeric_limits<double>::infinity();           // max(unix_time - elapsed_s)
  double sampler_origin = std::numeric_limits<double>::quiet_NaN();  // first unix_time - t_s
  double last_elapsed = 0;
  double start = 0;  // resolved estimate, unix seconds
};

double mtime_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return now_unix();
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

}  // namespace

int64_t write_tensorboard(const std::string& metrics_path, const std::string& out_dir,
                          std::vector<std::string>* skipped) {
  // Pass 1: validate every line and collect what estimates each segment's start. A step
  // line whose elapsed_s is below the previous one's begins a new segment (a resume).
  std::vector<Segment> segments(1);
  double elapsed = std::numeric_limits<double>::quiet_NaN();  // of the latest step line
  int64_t last_line = 0;
  std::set<int64_t> bad;  // lines left out
  auto leave_out = [&](int64_t number, const std::string& why) {
    bad.insert(number);
    if (skipped) skipped->push_back(why);
  };
  for_each_metrics_line(metrics_path, [&](int64_t number, const Json& line) {
    last_line = number;
    const MetricsLineKind kind = classify_metrics_line(line);
    metrics_line_step(line);
    if (kind == MetricsLineKind::kStep) {
      const double e = number_or_nan(line, "elapsed_s");
      if (!std::isfinite(e)) return;
      if (e < elapsed) segments.emplace_back();
      segments.back().last_elapsed = elapsed = e;
    } else if (kind == MetricsLineKind::kTelemetry) {
      const double unix_time = number_or_nan(line, "unix_time");
      if (!std::isfinite(unix_time)) return;
      Segment& s = segments.back();
      const double t_s = number_or_nan(line, "t_s");
      if (std::isnan(s.sampler_origin) && std::isfinite(t_s)) s.sampler_origin = unix_time - t_s;
      const double rank = number_or_nan(line, "rank");
      if (std::isfinite(elapsed) && (std::isnan(rank) || rank == 0))
        s.bound = std::max(s.bound, unix_time - elapsed);
    }
  }, leave_out);
  for (size_t i = segments.size(); i-- > 0;) {
    Segment& s = segments[i];
    if (std::isfinite(s.bound))
      s.start = s.bound;
    else if (std::isfinite(s.sampler_origin))
      s.start = s.sampler_origin;
    else if (i + 1 < segments.size())
      s.start = segments[i + 1].start - s.last_elapsed;
    else
      s.start = mtime_of(metrics_path) - s.last_elapsed;
  }

  // Pass 2: write the lines pass 1 saw (a live run may have appended more since). A
  // failure part-way removes the partial file.
  EventWriterOptions options;
  options.auto_flush = false;
  options.start_wall_time = segments.front().start;
  EventWriter writer(out_dir, options);
  try {
    size_t segment = 0;
    elapsed = std::numeric_limits<double>::quiet_NaN();
    double wall_time = segments.front().start;  // of the latest step line
    for_each_metrics_line(metrics_path, [&](int64_t number, const Json& line) {
      if (number > last_line || bad.count(number)) return;
      const double e = number_or_nan(line, "elapsed_s");
      if (classify_metrics_line(line) == MetricsLineKind::kStep && std::isfinite(e)) {
        if (e < elapsed) ++segment;
        elapsed = e;
        wall_time = segments.at(segment).start + e;
      }
      writer.add_metrics_line(line, wall_time);
    }, [](int64_t, const std::string&) {});  // left out in pass 1 already
    writer.close();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(writer.path(), ec);
    throw;
  }
  return writer.scalars();
}

}  // namespace gradguard::telemetry
