// Telemetry sampler: /proc for the process, NVML or ROCm SMI (through dlopen) for the
// GPUs, a background thread that samples every period_ms. See the header for the
// design; here the notes are about units and about what each vendor call returns.
//
// The vendor libraries are declared here by hand (the few types and entry points we
// use, from their public C headers) so no SDK is needed to build: a symbol that is
// missing or a call that fails leaves that one field NaN, and only the entry points
// without which nothing works (init, shutdown, device count and handles) are required.
#include "gradguard/telemetry/telemetry.h"

#include <dlfcn.h>
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
constexpr double kBytesPerMiB = 1024.0 * 1024.0;
constexpr int64_t kMaxPeriodMs = 86400000;  // one day; far from steady_clock overflow

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- dlopen ---------------------------------------------------------------------------

// An open shared library; closes it on destruction.
class Library {
 public:
  // nullptr on failure, with *error set to dlerror()'s text.
  static std::unique_ptr<Library> open(const std::string& path, std::string* error) {
    dlerror();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* text = dlerror();
      *error = text != nullptr ? text : "dlopen failed";
      return nullptr;
    }
    return std::unique_ptr<Library>(new Library(handle));
  }
  ~Library() { dlclose(handle_); }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // The symbol as a function pointer of type F, or nullptr when the library lacks it.
  template <typename F>
  F symbol(const char* name) const {
    return reinterpret_cast<F>(dlsym(handle_, name));
  }

 private:
  explicit Library(void* handle) : handle_(handle) {}
  void* handle_;
};

// The library path to try: the override in `env_var` alone when set, else `defaults`.
std::vector<std::string> library_candidates(const char* env_var,
                                            std::vector<std::string> defaults) {
  const char* override_path = std::getenv(env_var);
  if (override_path != nullptr && override_path[0] != '\0') return {override_path};
  return defaults;
}

// Loads the first candidate that opens; on failure *why lists every attempt, e.g.
// "libfoo.so.1, libfoo.so not found" or "libfoo.so.1 not loadable (wrong ELF class)".
std::unique_ptr<Library> open_first(const std::vector<std::string>& candidates, std::string* why) {
  std::vector<std::string> not_found;
  std::string other;
  for (const std::string& path : candidates) {
    std::string error;
    if (auto library = Library::open(path, &error)) return library;
    if (error.find("No such file") != std::string::npos) {
      not_found.push_back(path);
      continue;
    }
    // dlerror() starts with the path; drop it, the message names it already.
    if (error.compare(0, path.size() + 2, path + ": ") == 0) error.erase(0, path.size() + 2);
    other += (other.empty() ? "" : "; ") + path + " not loadable (" + error + ")";
  }
  std::string missing;
  for (const std::string& path : not_found) missing += (missing.empty() ? "" : ", ") + path;
  if (!missing.empty()) missing += " not found";
  *why = missing + (!missing.empty() && !other.empty() ? "; " : "") + other;
  return nullptr;
}

// ---- NVML -----------------------------------------------------------------------------
// Types from nvml.h. Every NVML call returns nvmlReturn_t, 0 = NVML_SUCCESS.

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the last sample period a kernel was executing
  unsigned int memory;  // percent of it device memory was being read or written
};
struct nvmlMemory_t {  // v1 layout, bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr int kNvmlTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU: the die sensor
constexpr int kNvmlClockSm = 1;           // NVML_CLOCK_SM
constexpr int kNvmlClockMem = 2;          // NVML_CLOCK_MEM
constexpr unsigned kNvmlNameLength = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

class NvmlMonitor final : public GpuMonitor {
 public:
  // nullptr with *why set when the library is absent, fails to initialise or sees no GPU.
  static std::unique_ptr<GpuMonitor> open(std::string* why) {
    const auto candidates = library_candidates("GRADGUARD_NVML_LIBRARY", {"libnvidia-ml.so.1"});
    auto library = open_first(candidates, why);
    if (!library) return nullptr;
    std::unique_ptr<NvmlMonitor> monitor(new NvmlMonitor(std::move(library)));
    if (!monitor->init(candidates.front(), why)) return nullptr;
    return monitor;
  }

  ~NvmlMonitor() override {
    if (initialised_) shutdown_();
  }

  std::string backend() const override { return "nvml"; }

