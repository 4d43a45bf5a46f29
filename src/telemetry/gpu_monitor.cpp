// GPU telemetry through the vendors' management libraries, loaded with dlopen: NVML on
// NVIDIA, ROCm SMI on AMD. The libraries are declared here by hand (the few types and
// entry points we use, from their public C headers) so no SDK is needed to build: a
// symbol that is missing or a call that fails leaves that one field NaN, and only the
// entry points without which nothing works (init, shutdown, device count and handles)
// are required.
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "gradguard/core/error.h"
#include "gradguard/telemetry/telemetry.h"

namespace gradguard::telemetry {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kBytesPerMiB = 1024.0 * 1024.0;

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

}  // namespace

// ---- GPU monitor -----------------------------------------------------------------------

GpuMonitor::~GpuMonitor() = default;

std::unique_ptr<GpuMonitor> open_gpu_monitor(TelemetryBackend backend, std::string* note) {
  std::string ignored;
  std::string& out = note != nullptr ? *note : ignored;
  out.clear();
  if (backend == TelemetryBackend::kNone) {
    out = "GPU telemetry off (telemetry.backend = none)";
    return nullptr;
  }
  std::string reasons;
  if (backend == TelemetryBackend::kAuto || backend == TelemetryBackend::kNvml) {
    std::string why;
    if (auto monitor = NvmlMonitor::open(&why)) return monitor;
    reasons = why;
  }
  if (backend == TelemetryBackend::kAuto || backend == TelemetryBackend::kRocmSmi) {
    std::string why;
    if (auto monitor = RocmSmiMonitor::open(&why)) return monitor;
    reasons += (reasons.empty() ? "" : "; ") + why;
  }
  out = "no GPU telemetry: " + reasons;
  return nullptr;
}

}  // namespace gradguard::telemetry
