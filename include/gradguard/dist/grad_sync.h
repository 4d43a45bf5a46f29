// Gradient synchronisation of data-parallel training: each rank's gradients summed over
// all ranks, overlapped with the backward pass of the last micro-batch.
//
// Every parameter's .grad is a view into a flat bucket buffer (buckets of ~bucket_mb,
// filled in reverse parameter order, the order backward produces gradients). During
// the last micro-batch of an accumulation window a hook on each parameter's gradient
// accumulator counts the tensors of its bucket; when a bucket is complete it is
// all-reduced at once, while backward goes on with earlier layers. Buckets launch in
// index order on every rank (collectives must match across ranks). Earlier
// micro-batches accumulate locally and communicate nothing.
//
// The loss of each rank is already divided by the token count of the whole global
// batch (train/step.h), so the SUM over ranks is the global-batch gradient: nothing is
// divided by the world size.
//
// Communication hooks (dist.hook) change what goes on the wire:
//   none      the fp32 buffers themselves. The step's side values (loss, per-micro-batch
//             losses, the noise-scale norm) ride in the last bucket: same collective.
//   fp16      each buffer / world_size in fp16, summed, times world_size in fp32. The
//             division keeps the sum within the largest rank's magnitude, so fp16 only
//             overflows where a rank's own gradient would -- and then the inf reaches
//             every rank and the loss scaler backs off, as for any overflow.
//   bf16      bf16 on the wire (fp32's range, 8 bits of mantissa). NCCL sums bf16: as
//             fp16, each buffer / world_size in bf16, all-reduced, times world_size in
//             fp32 (the partial sums are bf16 too). Gloo has no bf16 sum, so there it is
//             an all-gather of the bf16 bytes and a local fp32 sum (exact but for each
//             rank's own rounding).
//   powersgd  Vogels et al. 2019: each matrix gradient M (rows = dim 0) plus this rank's
//             error feedback e is approximated as P Q^T with rank r: P = M Q summed over
//             ranks and orthonormalised, Q = M^T P summed, M_sum ~ P Q^T. The rank keeps
//             e = M - P Q^T / world_size. Q is warm-started from the previous step and
//             seeded identically on every rank. Vectors, and matrices too small to gain,
//             go uncompressed. Before powersgd_start_step: plain all-reduce.
// Gradients of bf16/fp16 working weights (memory.weights_dtype) are bucketed in that dtype;
// with hook none they are summed in float32 (each bucket widened, all-reduced, rounded
// back once), with fp16/bf16 as above; powersgd needs float32 and is refused.
// Non-finite values survive every hook (inf/NaN in any rank's gradient make the sum
// non-finite on all ranks), so every rank takes the same skip decision.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/dist/communicator.h"

namespace gradguard::dist {

class GradSync {
 public:
  // `params` [tensor] must share one dtype (float32, bfloat16 or float16) and device. `side_slots`: length of the
  // float32 side vector summed along with the gradients each step (0 = none).
  GradSync(std::vector<at::Tensor> params, Communicator& comm, const DistOptions& options, int64_t side_slots);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before the step's first backward: zeroes the buckets and makes every .grad the view
  // into its bucket again (in case something replaced it).
  void begin_step(int64_t step);
  // Before the last micro-batch's backward: buckets now all-reduce as they complete.
  // `side` (float32 [side_slots], on the parameters' device) is summed across ranks.
  void arm(const at::Tensor& side);
  // After the last backward: launches what has not launched (parameters without a
  // gradient), waits for everything, decompresses. Returns the summed side vector.
  // Throws gradguard::Error naming the failed rank when a collective fails.
  at::Tensor finish();

  int64_t num_buckets() const;
  int64_t buckets_launched_in_backward() const { return launched_in_backward_; }  // of the last step
  double last_wait_s() const { return last_wait_s_; }  // time finish() spent waiting (s), last step
  int64_t compressed_tensors() const;  // PowerSGD: tensors sent as P/Q factors

  struct Bucket;
  struct Hook;

 private:
  void mark_ready(size_t tensor);
  void launch(size_t bucket);
  bool powersgd_active() const;

  std::vector<at::Tensor> params_;
  Communicator& comm_;
  DistOptions options_;
  std::optional<c10::ScalarType> scaled_wire_;  // wire dtype of the divide-cast-sum hooks, if this is one
  int64_t side_slots_ = 0;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // [bucket] in launch order
  std::vector<size_t> bucket_of_;                 // [tensor] bucket index
  std::vector<int64_t> pending_;                  // [bucket] tensors not yet ready this step
  std::vector<char> ready_;                       // [tensor] gradient final this step
  size_t next_launch_ = 0;
  bool armed_ = false;
  int64_t launched_in_backward_ = 0;
  double last_wait_s_ = 0;
  at::Tensor side_;                  // this step's side vector when it travels on its own
  Communicator::Work side_work_;
  std::shared_ptr<GradSync*> self_;  // the hooks' way back here; nulled by the destructor
  struct PowerState {
    at::Tensor q, error;  // warm-started Q [m, r]; error feedback [n, m]
  };
  std::vector<PowerState> power_;                 // [tensor] PowerSGD state (compressed tensors only)
  std::vector<std::shared_ptr<void>> accumulators_;  // [tensor] grad accumulators the hooks hang on
};

// Makes every rank's parameters equal to rank 0's (one broadcast of a flat copy).
void broadcast_parameters(Communicator& comm, const std::vector<at::Tensor>& params);

// Compares the parameters across ranks bit for bit (an integer sum of each tensor's
// float bits, order-independent, all-reduced as max and -min). Throws gradguard::Error
// (runtime) naming the first tensor that differs and `step`. Syncs with the host.
void verify_parameters(Communicator& comm, const std::vector<at::Tensor>& params,
                       const std::vector<std::string>& names, int64_t step);

}  // namespace gradguard::dist