  std::vector<GpuSample> sample() override {
    std::vector<GpuSample> gpus;
    gpus.reserve(devices_.size());
    for (size_t i = 0; i < devices_.size(); ++i) {
      nvmlDevice_t device = devices_[i];
      GpuSample g;
      g.index = static_cast<int64_t>(i);
      g.name = names_[i];
      unsigned int value = 0;
      g.temperature_c =
          temperature_ && temperature_(device, kNvmlTemperatureGpu, &value) == 0 ? value : kNaN;
      g.power_w = power_ && power_(device, &value) == 0 ? value / 1000.0 : kNaN;  // mW -> W
      nvmlUtilization_t utilization{};
      g.utilization_pct =
          utilization_ && utilization_(device, &utilization) == 0 ? utilization.gpu : kNaN;
      nvmlMemory_t memory{};
      if (memory_ && memory_(device, &memory) == 0) {
        g.memory_used_mb = memory.used / kBytesPerMiB;
        g.memory_total_mb = memory.total / kBytesPerMiB;
      } else {
        g.memory_used_mb = g.memory_total_mb = kNaN;
      }
      g.sm_clock_mhz = clock_ && clock_(device, kNvmlClockSm, &value) == 0 ? value : kNaN;
      g.memory_clock_mhz = clock_ && clock_(device, kNvmlClockMem, &value) == 0 ? value : kNaN;
      unsigned long long reasons = 0;
      g.throttle_reasons = throttle_ && throttle_(device, &reasons) == 0 ? reasons : 0;
      gpus.push_back(std::move(g));
    }
    return gpus;
  }

 private:
  explicit NvmlMonitor(std::unique_ptr<Library> library) : library_(std::move(library)) {}

  bool init(const std::string& path, std::string* why) {
    const auto init = library_->symbol<nvmlReturn_t (*)()>("nvmlInit_v2");
    shutdown_ = library_->symbol<nvmlReturn_t (*)()>("nvmlShutdown");
    const auto count = library_->symbol<nvmlReturn_t (*)(unsigned int*)>("nvmlDeviceGetCount_v2");
    const auto handle = library_->symbol<nvmlReturn_t (*)(unsigned int, nvmlDevice_t*)>(
        "nvmlDeviceGetHandleByIndex_v2");
    if (!init || !shutdown_ || !count || !handle) {
      *why = path +
             " lacks nvmlInit_v2/nvmlShutdown/nvmlDeviceGetCount_v2/"
             "nvmlDeviceGetHandleByIndex_v2 (driver too old?)";
      return false;
    }
    if (const nvmlReturn_t rc = init(); rc != 0) {
      *why = path + ": nvmlInit_v2 failed (" + error_string(rc) + ")";
      return false;
    }
    initialised_ = true;
    unsigned int n = 0;
    if (const nvmlReturn_t rc = count(&n); rc != 0) {
      *why = path + ": nvmlDeviceGetCount_v2 failed (" + error_string(rc) + ")";
      return false;
    }
    if (n == 0) {
      *why = path + " reports no GPUs";
      return false;
    }
    const auto name =
        library_->symbol<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int)>("nvmlDeviceGetName");
    for (unsigned int i = 0; i < n; ++i) {
      nvmlDevice_t device = nullptr;
      if (const nvmlReturn_t rc = handle(i, &device); rc != 0) {
        *why = path + ": nvmlDeviceGetHandleByIndex_v2(" + std::to_string(i) + ") failed (" +
               error_string(rc) + ")";
        return false;
      }
      char buffer[kNvmlNameLength] = {};
      devices_.push_back(device);
      names_.emplace_back(name && name(device, buffer, kNvmlNameLength) == 0 ? buffer : "");
    }
    temperature_ = library_->symbol<decltype(temperature_)>("nvmlDeviceGetTemperature");
    power_ = library_->symbol<decltype(power_)>("nvmlDeviceGetPowerUsage");
    utilization_ = library_->symbol<decltype(utilization_)>("nvmlDeviceGetUtilizationRates");
    memory_ = library_->symbol<decltype(memory_)>("nvmlDeviceGetMemoryInfo");
    clock_ = library_->symbol<decltype(clock_)>("nvmlDeviceGetClockInfo");
    // Renamed "ClocksEventReasons" in recent drivers; the old name remains as an alias
    // there, but a future driver may drop it.
    throttle_ = library_->symbol<decltype(throttle_)>("nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!throttle_) {
      throttle_ = library_->symbol<decltype(throttle_)>("nvmlDeviceGetCurrentClocksEventReasons");
    }
    why->clear();
    return true;
  }

  std::string error_string(nvmlReturn_t rc) const {
    const auto text = library_->symbol<const char* (*)(nvmlReturn_t)>("nvmlErrorString");
    const char* message = text ? text(rc) : nullptr;
    return "NVML error " + std::to_string(rc) + (message ? std::string(": ") + message : "");
  }

