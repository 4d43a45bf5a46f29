// BatchPrefetcher takes building a step's batches off the training loop's critical
// path: while step N computes, one background thread builds step N+1's micro-batches
// (and, on a CUDA device, copies them into pinned memory and starts the host-to-device
// copy), so the loop finds them ready.
//
// It is a single slot keyed by everything the batches depend on that changes during a
// run (for the trainer: the step, the data offset a rollback moves, whether a fault is
// injected). get(key) returns the slot's batches when the slot was filled for that key
// and otherwise throws the slot away and builds them now; so a rollback, a resume or a
// skipped window cannot receive stale batches, and the order stays exactly what the
// producer computes for the key. The producer always runs on the prefetcher's thread,
// one call at a time, and must not touch torch's global RNG or any state the caller
// changes (everything that varies goes through the key). An exception it throws is
// caught there and rethrown, unchanged (same type, same message), by the get() for that
// key; a prefetched request that is never asked for drops its exception with it.
//
// Destruction waits for a producer call in flight to return (it is not interrupted)
// and discards its result; it never waits on a request not yet started.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <c10/core/Device.h>

#include "gradguard/data/step_batches.h"

namespace gradguard::data {

class BatchPrefetcher {
 public:
  // Identifies one request: two equal keys must produce equal batches.
  using Key = std::vector<int64_t>;
  using Producer = std::function<StepBatches(const Key&)>;

  // `device`: where the batches are used. CPU: they stay as the producer built them.
  // CUDA: the inputs and targets are pinned and copied with non_blocking=true on the
  // prefetcher thread's current stream of that device (the default stream, the one
  // the trainer computes on, so the copy is ordered before any use); sample_index
  // stays on the CPU. A CUDA device without an index means the caller's current one.
  explicit BatchPrefetcher(Producer producer, c10::Device device = c10::Device(c10::kCPU));
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Starts building `key`'s batches in the background, replacing what the slot held or
  // was building. A no-op when the slot already holds or builds `key`.
  void prefetch(const Key& key);

  // The batches of `key`: the prefetched ones when the slot holds or builds `key`
  // (waiting for them if need be), else built now. Empties the slot. Rethrows the
  // producer's exception for `key`. Called from one thread.
  StepBatches get(const Key& key);

  int64_t hits() const;    // get() calls the slot already held or built
  int64_t misses() const;  // get() calls that had to start from scratch

 private:
  void work();
  // Makes `key` the slot's request, dropping what it held or built. Needs mutex_ held.
  void request_locked(const Key& key);

  Producer producer_;
  c10::Device device_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a request, a result or stop
  std::optional<Key> wanted_;        // what the slot holds or builds; nullopt = empty
  uint64_t generation_ = 0;          // bumped by every new request: a result of an older one is dropped
  bool done_ = false;                // the slot holds the result for wanted_
  bool stop_ = false;
  StepBatches value_;                // the result when done_ (and no error)
  std::exception_ptr error_;         // the producer's exception when done_
  int64_t hits_ = 0, misses_ = 0;
  std::thread worker_;               // last: started once every member above exists
};

// Moves a step's micro-batches to `device` for the step: nothing on the CPU; on CUDA
// pin_memory() then .to(device, non_blocking=true). No host sync.
void move_to_device(StepBatches& batches, const c10::Device& device);

}  // namespace gradguard::data
