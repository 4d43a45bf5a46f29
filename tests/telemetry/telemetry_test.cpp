// Telemetry: options validation, /proc reading, the sampler thread (start/stop, drain
// exactly once, bounded window), JSON output, and the GPU paths. The GPU paths run
// against fake_nvml.c / fake_rocm_smi.c, small shared libraries with NVML's and ROCm
// SMI's entry points and fixed readings (built by tests/CMakeLists.txt, paths passed as
// GRADGUARD_FAKE_NVML_PATH / GRADGUARD_FAKE_ROCM_SMI_PATH), so unit conversions and
// fallbacks are checked on any machine. On a machine with a real GPU the "auto" test
// checks the real library instead of the "no GPU" note.
#include "gradguard/telemetry/telemetry.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "gradguard/core/choice.h"
#include "gradguard/core/error.h"

namespace gradguard::telemetry {
namespace {
using ::testing::HasSubstr;

// Sets (or, with nullptr, unsets) an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Expects `fn` to throw a bad-input gradguard::Error naming `key`.
template <typename Fn>
void expect_bad_input(Fn fn, const std::string& key) {
  try {
    fn();
    ADD_FAILURE() << "no error for " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(e.where(), key);
    EXPECT_THAT(e.what(), HasSubstr(key));
  }
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Waits (up to 10 s) until `sampler` has taken at least `n` samples.
bool wait_for_samples(const Sampler& sampler, int64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sampler.samples_taken() < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TelemetryOptions options_with(TelemetryBackend backend, int64_t period_ms = 1000,
                              int64_t window = 300) {
  TelemetryOptions o;
  o.backend = backend;
  o.period_ms = period_ms;
  o.window = window;
  return o;
}

TEST(Telemetry, OptionsValidationNamesTheKey) {
  EXPECT_NO_THROW(TelemetryOptions().validate());
  TelemetryOptions o;
  o.period_ms = 9;
  expect_bad_input([&] { o.validate(); }, "telemetry.period_ms");
  expect_bad_input([&] { Sampler sampler(o); }, "telemetry.period_ms");
  o = TelemetryOptions();
  o.period_ms = 86400001;
  expect_bad_input([&] { o.validate(); }, "telemetry.period_ms");
  o = TelemetryOptions();
  o.window = 0;
  expect_bad_input([&] { o.validate(); }, "telemetry.window");
  // An unknown backend is rejected where the config is read, naming the key and the
  // valid backends; it never reaches the options or open_gpu_monitor.
  try {
    config::load_config("", {"telemetry.backend=cuda"});
    ADD_FAILURE() << "no error for telemetry.backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("telemetry.backend: 'cuda' is not valid (valid: auto, nvml, rocm_smi, none)"));
  }
  expect_bad_input([] { parse_choice<TelemetryBackend>("cuda", "telemetry.backend"); }, "telemetry.backend");
  o = TelemetryOptions();
  o.period_ms = 10;
  o.window = 1;
  for (const char* backend : {"auto", "nvml", "rocm_smi", "none"}) {
    o.backend = parse_choice<TelemetryBackend>(backend, "telemetry.backend");
    EXPECT_STREQ(name_of(o.backend), backend);
    EXPECT_NO_THROW(o.validate()) << backend;
  }
}

TEST(Telemetry, ReadProcessStatsSeesThisProcess) {
  const ProcessStats stats = read_process_stats();
  EXPECT_GT(stats.rss_mb, 0);
  EXPECT_GE(stats.peak_rss_mb, stats.rss_mb * 0.999);
  EXPECT_GE(stats.threads, 1);
  EXPECT_GE(stats.cpu_seconds, 0);
  EXPECT_TRUE(std::isfinite(stats.load1));
  EXPECT_GE(stats.load1, 0);

  // A second thread shows up in the count.
  std::thread extra([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  EXPECT_GE(read_process_stats().threads, stats.threads + 1);
  extra.join();
}

TEST(Telemetry, AutoBackendReportsGpusOrSaysWhyNot) {
  ScopedEnv nvml("GRADGUARD_NVML_LIBRARY", nullptr);
  ScopedEnv rocm("GRADGUARD_ROCM_SMI_LIBRARY", nullptr);
  Sampler sampler(options_with(TelemetryBackend::kAuto));
  const Sample sample = sampler.sample_now();
  if (sampler.gpu_backend() == "none") {  // this machine (no GPU driver)
    EXPECT_TRUE(sample.gpus.empty());
    EXPECT_THAT(sampler.note(), HasSubstr("no GPU telemetry"));
    EXPECT_THAT(sampler.note(), HasSubstr("libnvidia-ml.so.1"));
    EXPECT_THAT(sampler.note(), HasSubstr("librocm_smi64"));
  } else {  // a machine with a real driver
    EXPECT_FALSE(sample.gpus.empty());
    EXPECT_TRUE(sampler.note().empty()) << sampler.note();
    EXPECT_FALSE(sample.gpus[0].name.empty());
    EXPECT_GT(sample.gpus[0].memory_total_mb, 0);
  }
  EXPECT_GT(sample.rss_mb, 0);
  EXPECT_GE(sample.threads, 1);
}

TEST(Telemetry, BackendNoneReadsOnlyProc) {
  Sampler sampler(options_with(TelemetryBackend::kNone));
  EXPECT_EQ(sampler.gpu_backend(), "none");
  EXPECT_THAT(sampler.note(), HasSubstr("telemetry.backend = none"));
  EXPECT_TRUE(sampler.sample_now().gpus.empty());
}

TEST(Telemetry, StartStopDrainsEachSampleOnce) {
  Sampler sampler(options_with(TelemetryBackend::kNone, /*period_ms=*/10, /*window=*/3));
  EXPECT_FALSE(sampler.running());
  sampler.start();
  EXPECT_TRUE(sampler.running());
  sampler.start();  // already running: no second thread
  std::vector<Sample> all;
  ASSERT_TRUE(wait_for_samples(sampler, 3));
  for (const Sample& s : sampler.drain()) all.push_back(s);
  ASSERT_TRUE(wait_for_samples(sampler, 6));
  sampler.stop();
  EXPECT_FALSE(sampler.running());
  for (const Sample& s : sampler.drain()) all.push_back(s);
  EXPECT_TRUE(sampler.drain().empty());
  EXPECT_TRUE(sampler.error().empty()) << sampler.error();

  // Every sample exactly once, in order.
  EXPECT_EQ(static_cast<int64_t>(all.size()), sampler.samples_taken());
  EXPECT_GE(all.size(), 6u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GT(all[i].t_s, all[i - 1].t_s) << i;
  EXPECT_EQ(sampler.dropped(), 0);

  // The window holds the last 3, oldest first.
  const std::vector<Sample> window = sampler.window();
  ASSERT_EQ(window.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(window[i].t_s, all[all.size() - 3 + i].t_s);

  // Stopped: nothing more arrives. Restartable.
  const int64_t taken = sampler.samples_taken();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(sampler.samples_taken(), taken);
  sampler.start();
  ASSERT_TRUE(wait_for_samples(sampler, taken + 1));
  sampler.stop();
  sampler.stop();  // idempotent
}

TEST(Telemetry, StopDoesNotWaitOutThePeriod) {
  Sampler sampler(options_with(TelemetryBackend::kNone, /*period_ms=*/600000));
  sampler.start();
  ASSERT_TRUE(wait_for_samples(sampler, 1));  // the first sample is immediate
  const auto begin = std::chrono::steady_clock::now();
  sampler.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(60));
  EXPECT_EQ(sampler.samples_taken(), 1);
}

TEST(Telemetry, DisabledSamplerNeverStarts) {
  TelemetryOptions o = options_with(TelemetryBackend::kAuto, 10);
  o.enabled = false;
  Sampler sampler(o);
  EXPECT_EQ(sampler.gpu_backend(), "none");
  EXPECT_THAT(sampler.note(), HasSubstr("telemetry.enabled = false"));
  sampler.start();
  EXPECT_FALSE(sampler.running());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(sampler.samples_taken(), 0);
  EXPECT_TRUE(sampler.drain().empty());
}

TEST(Telemetry, CpuPercentReflectsWork) {
  Sampler sampler(options_with(TelemetryBackend::kNone));
  sampler.sample_now();
  // Burn 50 ms of CPU on this thread.
  const double until = process_cpu_seconds() + 0.05;
  volatile double sink = 0;
  while (process_cpu_seconds() < until) {
    for (int i = 0; i < 10000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
  }
  const Sample busy = sampler.sample_now();
  EXPECT_TRUE(std::isfinite(busy.cpu_percent));
  EXPECT_GT(busy.cpu_percent, 0);
  // Two samples back to back: finite and never negative.
  const Sample idle = sampler.sample_now();
  EXPECT_TRUE(std::isfinite(idle.cpu_percent));
  EXPECT_GE(idle.cpu_percent, 0);
  EXPECT_GE(idle.t_s, busy.t_s);
  EXPECT_GT(idle.unix_time, 1.5e9);
}

TEST(Telemetry, SampleCostIsMeasured) {
  Sampler sampler(options_with(TelemetryBackend::kNone));
  EXPECT_EQ(sampler.mean_sample_cost_us(), 0);
  for (int i = 0; i < 5; ++i) sampler.sample_now();
  EXPECT_GT(sampler.mean_sample_cost_us(), 0);
  EXPECT_EQ(sampler.samples_taken(), 5);
}

TEST(Telemetry, ToJsonIsFlatWithNullForNaN) {
  Sample s;
  s.t_s = 1.5;
  s.unix_time = 1.7e9;
  s.cpu_percent = 97.5;
  s.rss_mb = 512;
  s.peak_rss_mb = 600;
  s.threads = 7;
  s.load1 = std::nan("");
  GpuSample g;
  g.index = 3;
  g.name = "GPU";
  g.temperature_c = 70;
  g.power_w = 300;
  g.utilization_pct = 99;
  g.memory_used_mb = 1024;
  g.memory_total_mb = 81920;
  g.sm_clock_mhz = std::nan("");
  g.memory_clock_mhz = 2619;
  g.throttle_reasons = 4;
  s.gpus.push_back(g);

  const nlohmann::ordered_json j = to_json(s);
  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "t_s", "unix_time", "cpu_percent", "rss_mb", "peak_rss_mb", "threads",
                      "load1", "gpu_count", "gpu3_name", "gpu3_temperature_c", "gpu3_power_w",
                      "gpu3_utilization_pct", "gpu3_memory_used_mb", "gpu3_memory_total_mb",
                      "gpu3_sm_clock_mhz", "gpu3_memory_clock_mhz", "gpu3_throttle_reasons"}));
  EXPECT_EQ(j["t_s"], 1.5);
  EXPECT_EQ(j["threads"], 7);
  EXPECT_EQ(j["gpu_count"], 1);
  EXPECT_TRUE(j["load1"].is_null());
  EXPECT_TRUE(j["gpu3_sm_clock_mhz"].is_null());
  EXPECT_EQ(j["gpu3_name"], "GPU");
  EXPECT_EQ(j["gpu3_throttle_reasons"], 4);
  EXPECT_THAT(j.dump(), HasSubstr("\"load1\":null"));

  // A real sample without GPUs has only the process keys.
  Sampler sampler(options_with(TelemetryBackend::kNone));
  const nlohmann::ordered_json real = to_json(sampler.sample_now());
  EXPECT_EQ(real.size(), 8u);
  EXPECT_EQ(real["gpu_count"], 0);
}

TEST(Telemetry, MissingLibraryIsANoteNotAnError) {
  const std::string nvml_path = "/nonexistent/libnvidia-ml.so.1";
  const std::string rocm_path = "/nonexistent/librocm_smi64.so";
  ScopedEnv nvml("GRADGUARD_NVML_LIBRARY", nvml_path.c_str());
  ScopedEnv rocm("GRADGUARD_ROCM_SMI_LIBRARY", rocm_path.c_str());
  std::string note = "stale";
  EXPECT_EQ(open_gpu_monitor(TelemetryBackend::kNvml, &note), nullptr);
  EXPECT_THAT(note, HasSubstr("no GPU telemetry"));
  EXPECT_THAT(note, HasSubstr(nvml_path));
  EXPECT_EQ(open_gpu_monitor(TelemetryBackend::kRocmSmi, &note), nullptr);
  EXPECT_THAT(note, HasSubstr(rocm_path));
  EXPECT_EQ(open_gpu_monitor(TelemetryBackend::kAuto, &note), nullptr);
  EXPECT_THAT(note, HasSubstr(nvml_path));
  EXPECT_THAT(note, HasSubstr(rocm_path));
  EXPECT_EQ(open_gpu_monitor(TelemetryBackend::kNvml, nullptr), nullptr);  // note is optional

  Sampler sampler(options_with(TelemetryBackend::kNvml));
  EXPECT_EQ(sampler.gpu_backend(), "none");
  EXPECT_THAT(sampler.note(), HasSubstr(nvml_path));
  EXPECT_TRUE(sampler.sample_now().gpus.empty());
}

#ifdef GRADGUARD_FAKE_NVML_PATH
// The fake keeps a count of inits minus shutdowns; holding our own handle keeps the
// library (and the count) loaded while monitors open and close it.
int fake_live_inits(void* handle, const char* symbol) {
  auto fn = reinterpret_cast<int (*)()>(dlsym(handle, symbol));
  return fn ? fn() : -1000;
}

TEST(Telemetry, FakeNvmlReportsConvertedUnits) {
  void* handle = dlopen(GRADGUARD_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  ScopedEnv library("GRADGUARD_NVML_LIBRARY", GRADGUARD_FAKE_NVML_PATH);
  ScopedEnv count("GRADGUARD_FAKE_GPU_COUNT", nullptr);
  {
    std::string note = "stale";
    std::unique_ptr<GpuMonitor> monitor = open_gpu_monitor(TelemetryBackend::kNvml, &note);
    ASSERT_NE(monitor, nullptr) << note;
    EXPECT_TRUE(note.empty());
    EXPECT_EQ(monitor->backend(), "nvml");
    EXPECT_EQ(fake_live_inits(handle, "fake_nvml_live_inits"), 1);

    const std::vector<GpuSample> gpus = monitor->sample();
    ASSERT_EQ(gpus.size(), 2u);
    for (int64_t i = 0; i < 2; ++i) {
      const GpuSample& g = gpus[i];
      EXPECT_EQ(g.index, i);
      EXPECT_EQ(g.name, "Fake NVML GPU " + std::to_string(i));
      EXPECT_DOUBLE_EQ(g.temperature_c, 60.0 + i);
      EXPECT_DOUBLE_EQ(g.power_w, 250.0 + i);  // 250000 mW -> 250 W
      EXPECT_DOUBLE_EQ(g.utilization_pct, 87.0);
      EXPECT_DOUBLE_EQ(g.memory_used_mb, 10240.0);   // 10 GiB in bytes -> MiB
      EXPECT_DOUBLE_EQ(g.memory_total_mb, 81920.0);  // 80 GiB
      // Only the newer ClocksEventReasons name is exported: the fallback finds it.
      EXPECT_EQ(g.throttle_reasons, 0x4u);
    }
    EXPECT_DOUBLE_EQ(gpus[0].sm_clock_mhz, 1980.0);
    EXPECT_DOUBLE_EQ(gpus[0].memory_clock_mhz, 2619.0);
    EXPECT_TRUE(std::isnan(gpus[1].sm_clock_mhz));  // NOT_SUPPORTED -> NaN, not failure
    EXPECT_TRUE(std::isnan(gpus[1].memory_clock_mhz));
  }
  EXPECT_EQ(fake_live_inits(handle, "fake_nvml_live_inits"), 0);  // shut down on destruction

  // Through the sampler and into JSON.
  {
    Sampler sampler(options_with(TelemetryBackend::kNvml, 10));
    EXPECT_EQ(sampler.gpu_backend(), "nvml");
    EXPECT_TRUE(sampler.note().empty());
    sampler.start();
    ASSERT_TRUE(wait_for_samples(sampler, 2));
    sampler.stop();
    const std::vector<Sample> samples = sampler.drain();
    ASSERT_GE(samples.size(), 2u);
    const nlohmann::ordered_json j = to_json(samples.back());
    EXPECT_EQ(j["gpu_count"], 2);
    EXPECT_EQ(j["gpu1_name"], "Fake NVML GPU 1");
    EXPECT_EQ(j["gpu0_power_w"], 250.0);
    EXPECT_EQ(j["gpu0_sm_clock_mhz"], 1980.0);
    EXPECT_TRUE(j["gpu1_sm_clock_mhz"].is_null());
  }

  // A driver that sees no GPU: no monitor, a note, and init was undone.
  {
    ScopedEnv none("GRADGUARD_FAKE_GPU_COUNT", "0");
    std::string note;
    EXPECT_EQ(open_gpu_monitor(TelemetryBackend::kNvml, &note), nullptr);
    EXPECT_THAT(note, HasSubstr("reports no GPUs"));
    EXPECT_THAT(note, HasSubstr(GRADGUARD_FAKE_NVML_PATH));
    EXPECT_EQ(fake_live_inits(handle, "fake_nvml_live_inits"), 0);
  }
  dlclose(handle);
}
#endif  // GRADGUARD_FAKE_NVML_PATH

#ifdef GRADGUARD_FAKE_ROCM_SMI_PATH
TEST(Telemetry, FakeRocmSmiReportsConvertedUnits) {
  void* handle = dlopen(GRADGUARD_FAKE_ROCM_SMI_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  ScopedEnv library("GRADGUARD_ROCM_SMI_LIBRARY", GRADGUARD_FAKE_ROCM_SMI_PATH);
  ScopedEnv count("GRADGUARD_FAKE_GPU_COUNT", nullptr);
  {
    std::string note;
    std::unique_ptr<GpuMonitor> monitor = open_gpu_monitor(TelemetryBackend::kRocmSmi, &note);
    ASSERT_NE(monitor, nullptr) << note;
    EXPECT_EQ(monitor->backend(), "rocm_smi");
    auto live = reinterpret_cast<int (*)()>(dlsym(handle, "fake_rocm_smi_live_inits"));
    ASSERT_NE(live, nullptr);
    EXPECT_EQ(live(), 1);

    const std::vector<GpuSample> gpus = monitor->sample();
    ASSERT_EQ(gpus.size(), 2u);
    for (int64_t i = 0; i < 2; ++i) {
      const GpuSample& g = gpus[i];
      EXPECT_EQ(g.index, i);
      EXPECT_EQ(g.name, "Fake ROCm GPU " + std::to_string(i));
      EXPECT_DOUBLE_EQ(g.temperature_c, 55.5 + i);  // millidegrees -> degrees C
      EXPECT_DOUBLE_EQ(g.utilization_pct, 42.0);
      EXPECT_DOUBLE_EQ(g.memory_used_mb, 4096.0);    // 4 GiB in bytes -> MiB
      EXPECT_DOUBLE_EQ(g.memory_total_mb, 65536.0);  // 64 GiB
      EXPECT_TRUE(std::isnan(g.sm_clock_mhz));       // not read on ROCm
      EXPECT_TRUE(std::isnan(g.memory_clock_mhz));
      EXPECT_EQ(g.throttle_reasons, 0u);
    }
    EXPECT_DOUBLE_EQ(gpus[0].power_w, 300.0);  // 300000000 uW -> 300 W (average power)
    EXPECT_DOUBLE_EQ(gpus[1].power_w, 310.0);  // average unsupported: socket power
    monitor.reset();
    EXPECT_EQ(live(), 0);
  }
  {
    Sampler sampler(options_with(TelemetryBackend::kRocmSmi));
    EXPECT_EQ(sampler.gpu_backend(), "rocm_smi");
    EXPECT_EQ(sampler.sample_now().gpus.size(), 2u);
  }
  dlclose(handle);
}
#endif  // GRADGUARD_FAKE_ROCM_SMI_PATH

#if defined(GRADGUARD_FAKE_NVML_PATH) && defined(GRADGUARD_FAKE_ROCM_SMI_PATH)
TEST(Telemetry, AutoPrefersNvmlThenFallsBackToRocmSmi) {
  ScopedEnv rocm("GRADGUARD_ROCM_SMI_LIBRARY", GRADGUARD_FAKE_ROCM_SMI_PATH);
  ScopedEnv count("GRADGUARD_FAKE_GPU_COUNT", nullptr);
  {
    ScopedEnv nvml("GRADGUARD_NVML_LIBRARY", GRADGUARD_FAKE_NVML_PATH);
    Sampler sampler(options_with(TelemetryBackend::kAuto));
    EXPECT_EQ(sampler.gpu_backend(), "nvml");
  }
  {
    ScopedEnv nvml("GRADGUARD_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    Sampler sampler(options_with(TelemetryBackend::kAuto));
    EXPECT_EQ(sampler.gpu_backend(), "rocm_smi");
    EXPECT_TRUE(sampler.note().empty()) << sampler.note();
  }
}
#endif

}  // namespace
}  // namespace gradguard::telemetry
