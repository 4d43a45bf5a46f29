// One worker thread and one slot guarded by a mutex. Every request bumps a generation
// counter; the worker builds the newest request and files the result only if no newer
// request came in meanwhile, so a stale result (a step before a rollback) can never be
// handed out. get() on a key the slot does not hold turns into a request plus a wait,
// so there is one code path and the producer never runs on two threads at once.
#include "gradguard/data/prefetcher.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <utility>

namespace gradguard::data {
namespace {

// CUDA without an index means "the current device", which is per thread: fix it from
// the constructing (training) thread, as the trainer's own .to(device) would resolve it.
c10::Device resolve(c10::Device device) {
  if (!device.is_cuda() || device.has_index()) return device;
  return c10::Device(device.type(), c10::impl::getDeviceGuardImpl(device.type())->getDevice().index());
}

}  // namespace

void move_to_device(StepBatches& batches, const c10::Device& device) {
  // CPU runs never pin: pinning needs a CUDA host allocator, and CPU tensors are already
  // where the step wants them.
  if (!device.is_cuda()) return;
  for (auto& b : batches.micro) {
    // Pinned pages make the copy asynchronous; the caching host allocator keeps the
    // pinned buffer alive until the copy that reads it has finished.
    b.inputs = b.inputs.pin_memory().to(device, /*non_blocking=*/true);
    b.targets = b.targets.pin_memory().to(device, /*non_blocking=*/true);
    if (b.positions.defined()) b.positions = b.positions.pin_memory().to(device, /*non_blocking=*/true);
    if (b.segments.defined()) b.segments = b.segments.pin_memory().to(device, /*non_blocking=*/true);
  }
}

BatchPrefetcher::BatchPrefetcher(Producer producer, c10::Device device)
    : producer_(std::move(producer)), device_(resolve(device)) {
  TORCH_INTERNAL_ASSERT(producer_, "BatchPrefetcher needs a producer");
  worker_ = std::thread([this] { work(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void BatchPrefetcher::request_locked(const Key& key) {
  wanted_ = key;
  ++generation_;
  done_ = false;
  value_ = StepBatches();
  error_ = nullptr;
}

void BatchPrefetcher::prefetch(const Key& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (wanted_ == key) return;
    request_locked(key);
  }
  changed_.notify_all();
}

StepBatches BatchPrefetcher::get(const Key& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wanted_ == key) {
    ++hits_;
  } else {
    ++misses_;
    request_locked(key);
    changed_.notify_all();
  }
  changed_.wait(lock, [&] { return done_; });
  StepBatches out = std::move(value_);
  const std::exception_ptr error = std::exchange(error_, nullptr);
  value_ = StepBatches();
  wanted_.reset();
  done_ = false;
  lock.unlock();
  if (error) std::rethrow_exception(error);
  return out;
}

int64_t BatchPrefetcher::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t BatchPrefetcher::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

void BatchPrefetcher::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || (wanted_.has_value() && !done_); });
    if (stop_) return;
    const Key key = *wanted_;
    const uint64_t generation = generation_;
    lock.unlock();
    StepBatches value;
    std::exception_ptr error;
    try {
      value = producer_(key);
      move_to_device(value, device_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation == generation_ && !stop_) {
      value_ = std::move(value);
      error_ = error;
      done_ = true;
      changed_.notify_all();
    }
    // Otherwise a newer request (or stop) came in: this result is dropped, and the
    // loop picks the newer request up.
  }
}

}  // namespace gradguard::data
