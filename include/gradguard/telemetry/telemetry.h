// Telemetry: a background thread that samples the process (CPU, memory, threads, load)
// and the GPUs (temperature, power, utilization, memory, clocks, throttling) every
// period_ms, so a run's metrics can show whether a slowdown or a divergence coincided
// with thermal throttling, memory pressure or a busy host.
//
// Why built this way:
// - The process side reads /proc (Linux only), which costs a few microseconds; the
//   sampler measures its own cost per sample (mean_sample_cost_us) so "negligible
//   overhead" is a number in the run's report, not a claim.
// - The GPU side talks to the vendors' management libraries, NVML (NVIDIA) and ROCm SMI
//   (AMD), through dlopen/dlsym only. Nothing links against them and no vendor header
//   is needed, so the same binary runs on a GPU-less machine (GPU telemetry is then
//   simply absent, with a note saying why) and on either vendor's hardware. These
//   libraries report what the driver sees, not what the training process allocated,
//   and they never touch a CUDA/HIP context: sampling adds no device sync.
// - Samples go to two places under one mutex: a bounded window (the last `window`
//   samples, for snapshots and summaries) and a drain queue (everything since the last
//   drain(), for writing every sample to a log exactly once).
// - The thread waits on a condition variable, so stop() returns promptly instead of
//   after up to one period.
// No torch in this module: it must stay cheap to build and usable from any tool.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/core/choice.h"

namespace gradguard::telemetry {

// Every field's key is telemetry.<field>.
// telemetry.backend: where GPU readings come from.
enum class TelemetryBackend { kAuto, kNvml, kRocmSmi, kNone };
constexpr std::array<Choice<TelemetryBackend>, 4> choices(TelemetryBackend) {
  return {{{TelemetryBackend::kAuto, "auto"},
           {TelemetryBackend::kNvml, "nvml"},
           {TelemetryBackend::kRocmSmi, "rocm_smi"},
           {TelemetryBackend::kNone, "none"}}};
}

struct TelemetryOptions {
  bool enabled = true;
  int64_t period_ms = 1000;
  int64_t window = 300;
  TelemetryBackend backend = TelemetryBackend::kAuto;
  void validate() const;  // throws gradguard::Error (bad input) naming telemetry.<field>

  template <class Field>
  void fields(Field&& field) {
    field("enabled", enabled, "a background sampler of process and GPU state; false: no thread, no GPU library opened");
    field("period_ms", period_ms, "sampling period (ms); in [10, 86400000]");
    field("window", window, "samples kept in memory for snapshots; >= 1");
    field("backend", backend,
          "GPU source: auto (NVML, else ROCm SMI) | nvml | rocm_smi | none (no GPU readings; /proc is always read)");
  }
};

// One GPU at one instant. A field the source cannot report (missing symbol, failing
// call, unsupported by the device) is NaN; throttle_reasons is 0 then.
struct GpuSample {
  int64_t index = 0;              // device index as the management library numbers it
                                  // (all GPUs in the machine, not CUDA_VISIBLE_DEVICES)
  std::string name;               // marketing name, e.g. "NVIDIA H200"
  double temperature_c = 0;       // die (NVML) / edge (ROCm) temperature, degrees C
  double power_w = 0;             // board power draw, W
  double utilization_pct = 0;     // percent of the last sample period a kernel was running
  double memory_used_mb = 0;      // device memory in use by all processes, MiB
  double memory_total_mb = 0;     // device memory size, MiB
  double sm_clock_mhz = 0;        // current SM clock, MHz (NaN on ROCm)
  double memory_clock_mhz = 0;    // current memory clock, MHz (NaN on ROCm)
  uint64_t throttle_reasons = 0;  // NVML clocks-throttle bitmask (0: none or unknown)
};

// One sample of the process and the GPUs.
struct Sample {
  double t_s = 0;               // seconds since the Sampler was constructed (steady clock)
  double unix_time = 0;         // seconds since the Unix epoch (system clock)
  double cpu_percent = 0;       // process CPU time / wall time since the previous sample
                                // (the first: since construction); 100 = one core busy
  double rss_mb = 0;            // resident set size, MiB (VmRSS)
  double peak_rss_mb = 0;       // peak resident set size, MiB (VmHWM)
  int64_t threads = 0;          // threads in the process
  double load1 = 0;             // 1-minute system load average
  std::vector<GpuSample> gpus;  // [gpu] empty without GPU telemetry
};

// A flat object, one key per value so a JSON-lines reader gets columns directly:
//   t_s, unix_time, cpu_percent, rss_mb, peak_rss_mb, threads, load1, gpu_count, and per
//   GPU gpu<index>_name, gpu<index>_temperature_c, _power_w, _utilization_pct,
//   _memory_used_mb, _memory_total_mb, _sm_clock_mhz, _memory_clock_mhz, _throttle_reasons.
// NaN is written as null.
nlohmann::ordered_json to_json(const Sample& sample);

// The process as /proc sees it now.
struct ProcessStats {
  double cpu_seconds = 0;  // user + system CPU time of all threads so far, s
  double rss_mb = 0;       // VmRSS, MiB
  double peak_rss_mb = 0;  // VmHWM, MiB
  int64_t threads = 0;     // number of threads
  double load1 = 0;        // 1-minute load average of the machine
};

// Reads /proc/self/stat, /proc/self/status and /proc/loadavg (CPU time comes from
// CLOCK_PROCESS_CPUTIME_ID, which has nanosecond resolution where /proc/self/stat counts
// 10 ms ticks). load1 is NaN where /proc/loadavg is hidden (some sandboxes). Throws
// gradguard::Error (runtime) when /proc/self cannot be read or parsed.
ProcessStats read_process_stats();

// A source of GPU samples. Not thread-safe: one caller at a time (Sampler serialises).
class GpuMonitor {
 public:
  virtual ~GpuMonitor();
  virtual std::string backend() const = 0;      // "nvml" or "rocm_smi"
  virtual std::vector<GpuSample> sample() = 0;  // [gpu] one entry per device; never throws
};

// Opens the GPU management library that `backend` names:
//   nvml:     dlopen($GRADGUARD_NVML_LIBRARY, else "libnvidia-ml.so.1")
//   rocm_smi: dlopen($GRADGUARD_ROCM_SMI_LIBRARY, else "librocm_smi64.so.1",
//             "librocm_smi64.so", "/opt/rocm/lib/librocm_smi64.so.1" in that order)
//   auto:     nvml, then rocm_smi
//   none:     nothing
// Returns nullptr when no library loads, initialises and reports at least one device,
// and then sets *note (if non-null) to why, naming each library tried, e.g. "no GPU
// telemetry: libnvidia-ml.so.1 not found". An explicitly requested backend that
// cannot be loaded is not an error either: the binary must run anywhere. On success
// *note is cleared.
std::unique_ptr<GpuMonitor> open_gpu_monitor(TelemetryBackend backend, std::string* note);

// Samples the process and the GPUs, on a background thread or on request.
// All public methods are thread-safe.
class Sampler {
 public:
  // Validates `options` and opens the GPU monitor (unless disabled); does not start.
  explicit Sampler(TelemetryOptions options);
  ~Sampler();  // stops the thread
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Starts the background thread: one sample immediately, then one every period_ms.
  // Does nothing when disabled or already running. May be called again after stop().
  void start();
  // Stops and joins the thread (prompt: the wait is on a condition variable). Idempotent.
  void stop();
  bool running() const;  // the background thread is sampling

