// The ranks of a data-parallel run and the collectives between them, on PyTorch's own
// distributed engine: a c10d TCPStore rendezvous (hosted by rank 0 at MASTER_ADDR:
// MASTER_PORT) and a c10d process group -- Gloo on CPU, NCCL (RCCL on ROCm) on GPUs.
//
// A distributed run must never hang silently. Every collective has the configured
// timeout; when one fails (a peer died, a socket closed, the timeout passed) the
// Communicator turns the c10d/Gloo exception into a gradguard::Error that says which
// rank failed. It knows because every rank heart-beats into the store from a
// background thread (its own store connection) and a rank that fails with an error
// leaves its message in the store before it exits: the survivor reads both. On NCCL
// collectives fail on the device, not in wait(): c10d's watchdog stops a rank whose
// collective outlives the timeout (docs/distributed.md, "Failures and timeouts"). c10d
// headers stay in communicator.cpp; this header only needs ATen's Tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/dist/dist_options.h"
#include "gradguard/dist/env.h"

namespace gradguard::dist {

// Whether this build contains c10d's NCCL process group: a CUDA LibTorch, or a ROCm one
// (where c10d's "nccl" backend is RCCL).
bool nccl_compiled();

// The c10d backend for dist.backend = `requested` (auto | gloo | nccl) on `device`:
// auto is nccl on a GPU and gloo on the CPU. NCCL runs on GPUs only and needs a build
// with it (`nccl_built`); Gloo here runs on the CPU only. Any other combination throws
// gradguard::Error (bad input, "dist.backend") saying what would work.
DistBackend choose_backend(DistBackend requested, const c10::Device& device, bool nccl_built);

class Communicator {
 public:
  // Meets the other ranks (rank 0 hosts the store) and creates the process group on
  // `device`'s backend. Throws gradguard::Error (runtime) naming the rendezvous address
  // when the others do not arrive within options.timeout_s.
  Communicator(const DistEnv& env, const DistOptions& options, const c10::Device& device);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int64_t rank() const { return env_.rank; }
  int64_t world_size() const { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  DistBackend backend() const { return backend_; }
  // Whether the backend sums bfloat16 tensors (NCCL does; Gloo does not).
  bool sums_bf16() const { return backend_ == DistBackend::kNccl; }
  const DistOptions& options() const { return options_; }

  // A collective in flight. wait() blocks until it is done (no device->host copy);
  // failures become gradguard::Error naming the failed rank.
  class Work {
   public:
    Work() = default;
    void wait();
    bool pending() const { return impl_ != nullptr; }

   private:
    friend class Communicator;
    std::shared_ptr<void> impl_;
    const Communicator* comm_ = nullptr;
    std::string what_;
  };

  // Sum of `tensor` over all ranks, in place. `what` names the collective in errors.
  Work allreduce_sum_async(at::Tensor tensor, const std::string& what);
  void allreduce_sum(at::Tensor tensor, const std::string& what);
  void allreduce_max(at::Tensor tensor, const std::string& what);
  // Sum of `tensor` over all ranks into `root`'s `tensor`, asynchronously; the other ranks'
  // `tensor` is left undefined. Gloo and NCCL both have it (Gloo in LibTorch 1.13 has no
  // reduce-scatter: a reduce per owner stands in for it, dist/grad_shard_sync.h).
  Work reduce_sum_async(at::Tensor tensor, int64_t root, const std::string& what);
  // Rank 0's values into `tensors` on every rank, in place.
  void broadcast(std::vector<at::Tensor> tensors, const std::string& what);
  // Every rank's `input` into outputs[rank] (each shaped like `input`), asynchronously.
  Work allgather_async(const at::Tensor& input, std::vector<at::Tensor> outputs, const std::string& what);
  // Rank 0's string on every rank.
  std::string broadcast_string(const std::string& value, const std::string& what);

  // Every rank reports how `phase` went ("" = fine, else its error message) and waits
  // for all others; throws gradguard::Error when any rank failed, naming it and quoting
  // its message. Uses the store, not the process group, so it also works before the
  // group exists and after a collective broke.
  void agree(const std::string& phase, const std::string& error);

  // Leaves this rank's fatal error in the store for the others to quote. Never throws.
  void report_failure(const std::string& message) noexcept;

  // A side channel through the store for small, infrequent payloads that must not cost
  // a collective (per-rank telemetry): publish() from any rank, collect() on rank 0
  // returns the payloads published since the last collect(), as (rank, payload).
  void publish(const std::string& channel, const std::string& payload);
  std::vector<std::pair<int64_t, std::string>> collect(const std::string& channel);

  // Why the ranks stopped talking: the ranks that reported a failure, the ranks whose
  // heartbeat stopped, or that the store (rank 0) is gone. Waits ~2 heartbeats.
  std::string explain_failure() const;

  struct Impl;  // the store, the process group, the heartbeat thread

 private:
  [[noreturn]] void fail(const std::string& what, const std::exception& e) const;
  // Starts the collective `op` (a callable on the process group) as a Work; failures to
  // start become fail(what, ...).
  template <class Op>
  Work start(const std::string& what, Op&& op);

  DistEnv env_;
  DistOptions options_;
  DistBackend backend_ = DistBackend::kGloo;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradguard::dist