  std::unique_ptr<Library> library_;
  bool initialised_ = false;
  std::vector<nvmlDevice_t> devices_;  // [gpu]
  std::vector<std::string> names_;     // [gpu]
  nvmlReturn_t (*shutdown_)() = nullptr;
  nvmlReturn_t (*temperature_)(nvmlDevice_t, int, unsigned int*) = nullptr;  // degrees C
  nvmlReturn_t (*power_)(nvmlDevice_t, unsigned int*) = nullptr;             // milliwatts
  nvmlReturn_t (*utilization_)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;  // percent
  nvmlReturn_t (*memory_)(nvmlDevice_t, nvmlMemory_t*) = nullptr;            // bytes
  nvmlReturn_t (*clock_)(nvmlDevice_t, int, unsigned int*) = nullptr;        // MHz
  nvmlReturn_t (*throttle_)(nvmlDevice_t, unsigned long long*) = nullptr;    // bitmask
};

// ---- ROCm SMI -------------------------------------------------------------------------
// From rocm_smi.h. Every call returns rsmi_status_t, 0 = RSMI_STATUS_SUCCESS.
//
// Clocks are left NaN: rsmi_dev_gpu_clk_freq_get fills an rsmi_frequencies_t whose layout
// changed between ROCm releases (ROCm 6 inserted a has_deep_sleep field before the
// frequency array and grew the array from 32 to 33 entries), so reading it through a
// hand-written struct would report garbage on one release or the other.

using rsmi_status_t = int;
constexpr uint32_t kRsmiTempTypeEdge = 0;  // RSMI_TEMP_TYPE_EDGE
constexpr int kRsmiTempCurrent = 0;        // RSMI_TEMP_CURRENT
constexpr int kRsmiMemTypeVram = 0;        // RSMI_MEM_TYPE_VRAM
constexpr size_t kRsmiNameLength = 256;

class RocmSmiMonitor final : public GpuMonitor {
 public:
  static std::unique_ptr<GpuMonitor> open(std::string* why) {
    const auto candidates = library_candidates(
        "GRADGUARD_ROCM_SMI_LIBRARY",
        {"librocm_smi64.so.1", "librocm_smi64.so", "/opt/rocm/lib/librocm_smi64.so.1"});
    auto library = open_first(candidates, why);
    if (!library) return nullptr;
    std::unique_ptr<RocmSmiMonitor> monitor(new RocmSmiMonitor(std::move(library)));
    if (!monitor->init(candidates.front(), why)) return nullptr;
    return monitor;
  }

  ~RocmSmiMonitor() override {
    if (initialised_) shut_down_();
  }

  std::string backend() const override { return "rocm_smi"; }

  std::vector<GpuSample> sample() override {
    std::vector<GpuSample> gpus;
    gpus.reserve(names_.size());
    for (uint32_t i = 0; i < names_.size(); ++i) {
      GpuSample g;
      g.index = i;
      g.name = names_[i];
      int64_t millidegrees = 0;
      g.temperature_c =
          temperature_ && temperature_(i, kRsmiTempTypeEdge, kRsmiTempCurrent, &millidegrees) == 0
              ? millidegrees / 1000.0
              : kNaN;
      // Average power over the driver's short window; MI300-class parts report only the
      // current socket power, so that is the fallback.
      uint64_t microwatts = 0;
      if (power_ave_ && power_ave_(i, 0, &microwatts) == 0) {
        g.power_w = microwatts / 1e6;
      } else if (socket_power_ && socket_power_(i, &microwatts) == 0) {
        g.power_w = microwatts / 1e6;
      } else {
        g.power_w = kNaN;
      }
      uint32_t busy = 0;
      g.utilization_pct = busy_ && busy_(i, &busy) == 0 ? busy : kNaN;
      uint64_t bytes = 0;
      g.memory_used_mb = memory_used_ && memory_used_(i, kRsmiMemTypeVram, &bytes) == 0
                             ? bytes / kBytesPerMiB
                             : kNaN;
      g.memory_total_mb = memory_total_ && memory_total_(i, kRsmiMemTypeVram, &bytes) == 0
                              ? bytes / kBytesPerMiB
                              : kNaN;
      g.sm_clock_mhz = kNaN;  // see the note above the class
      g.memory_clock_mhz = kNaN;
      g.throttle_reasons = 0;  // ROCm SMI has no equivalent bitmask
      gpus.push_back(std::move(g));
    }
    return gpus;
  }