  // Takes one sample now on the calling thread, stores it like a background sample and
  // returns it. Works when disabled too (process stats only), because the caller asked.
  // Throws gradguard::Error (runtime) if /proc cannot be read.
  Sample sample_now();

  // Samples taken since the previous drain(), oldest first. At most kMaxPending are
  // held; older undrained samples are dropped (counted by dropped()).
  std::vector<Sample> drain();
  // The last `window` samples, oldest first.
  std::vector<Sample> window() const;
  // Samples dropped from the drain queue because nobody drained it in time.
  int64_t dropped() const;
  // Total samples taken so far.
  int64_t samples_taken() const;

  std::string gpu_backend() const;  // "nvml", "rocm_smi" or "none"
  const std::string& note() const;  // why GPU telemetry is missing, if it is; else empty
  // The background thread's last error (e.g. /proc unreadable, which ends the thread);
  // empty when there was none.
  std::string error() const;
  // Mean wall time of taking one sample (reading /proc and the GPU library), us; 0
  // before the first sample.
  double mean_sample_cost_us() const;

  const TelemetryOptions& options() const { return options_; }

  static constexpr int64_t kMaxPending = 100000;  // drain-queue cap (~28 h at 1 Hz)

 private:
  Sample take_sample();  // called with sample_mutex_ held
  void store(const Sample& sample, int64_t cost_ns);
  void run();

  TelemetryOptions options_;
  std::unique_ptr<GpuMonitor> gpu_;
  std::string note_;

  // Sampling state, guarded by sample_mutex_ (one sample at a time; the GPU monitor is
  // not thread-safe).
  std::mutex sample_mutex_;
  int64_t origin_ns_ = 0;         // steady clock at construction
  int64_t previous_wall_ns_ = 0;  // steady clock at the previous sample
  double previous_cpu_s_ = 0;     // process CPU seconds at the previous sample

  // Stored samples and statistics, guarded by mutex_.
  mutable std::mutex mutex_;
  std::deque<Sample> window_;   // [sample] oldest first, at most options_.window
  std::deque<Sample> pending_;  // [sample] since the last drain, oldest first
  int64_t dropped_ = 0;
  int64_t taken_ = 0;
  int64_t total_cost_ns_ = 0;
  std::string error_;

  // Thread control: stop_requested_ is guarded by mutex_ (wake_ waits on it); thread_ by
  // control_mutex_, which start() and stop() hold throughout.
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool thread_alive_ = false;  // the thread is sampling (false after stop or an error)
  mutable std::mutex control_mutex_;
  std::thread thread_;
};

}  // namespace gradguard::telemetry
