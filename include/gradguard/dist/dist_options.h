// Options of data-parallel training (the `dist` config section). How many ranks there
// are and where they meet is not configuration: it comes from the launcher's
// environment (dist/env.h). These options say how the ranks talk once they have met.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "gradguard/core/choice.h"

namespace gradguard::dist {

enum class DistBackend { kAuto, kGloo, kNccl };
constexpr std::array<Choice<DistBackend>, 3> choices(DistBackend) {
  return {{{DistBackend::kAuto, "auto"}, {DistBackend::kGloo, "gloo"}, {DistBackend::kNccl, "nccl"}}};
}

// dist.hook: what goes on the wire (dist/grad_sync.h).
enum class CommHook { kNone, kFp16, kBf16, kPowerSgd };
constexpr std::array<Choice<CommHook>, 4> choices(CommHook) {
  return {{{CommHook::kNone, "none"}, {CommHook::kFp16, "fp16"}, {CommHook::kBf16, "bf16"}, {CommHook::kPowerSgd, "powersgd"}}};
}

struct DistOptions {
  DistBackend backend = DistBackend::kAuto;
  double timeout_s = 300;
  double bucket_mb = 25;
  CommHook hook = CommHook::kNone;
  int64_t powersgd_rank = 4;
  int64_t powersgd_start_step = 10;
  int64_t check_every = 100;
  double heartbeat_s = 1;

  // Throws gradguard::Error (bad input) naming the key "dist.<field>".
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("backend", backend, "auto (nccl on CUDA/ROCm devices, gloo on the CPU) | gloo | nccl (RCCL on ROCm)");
    field("timeout_s", timeout_s, "a collective or rendezvous waiting longer than this fails the run (s); > 0");
    field("bucket_mb", bucket_mb, "size of the flat gradient buckets all-reduced during the last backward (MiB); > 0");
    field("hook", hook,
          "gradient compression on the wire: none | fp16 | bf16 (halve the bytes) | powersgd (low-rank, with error "
          "feedback)");
    field("powersgd_rank", powersgd_rank, "PowerSGD: rank of the low-rank approximation; >= 1");
    field("powersgd_start_step", powersgd_start_step, "PowerSGD: plain all-reduce before this step; >= 0");
    field("check_every", check_every, "compare a checksum of the weights across ranks every N steps; 0 disables");
    field("heartbeat_s", heartbeat_s,
          "how often each rank tells the rendezvous store it is alive (s); > 0, at most timeout_s / 3");
  }
};


}  // namespace gradguard::dist
