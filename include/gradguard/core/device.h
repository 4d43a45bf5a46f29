// What the GPU paths need to measure themselves: which GPU code this build contains,
// the caching allocator's memory statistics, step timing with device events, and a
// count of host<->device synchronisations -- the cost docs/design.md budgets at one per
// guarded step.
//
// The header includes no CUDA header, so every translation unit compiles against a
// CPU-only LibTorch; the CUDA code lives in src/core/device.cpp behind
// GRADGUARD_WITH_CUDA (set by CMake when the LibTorch found was built with CUDA). Where a
// measurement does not exist -- the CPU, a build without CUDA code, a ROCm build for the
// allocator statistics and the sync count -- the functions say so (std::nullopt,
// available() == false) and never report a made-up zero.
//
// Status: the CUDA branches are written against LibTorch 1.13 and 2.x and compiled and
// linked against a CUDA LibTorch 2.6 on machines without a GPU; they have not run on a
// GPU yet (docs/gpu.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

namespace gradguard {

// True when this build contains gradguard's CUDA code (GRADGUARD_WITH_CUDA), i.e. the
// LibTorch it was built against has CUDA. Says nothing about a device being present:
// torch::cuda::is_available() does.
bool cuda_compiled();

// "CUDA", "ROCm" or "CPU": the GPU code this build contains (ROCm builds run the
// device-generic paths only; see src/core/device.cpp).
const char* gpu_build_kind();

// Makes `device` (a GPU with an index) the calling thread's current device, so that work
// LibTorch and c10d start without naming a device -- NCCL communicators, the caching
// allocator's context -- lands on it, not on GPU 0. Device-generic (no CUDA header; ROCm
// builds too). A no-op for the CPU and for a GPU device without an index.
void make_current(const c10::Device& device);

// The caching allocator's counters for one device, in bytes.
struct DeviceMemory {
  int64_t allocated_bytes = 0;       // held by live tensors now
  int64_t allocated_peak_bytes = 0;  // most held by live tensors since the last reset_peak_memory()
  int64_t reserved_bytes = 0;        // reserved from the driver by the allocator now (cached + live)
  int64_t reserved_peak_bytes = 0;   // most reserved since the last reset_peak_memory()
};

// The caching allocator's statistics of a CUDA device (no index: the current one), or
// nullopt on the CPU, in a build without CUDA code, and in ROCm builds. No host sync.
std::optional<DeviceMemory> device_memory(const c10::Device& device);

// Resets the peak counters of device_memory() to the current values. Returns false
// (and does nothing) where device_memory() has no statistics.
bool reset_peak_memory(const c10::Device& device);

// Elapsed time of a stretch of work. On a GPU it records two events with timing on the
// device's current stream, so it measures the device's execution of the work queued
// between start() and stop(), not the host's time to queue it; elsewhere (the CPU, or
// a GPU build whose LibTorch has no usable event timing) it reads the host's steady
// clock at start() and stop().
//
// Reading a device timing needs the stop event to have completed. elapsed_ms() waits
// for it -- a host sync (an event wait, which LibTorch's sync debug mode and so
// SyncCounter do not see: a caller that budgets syncs must count it). try_elapsed_ms()
// never waits: it answers once the stop event has passed, which a training loop gets
// for free by reading the previous step's timer after its own per-step sync (the
// gradient-statistics copy) or one step later. Not thread-safe; reusable (start() again).
class StepTimer {
 public:
  // `device` picks the clock: CUDA (no index: the current device) -> device events.
  explicit StepTimer(const c10::Device& device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  void start();  // records the start event on the current stream / reads the host clock
  void stop();   // records the stop event / reads the host clock

  // Milliseconds between the last start() and stop(). Device events: waits for the stop
  // event (one host sync). Throws c10::Error when start()/stop() were not both called.
  double elapsed_ms();
  // The same value if it is known without waiting, else nullopt. Never syncs.
  std::optional<double> try_elapsed_ms();

  bool device_events() const;  // true when timing with device events
  const char* clock() const;   // "device events" or "host steady_clock"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Counts, on the calling thread while it lives, the c10 warnings that LibTorch's CUDA
// sync debug mode issues ("called a synchronizing CUDA operation"), and forwards every
// other warning to the handler installed before it. It only listens: SyncCounter turns
// the debug mode on. Device-independent, so the counting logic is tested on the CPU by
// issuing that warning by hand. c10's warning handler is per thread: warnings raised on
// other threads are not seen.
class SyncWarningCounter {
 public:
  SyncWarningCounter();
  ~SyncWarningCounter();  // reinstalls the previous handler
  SyncWarningCounter(const SyncWarningCounter&) = delete;
  SyncWarningCounter& operator=(const SyncWarningCounter&) = delete;

  int64_t count() const;  // sync warnings seen so far
  // Whether `message` is LibTorch's sync-debug warning (the text is matched, since c10
  // gives warnings no code).
  static bool is_sync_warning(const std::string& message);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Counts host<->device synchronisations made by the calling thread while it lives: on a
// CUDA device of a CUDA build it turns LibTorch's sync debug mode to "warn" (restoring
// the previous mode at the end) and counts the warnings with a SyncWarningCounter. What
// LibTorch reports as synchronizing is what is counted: .item(), copies to the host,
// blocking host->device copies (all through c10::cuda::memcpy_and_sync),
// c10::cuda::stream_synchronize, and the ops with data-dependent output sizes
// (nonzero, masked_select, ...). Not counted: syncs made on other threads (the debug
// mode is process-wide, so those threads print LibTorch's warning instead), event
// waits (CUDAEvent/c10::Event::synchronize, so StepTimer::elapsed_ms), device-wide
// synchronisation (torch::cuda::synchronize), syncs inside libraries LibTorch calls
// (thrust/cub, cuBLAS workspace setup), and c10d collectives -- LibTorch's docs call
// the mode experimental.
//
// On the CPU, in a build without CUDA code and in ROCm builds it is not available:
// count() is nullopt, never a fake 0.
class SyncCounter {
 public:
  explicit SyncCounter(const c10::Device& device);
  ~SyncCounter();
  SyncCounter(const SyncCounter&) = delete;
  SyncCounter& operator=(const SyncCounter&) = delete;

  bool available() const;
  std::optional<int64_t> count() const;  // syncs so far, or nullopt when not available
  const std::string& unavailable_reason() const;  // "" when available

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradguard
