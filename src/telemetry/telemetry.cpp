// Telemetry sampler: /proc for the process and a background thread that samples every
// period_ms; the GPU side (NVML, ROCm SMI) lives in gpu_monitor.cpp. See the header for
// the design; here the notes are about units.
#include "gradguard/telemetry/telemetry.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"

namespace gradguard::telemetry {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMaxPeriodMs = 86400000;  // one day; far from steady_clock overflow

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- /proc ----------------------------------------------------------------------------

std::string read_file(const char* path) {
  std::ifstream in(path);
  if (!in) throw runtime_error(path, "cannot read (telemetry needs Linux /proc)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// CPU time of all threads of this process, s; NaN if the clock is unavailable. The
// per-process clock has nanosecond resolution; /proc/self/stat's utime + stime count
// clock ticks (10 ms), too coarse for a 10 ms sampling period.
double process_cpu_seconds() {
  timespec cpu{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) != 0) return kNaN;
  return static_cast<double>(cpu.tv_sec) + cpu.tv_nsec * 1e-9;
}

// The value of "<key>:  <number> kB" in /proc/self/status, in MiB; NaN when absent.
double status_mib(const std::string& status, const std::string& key) {
  const size_t at = status.find("\n" + key + ":");
  if (at == std::string::npos) return kNaN;
  return std::strtod(status.c_str() + at + key.size() + 2, nullptr) / 1024.0;  // kB -> MiB
}

}  // namespace

// ---- options, JSON ---------------------------------------------------------------------

void TelemetryOptions::validate() const {
  if (period_ms < 10 || period_ms > kMaxPeriodMs) {
    throw bad_input("telemetry.period_ms",
                    "must be in [10, 86400000] milliseconds, got " + std::to_string(period_ms));
  }
  if (window < 1) {
    throw bad_input("telemetry.window",
                    "must be >= 1 (samples kept in memory), got " + std::to_string(window));
  }
}

nlohmann::ordered_json to_json(const Sample& sample) {
  const auto number = [](double v) -> nlohmann::ordered_json {
    if (std::isnan(v)) return nullptr;
    return v;
  };
  nlohmann::ordered_json j;
  j["t_s"] = number(sample.t_s);
  j["unix_time"] = number(sample.unix_time);
  j["cpu_percent"] = number(sample.cpu_percent);
  j["rss_mb"] = number(sample.rss_mb);
  j["peak_rss_mb"] = number(sample.peak_rss_mb);
  j["threads"] = sample.threads;
  j["load1"] = number(sample.load1);
  j["gpu_count"] = sample.gpus.size();
  for (const GpuSample& g : sample.gpus) {
    const std::string p = "gpu" + std::to_string(g.index) + "_";
    j[p + "name"] = g.name;
    j[p + "temperature_c"] = number(g.temperature_c);
    j[p + "power_w"] = number(g.power_w);
    j[p + "utilization_pct"] = number(g.utilization_pct);
    j[p + "memory_used_mb"] = number(g.memory_used_mb);
    j[p + "memory_total_mb"] = number(g.memory_total_mb);
    j[p + "sm_clock_mhz"] = number(g.sm_clock_mhz);
    j[p + "memory_clock_mhz"] = number(g.memory_clock_mhz);
    j[p + "throttle_reasons"] = g.throttle_reasons;
  }
  return j;
}

// ---- process stats ---------------------------------------------------------------------

ProcessStats read_process_stats() {
  ProcessStats stats;

  // /proc/self/stat: "pid (comm) state ppid ...". comm may contain spaces and ')', so
  // fields are counted from the last ')'. After it, field 3 (state) is token 0, so
  // utime (14) is token 11, stime (15) token 12, num_threads (20) token 17.
  const std::string stat = read_file("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) throw runtime_error("/proc/self/stat", "unexpected format");
  std::istringstream fields(stat.substr(close + 1));
  std::vector<std::string> tokens;
  for (std::string token; fields >> token && tokens.size() < 18;) tokens.push_back(token);
  if (tokens.size() < 18) throw runtime_error("/proc/self/stat", "unexpected format");
  stats.threads = std::strtoll(tokens[17].c_str(), nullptr, 10);

  stats.cpu_seconds = process_cpu_seconds();
  if (std::isnan(stats.cpu_seconds)) {
    const double ticks =
        std::strtod(tokens[11].c_str(), nullptr) + std::strtod(tokens[12].c_str(), nullptr);
    stats.cpu_seconds = ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  const std::string status = "\n" + read_file("/proc/self/status");
  stats.rss_mb = status_mib(status, "VmRSS");
  stats.peak_rss_mb = status_mib(status, "VmHWM");

  // The load average is context, not essential: a sandbox that hides it gives NaN.
  std::ifstream loadavg("/proc/loadavg");
  if (!(loadavg >> stats.load1)) stats.load1 = kNaN;
  return stats;
}

// ---- Sampler ---------------------------------------------------------------------------

Sampler::Sampler(TelemetryOptions options) : options_(std::move(options)) {
  options_.validate();
  origin_ns_ = previous_wall_ns_ = steady_ns();
  previous_cpu_s_ = process_cpu_seconds();
  if (options_.enabled) {
    gpu_ = open_gpu_monitor(options_.backend, &note_);
  } else {
    note_ = "telemetry disabled (telemetry.enabled = false)";
  }
}

Sampler::~Sampler() {
  stop();
}

void Sampler::start() {
  if (!options_.enabled) return;
  std::lock_guard<std::mutex> control(control_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_alive_) return;
  }
  if (thread_.joinable()) thread_.join();  // ended on an error; start afresh
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = false;
    thread_alive_ = true;
    error_.clear();
  }
  thread_ = std::thread(&Sampler::run, this);
}

void Sampler::stop() {
  std::lock_guard<std::mutex> control(control_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Sampler::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return thread_alive_;
}

void Sampler::run() {
  const auto period = std::chrono::milliseconds(options_.period_ms);
  auto next = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_) {
    lock.unlock();
    std::string failure;
    try {
      sample_now();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    if (!failure.empty()) {  // /proc went away: it will not come back, so stop sampling
      error_ = failure;
      break;
    }
    // Fixed schedule, so samples stay period_ms apart on average; after falling behind
    // (suspended process, slow driver call) the schedule restarts instead of bursting.
    next += period;
    const auto now = std::chrono::steady_clock::now();
    if (next <= now) next = now + period;
    wake_.wait_until(lock, next, [this] { return stop_requested_; });
  }
  thread_alive_ = false;
}

Sample Sampler::sample_now() {
  std::lock_guard<std::mutex> guard(sample_mutex_);
  const int64_t begin = steady_ns();
  Sample sample = take_sample();
  store(sample, steady_ns() - begin);
  return sample;
}

Sample Sampler::take_sample() {
  Sample s;
  // The wall and CPU clocks are read back to back, so cpu_percent compares the same
  // interval (reading the /proc files in between would skew back-to-back samples).
  const int64_t now_ns = steady_ns();
  double cpu_now = process_cpu_seconds();
  const ProcessStats process = read_process_stats();
  if (std::isnan(cpu_now)) cpu_now = process.cpu_seconds;  // tick-based fallback
  s.t_s = (now_ns - origin_ns_) * 1e-9;
  s.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double wall_s = (now_ns - previous_wall_ns_) * 1e-9;
  const double cpu_s = cpu_now - previous_cpu_s_;  // NaN if the clock was unreadable
  s.cpu_percent = wall_s > 0 && cpu_s > 0 ? 100.0 * cpu_s / wall_s : 0.0;
  previous_wall_ns_ = now_ns;
  previous_cpu_s_ = cpu_now;
  s.rss_mb = process.rss_mb;
  s.peak_rss_mb = process.peak_rss_mb;
  s.threads = process.threads;
  s.load1 = process.load1;
  if (gpu_) s.gpus = gpu_->sample();
  return s;
}

void Sampler::store(const Sample& sample, int64_t cost_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  window_.push_back(sample);
  while (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
  pending_.push_back(sample);
  while (static_cast<int64_t>(pending_.size()) > kMaxPending) {
    pending_.pop_front();
    ++dropped_;
  }
  ++taken_;
  total_cost_ns_ += cost_ns;
}

std::vector<Sample> Sampler::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Sample> out(std::make_move_iterator(pending_.begin()),
                          std::make_move_iterator(pending_.end()));
  pending_.clear();
  return out;
}

std::vector<Sample> Sampler::window() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<Sample>(window_.begin(), window_.end());
}

int64_t Sampler::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

int64_t Sampler::samples_taken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return taken_;
}

std::string Sampler::gpu_backend() const {
  return gpu_ ? gpu_->backend() : "none";
}

const std::string& Sampler::note() const {
  return note_;
}

std::string Sampler::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

double Sampler::mean_sample_cost_us() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return taken_ > 0 ? total_cost_ns_ * 1e-3 / static_cast<double>(taken_) : 0.0;
}

}  // namespace gradguard::telemetry
