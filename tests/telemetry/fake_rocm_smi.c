/* A stand-in for librocm_smi64.so with fixed readings, so the ROCm SMI path of
 * gradguard::telemetry is tested on machines without an AMD driver. It exports the
 * entry points the sampler resolves with dlsym, with ROCm SMI's signatures and units:
 *   GPU i: name "Fake ROCm GPU <i>", edge temperature 55500+1000*i millidegrees C,
 *   average power 300000000 microwatts (300 W), busy 42 %, VRAM 4 GiB used of 64 GiB
 *   (bytes).
 * GPU 1's rsmi_dev_power_ave_get fails and rsmi_dev_current_socket_power_get reports
 * 310 W instead (the MI300 case the sampler falls back for).
 * GRADGUARD_FAKE_GPU_COUNT overrides the device count (default 2);
 * fake_rocm_smi_live_inits() lets a test check that every init was shut down. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { kSuccess = 0, kInvalidArgs = 1, kNotSupported = 2, kInitError = 8 };

static int live_inits = 0;

static uint32_t device_count(void) {
  const char* env = getenv("GRADGUARD_FAKE_GPU_COUNT");
  return env ? (uint32_t)atoi(env) : 2u;
}

int fake_rocm_smi_live_inits(void) {
  return live_inits;
}

int rsmi_init(uint64_t flags) {
  (void)flags;
  ++live_inits;
  return kSuccess;
}
int rsmi_shut_down(void) {
  --live_inits;
  return kSuccess;
}

int rsmi_num_monitor_devices(uint32_t* count) {
  if (live_inits <= 0) return kInitError;
  *count = device_count();
  return kSuccess;
}

int rsmi_dev_name_get(uint32_t dv, char* name, size_t length) {
  if (dv >= device_count()) return kInvalidArgs;
  snprintf(name, length, "Fake ROCm GPU %u", dv);
  return kSuccess;
}

int rsmi_dev_temp_metric_get(uint32_t dv, uint32_t sensor_type, int metric, int64_t* value) {
  if (dv >= device_count() || sensor_type != 0 || metric != 0) return kInvalidArgs;
  *value = 55500 + 1000 * (int64_t)dv;
  return kSuccess;
}

int rsmi_dev_power_ave_get(uint32_t dv, uint32_t sensor, uint64_t* microwatts) {
  if (dv >= device_count() || sensor != 0) return kInvalidArgs;
  if (dv == 1) return kNotSupported;
  *microwatts = 300000000ull;
  return kSuccess;
}

int rsmi_dev_current_socket_power_get(uint32_t dv, uint64_t* microwatts) {
  if (dv >= device_count()) return kInvalidArgs;
  *microwatts = 310000000ull;
  return kSuccess;
}

int rsmi_dev_busy_percent_get(uint32_t dv, uint32_t* percent) {
  if (dv >= device_count()) return kInvalidArgs;
  *percent = 42;
  return kSuccess;
}

int rsmi_dev_memory_usage_get(uint32_t dv, int mem_type, uint64_t* bytes) {
  if (dv >= device_count() || mem_type != 0) return kInvalidArgs;
  *bytes = 4ull << 30;
  return kSuccess;
}

int rsmi_dev_memory_total_get(uint32_t dv, int mem_type, uint64_t* bytes) {
  if (dv >= device_count() || mem_type != 0) return kInvalidArgs;
  *bytes = 64ull << 30;
  return kSuccess;
}
