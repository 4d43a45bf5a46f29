// Device measurements behind a CUDA-free header. Everything that needs a CUDA header is
// under GRADGUARD_WITH_CUDA (CMake sets it when the LibTorch found has CUDA), so a CPU
// build compiles only the portable branches. The version differences of the CUDA-only
// code are kept here rather than in core/compat.h, next to the only code that uses them:
//   - caching-allocator statistics: a free function getDeviceStats(int) in 1.13, an
//     inline wrapper over the allocator object in 2.x whose stats types moved to
//     c10::CachingDeviceAllocator in 2.6; both are read by position (AGGREGATE is index
//     0 in every version), so no version-specific type is named;
//   - event timing: c10::Event gained elapsedTime() for CUDA and HIP in 2.4, so from
//     2.4 on the timer uses the device-generic c10::Event (no CUDA header, and it works
//     in ROCm builds too); before 2.4 CUDA builds use at::cuda::CUDAEvent;
//   - c10 warning handlers: (SourceLocation, msg, verbatim) in c10::Warning:: in 1.x,
//     a c10::Warning object in c10::WarningUtils:: since 2.0 (not CUDA-specific).
//
// ROCm: LibTorch built for ROCm calls its GPUs "cuda" devices but its GPU headers are
// the hipified c10/hip ones, so GRADGUARD_WITH_CUDA stays unset there and only the
// device-generic code runs: event timing (LibTorch >= 2.4). Not covered on ROCm: the
// allocator statistics (nullopt) and the sync counter (not available).
//
// Status: compiled and linked against Debian's CUDA LibTorch 2.6 (scripts/torch2.sh
// --cuda, in CI; the pre-2.4 event branch only syntax-checked against 1.13 headers), but
// not run on a GPU yet.
#include "gradguard/core/device.h"

#include <chrono>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "gradguard/core/compat.h"

#if defined(GRADGUARD_WITH_CUDA) && GRADGUARD_WITH_CUDA
#define GG_CUDA 1
#else
#define GG_CUDA 0
#endif
#if defined(GRADGUARD_WITH_ROCM) && GRADGUARD_WITH_ROCM
#define GG_ROCM 1
#else
#define GG_ROCM 0
#endif
// Device event timing through c10::Event (CUDA and HIP implement elapsedTime from 2.4).
#define GG_GENERIC_EVENTS ((GG_CUDA || GG_ROCM) && GRADGUARD_TORCH_AT_LEAST(2, 4))
// at::cuda::CUDAEvent for CUDA builds older than that.
#define GG_CUDA_EVENTS (GG_CUDA && !GRADGUARD_TORCH_AT_LEAST(2, 4))

