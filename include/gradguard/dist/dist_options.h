// Options of data-parallel training (the `dist` config section). How many ranks there
// are and where they meet is not configuration: it comes from the launcher's
// environment (dist/env.h). These options say how the ranks talk once they have met.
#pragma once

#include <cstdint>
#include <string>

namespace gradguard::dist {

struct DistOptions {
  std::string backend = "auto";  // auto (nccl on CUDA/ROCm devices, gloo on CPU) | gloo | nccl
  double timeout_s = 300;        // a collective or rendezvous waiting longer than this fails the run (s, > 0)
  double bucket_mb = 25;         // size of the flat gradient buckets all-reduced during backward (MiB, > 0)
  std::string hook = "none";     // gradient compression: none | fp16 | bf16 | powersgd
  int64_t powersgd_rank = 4;     // PowerSGD: rank of the low-rank approximation (>= 1)
  int64_t powersgd_start_step = 10;  // PowerSGD: plain all-reduce before this step (>= 0)
  int64_t check_every = 100;     // compare a checksum of the weights across ranks every N steps; 0 disables
  double heartbeat_s = 1;        // how often each rank tells the rendezvous store it is alive (s, > 0)

  // Throws gradguard::Error (bad input) naming the key "dist.<field>".
  void validate() const;
};

// The name check of dist.backend alone: throws gradguard::Error (bad input) unless
// `backend` is auto, gloo or nccl.
void check_backend(const std::string& backend);

}  // namespace gradguard::dist