 private:
  explicit RocmSmiMonitor(std::unique_ptr<Library> library) : library_(std::move(library)) {}

  bool init(const std::string& path, std::string* why) {
    const auto init = library_->symbol<rsmi_status_t (*)(uint64_t)>("rsmi_init");
    shut_down_ = library_->symbol<rsmi_status_t (*)()>("rsmi_shut_down");
    const auto count = library_->symbol<rsmi_status_t (*)(uint32_t*)>("rsmi_num_monitor_devices");
    if (!init || !shut_down_ || !count) {
      *why = path + " lacks rsmi_init/rsmi_shut_down/rsmi_num_monitor_devices";
      return false;
    }
    if (const rsmi_status_t rc = init(0); rc != 0) {
      *why = path + ": rsmi_init failed (status " + std::to_string(rc) + ")";
      return false;
    }
    initialised_ = true;
    uint32_t n = 0;
    if (const rsmi_status_t rc = count(&n); rc != 0) {
      *why = path + ": rsmi_num_monitor_devices failed (status " + std::to_string(rc) + ")";
      return false;
    }
    if (n == 0) {
      *why = path + " reports no GPUs";
      return false;
    }
    const auto name =
        library_->symbol<rsmi_status_t (*)(uint32_t, char*, size_t)>("rsmi_dev_name_get");
    for (uint32_t i = 0; i < n; ++i) {
      char buffer[kRsmiNameLength] = {};
      names_.emplace_back(name && name(i, buffer, kRsmiNameLength) == 0 ? buffer : "");
    }
    temperature_ = library_->symbol<decltype(temperature_)>("rsmi_dev_temp_metric_get");
    power_ave_ = library_->symbol<decltype(power_ave_)>("rsmi_dev_power_ave_get");
    socket_power_ = library_->symbol<decltype(socket_power_)>("rsmi_dev_current_socket_power_get");
    busy_ = library_->symbol<decltype(busy_)>("rsmi_dev_busy_percent_get");
    memory_used_ = library_->symbol<decltype(memory_used_)>("rsmi_dev_memory_usage_get");
    memory_total_ = library_->symbol<decltype(memory_total_)>("rsmi_dev_memory_total_get");
    why->clear();
    return true;
  }

  std::unique_ptr<Library> library_;
  bool initialised_ = false;
  std::vector<std::string> names_;  // [gpu]
  rsmi_status_t (*shut_down_)() = nullptr;
  rsmi_status_t (*temperature_)(uint32_t, uint32_t, int, int64_t*) = nullptr;  // millidegrees C
  rsmi_status_t (*power_ave_)(uint32_t, uint32_t, uint64_t*) = nullptr;        // microwatts
  rsmi_status_t (*socket_power_)(uint32_t, uint64_t*) = nullptr;               // microwatts
  rsmi_status_t (*busy_)(uint32_t, uint32_t*) = nullptr;                       // percent
  rsmi_status_t (*memory_used_)(uint32_t, int, uint64_t*) = nullptr;           // bytes
  rsmi_status_t (*memory_total_)(uint32_t, int, uint64_t*) = nullptr;          // bytes
};

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
  if (backend != "auto" && backend != "nvml" && backend != "rocm_smi" && backend != "none") {
    throw bad_input("telemetry.backend",
                    "must be one of auto, nvml, rocm_smi, none; got \"" + backend + "\"");
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

// ---- GPU monitor -----------------------------------------------------------------------

GpuMonitor::~GpuMonitor() = default;

std::unique_ptr<GpuMonitor> open_gpu_monitor(const std::string& backend, std::string* note) {
  std::string ignored;
  std::string& out = note != nullptr ? *note : ignored;
  out.clear();
  if (backend == "none") {
    out = "GPU telemetry off (telemetry.backend = none)";
    return nullptr;
  }
  if (backend != "auto" && backend != "nvml" && backend != "rocm_smi") {
    throw bad_input("telemetry.backend",
                    "must be one of auto, nvml, rocm_smi, none; got \"" + backend + "\"");
  }
  std::string reasons;
  if (backend == "auto" || backend == "nvml") {
    std::string why;
    if (auto monitor = NvmlMonitor::open(&why)) return monitor;
    reasons = why;
  }
  if (backend == "auto" || backend == "rocm_smi") {
    std::string why;
    if (auto monitor = RocmSmiMonitor::open(&why)) return monitor;
    reasons += (reasons.empty() ? "" : "; ") + why;
  }
  out = "no GPU telemetry: " + reasons;
  return nullptr;
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