#if GG_GENERIC_EVENTS
#include <c10/core/Event.h>
#endif
#if GG_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif
#if GG_CUDA_EVENTS
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace gradguard {

bool cuda_compiled() { return GG_CUDA != 0; }

const char* gpu_build_kind() {
#if GG_CUDA
  return "CUDA";
#elif GG_ROCM
  return "ROCm";
#else
  return "CPU";
#endif
}

void make_current(const c10::Device& device) {
  if (device.is_cpu() || !device.has_index()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

// ---- allocator statistics -------------------------------------------------------------
#if GG_CUDA
namespace {
c10::DeviceIndex cuda_index(const c10::Device& device) {
  // An empty tensor allocates nothing but runs LibTorch's lazy CUDA initialisation,
  // which sets up the caching allocator the statistics come from.
  (void)at::empty({0}, at::TensorOptions().device(device));
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
constexpr size_t kAggregate = 0;  // StatType::AGGREGATE: all pools together
}  // namespace
#endif

std::optional<DeviceMemory> device_memory(const c10::Device& device) {
#if GG_CUDA
  if (!device.is_cuda()) return std::nullopt;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
  DeviceMemory m;
  m.allocated_bytes = stats.allocated_bytes[kAggregate].current;
  m.allocated_peak_bytes = stats.allocated_bytes[kAggregate].peak;
  m.reserved_bytes = stats.reserved_bytes[kAggregate].current;
  m.reserved_peak_bytes = stats.reserved_bytes[kAggregate].peak;
  return m;
#else
  (void)device;
  return std::nullopt;
#endif
}

bool reset_peak_memory(const c10::Device& device) {
#if GG_CUDA
  if (!device.is_cuda()) return false;
  c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
  return true;
#else
  (void)device;
  return false;
#endif
}

// ---- StepTimer ------------------------------------------------------------------------
struct StepTimer::Impl {
  c10::Device device{c10::kCPU};
  bool events = false;  // device events, else the host clock
  bool started = false, stopped = false;
  std::chrono::steady_clock::time_point host_start, host_stop;
#if GG_GENERIC_EVENTS
  // BACKEND_DEFAULT is the backend's default event, which for CUDA/HIP records timing
  // (PYTORCH_DEFAULT disables it).
  std::unique_ptr<c10::Event> start, stop;
  c10::Stream current_stream() const {
    const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
    return guard->getStream(device.has_index() ? device : guard->getDevice());
  }
#elif GG_CUDA_EVENTS
  std::unique_ptr<at::cuda::CUDAEvent> start, stop;
  c10::cuda::CUDAStream current_stream() const {
    return c10::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : c10::cuda::current_device());
  }
#endif
};

StepTimer::StepTimer(const c10::Device& device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
#if GG_GENERIC_EVENTS || GG_CUDA_EVENTS
  impl_->events = device.is_cuda();
#endif
}

StepTimer::~StepTimer() = default;

bool StepTimer::device_events() const { return impl_->events; }
const char* StepTimer::clock() const { return impl_->events ? "device events" : "host steady_clock"; }

void StepTimer::start() {
  auto& s = *impl_;
  s.started = true;
  s.stopped = false;
  if (!s.events) {
    s.host_start = std::chrono::steady_clock::now();
    return;
  }
#if GG_GENERIC_EVENTS
  // Fresh events each time: a c10::Event is bound to the device it first recorded on.
  s.start = std::make_unique<c10::Event>(s.device.type(), c10::EventFlag::BACKEND_DEFAULT);
  s.stop = std::make_unique<c10::Event>(s.device.type(), c10::EventFlag::BACKEND_DEFAULT);
  s.start->record(s.current_stream());
#elif GG_CUDA_EVENTS
  s.start = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);  // cudaEventDefault: with timing
  s.stop = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
  s.start->record(s.current_stream());
#endif
}

void StepTimer::stop() {
  auto& s = *impl_;
  TORCH_CHECK(s.started, "StepTimer::stop() without start()");
  s.stopped = true;
  if (!s.events) {
    s.host_stop = std::chrono::steady_clock::now();
    return;
  }
#if GG_GENERIC_EVENTS || GG_CUDA_EVENTS
  s.stop->record(s.current_stream());
#endif
}

double StepTimer::elapsed_ms() {
  auto& s = *impl_;
  TORCH_CHECK(s.started && s.stopped, "StepTimer: elapsed_ms() needs start() and stop() first");
  if (!s.events) return std::chrono::duration<double, std::milli>(s.host_stop - s.host_start).count();
#if GG_GENERIC_EVENTS
  s.stop->synchronize();  // the host sync of a device timing
  return s.start->elapsedTime(*s.stop);
#elif GG_CUDA_EVENTS
  s.stop->synchronize();
  return static_cast<double>(s.start->elapsed_time(*s.stop));
#else
  TORCH_INTERNAL_ASSERT(false, "device events without a device event implementation");
#endif
}

std::optional<double> StepTimer::try_elapsed_ms() {
  auto& s = *impl_;
  if (!s.started || !s.stopped) return std::nullopt;
  if (!s.events) return elapsed_ms();
#if GG_GENERIC_EVENTS || GG_CUDA_EVENTS
  if (!s.stop->query()) return std::nullopt;  // cudaEventQuery: never blocks
  return elapsed_ms();                        // completed: the synchronize returns at once
#else
  return std::nullopt;
#endif
}

// ---- SyncWarningCounter -----------------------------------------------------------------
namespace {

// The text of c10::cuda::warn_or_error_on_sync(): "called a synchronizing CUDA
// operation" (the same words in every version from 1.10 to 2.x; ROCm's hipified build
// and other backends' copies change only the backend name).
constexpr const char* kSyncWarningText = "called a synchronizing ";

// Counts the sync warnings and hands everything else to the handler it replaced.
class CountingHandler : public c10::WarningHandler {
 public:
  explicit CountingHandler(c10::WarningHandler* previous) : previous_(previous) {}
  int64_t count = 0;

#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override {
    if (SyncWarningCounter::is_sync_warning(warning.msg())) {
      ++count;
      return;
    }
    if (previous_ != nullptr) previous_->process(warning);
  }
#else
  void process(const c10::SourceLocation& location, const std::string& msg, const bool verbatim) override {
    if (SyncWarningCounter::is_sync_warning(msg)) {
      ++count;
      return;
    }
    if (previous_ != nullptr) previous_->process(location, msg, verbatim);
  }
#endif

 private:
  c10::WarningHandler* previous_;
};

c10::WarningHandler* current_warning_handler() {
#if TORCH_VERSION_MAJOR >= 2
  return c10::WarningUtils::get_warning_handler();
#else
  return c10::Warning::get_warning_handler();
#endif
}

void install_warning_handler(c10::WarningHandler* handler) {
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::set_warning_handler(handler);
#else
  c10::Warning::set_warning_handler(handler);
#endif
}

}  // namespace

struct SyncWarningCounter::Impl {
  c10::WarningHandler* previous = nullptr;
  std::unique_ptr<CountingHandler> handler;
};

SyncWarningCounter::SyncWarningCounter() : impl_(std::make_unique<Impl>()) {
  impl_->previous = current_warning_handler();
  impl_->handler = std::make_unique<CountingHandler>(impl_->previous);
  install_warning_handler(impl_->handler.get());
}

SyncWarningCounter::~SyncWarningCounter() { install_warning_handler(impl_->previous); }

int64_t SyncWarningCounter::count() const { return impl_->handler->count; }

bool SyncWarningCounter::is_sync_warning(const std::string& message) {
  return message.find(kSyncWarningText) != std::string::npos;
}

// ---- SyncCounter ------------------------------------------------------------------------
struct SyncCounter::Impl {
  std::string reason;                           // why not available ("" = available)
  std::unique_ptr<SyncWarningCounter> counter;  // set while counting
#if GG_CUDA
  c10::cuda::SyncDebugMode previous_mode = c10::cuda::SyncDebugMode::L_DISABLED;
#endif
};

SyncCounter::SyncCounter(const c10::Device& device) : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda()) {
    impl_->reason = "host syncs are counted on CUDA devices only, not on " + device.str();
    return;
  }
#if GG_CUDA
  auto& state = c10::cuda::warning_state();
  impl_->previous_mode = state.get_sync_debug_mode();
  impl_->counter = std::make_unique<SyncWarningCounter>();
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
#elif GG_ROCM
  impl_->reason = "host syncs are not counted in ROCm builds (LibTorch's sync debug mode lives in c10/hip there)";
#else
  impl_->reason = "this gradguard build has no CUDA code (its LibTorch has no CUDA)";
#endif
}

SyncCounter::~SyncCounter() {
#if GG_CUDA
  if (impl_->counter) c10::cuda::warning_state().set_sync_debug_mode(impl_->previous_mode);
#endif
  impl_->counter.reset();  // reinstalls the previous warning handler
}

bool SyncCounter::available() const { return impl_->counter != nullptr; }

std::optional<int64_t> SyncCounter::count() const {
  if (!impl_->counter) return std::nullopt;
  return impl_->counter->count();
}

const std::string& SyncCounter::unavailable_reason() const { return impl_->reason; }

}  // namespace gradguard
