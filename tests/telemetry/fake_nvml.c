/* A stand-in for libnvidia-ml.so.1 with fixed readings, so the NVML path of
 * gradguard::telemetry is tested on machines without an NVIDIA driver. It exports the
 * entry points the sampler resolves with dlsym, with NVML's signatures and units:
 *   GPU i: name "Fake NVML GPU <i>", temperature 60+i C, power 250000+1000*i mW,
 *   utilization 87 %, memory 10 GiB used of 80 GiB (bytes), SM clock 1980 MHz,
 *   memory clock 2619 MHz, clocks-event reasons 0x4 (software power cap).
 * Deliberate gaps the tests rely on: GPU 1 answers nvmlDeviceGetClockInfo with
 * NVML_ERROR_NOT_SUPPORTED (its clocks must read NaN), and the library exports only the
 * newer name nvmlDeviceGetCurrentClocksEventReasons (the sampler must fall back to it).
 * GRADGUARD_FAKE_GPU_COUNT overrides the device count (default 2);
 * fake_nvml_live_inits() lets a test check that every init was shut down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

enum { kSuccess = 0, kInvalidArgument = 2, kNotSupported = 3, kUninitialized = 1 };

static int live_inits = 0;
static struct nvmlDevice_st {
  unsigned int index;
} devices[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

static unsigned int device_count(void) {
  const char* env = getenv("GRADGUARD_FAKE_GPU_COUNT");
  unsigned int n = env ? (unsigned int)atoi(env) : 2u;
  return n > 8 ? 8 : n;
}

int fake_nvml_live_inits(void) {
  return live_inits;
}

int nvmlInit_v2(void) {
  ++live_inits;
  return kSuccess;
}
int nvmlShutdown(void) {
  --live_inits;
  return kSuccess;
}
const char* nvmlErrorString(int rc) {
  return rc == kNotSupported ? "Not Supported" : "Error";
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (live_inits <= 0) return kUninitialized;
  *count = device_count();
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (index >= device_count()) return kInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}

int nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  snprintf(name, length, "Fake NVML GPU %u", device->index);
  return kSuccess;
}

int nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int* celsius) {
  if (sensor != 0) return kInvalidArgument;
  *celsius = 60 + device->index;
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* milliwatts) {
  *milliwatts = 250000 + 1000 * device->index;
  return kSuccess;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* rates) {
  (void)device;
  rates->gpu = 87;
  rates->memory = 40;
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  (void)device;
  memory->total = 80ull << 30;
  memory->used = 10ull << 30;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

int nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int* mhz) {
  if (device->index == 1) return kNotSupported;
  if (type == 1) {
    *mhz = 1980;
    return kSuccess;
  } /* NVML_CLOCK_SM */
  if (type == 2) {
    *mhz = 2619;
    return kSuccess;
  } /* NVML_CLOCK_MEM */
  return kInvalidArgument;
}

int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long* reasons) {
  (void)device;
  *reasons = 0x4ull; /* nvmlClocksEventReasonSwPowerCap */
  return kSuccess;
}
