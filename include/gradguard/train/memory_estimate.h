// The memory a run needs per rank, before any tensor exists: pure arithmetic over the
// model's shapes and the run's layout. One function answers "how many bytes per rank" for
// `gradguard plan` (apps/plan.h), doctor's memory.plan check and tune's micro-batch.
//
// Per rank (W ranks; P parameters, Pt of them trained; w bytes per working weight):
//   weights      P w
//   gradients    Pt w                         (the flat buckets .grad points into); with
//                                              zero_stage 2 on W > 1 ranks instead
//                                              w ceil(Pt / W) (the shard) + the float32
//                                              buckets in flight (3 x dist.bucket_mb, at
//                                              most 4 Pt) + the largest trained tensor's
//                                              gradient w (autograd's, before it is bucketed)
//   optimizer    Pt (2 s + 4 m) / d           AdamW's m and v (s = 4 with masters or fp32
//                                              weights, else w) and float32 masters (m = 1
//                                              when kept); d = W with zero_stage 1 or 2, else 1;
//                                              in host memory with offload_optimizer
//   activations  per micro-batch: what autograd keeps for backward, counted from this
//                implementation's layer (model/llama.cpp) per token and layer:
//                  r (2 h)                       the two RMSNorm inputs (residual stream, r bytes)
//                  c (2 h + 2 q + 2 kv + 3 i)    normed inputs of attention and MLP, q scaled,
//                                                k and v, o_proj's input, gate, up, gate x up
//                  c (2 (4 + c) h / c + i)      without the CPU's fused float32 kernels: the
//                                                RMSNorms' float32 internals and silu(gate)
//                times 1.3, measured: what the count misses (reshape and cast copies,
//                autograd's buffers); then
//                  2 c H T                       the score matrices of matmul attention (a
//                                                fused kernel keeps 4 H bytes instead)
//                with q = heads x head_dim, kv = kv_heads x head_dim, c the compute dtype's
//                bytes; with activation checkpointing each layer keeps r h per token and
//                one layer at a time is recomputed. Plus one layer's worth for backward's
//                working set.
//   logits       b T V (c + 8)                logits, float32 log-probabilities and their gradient
//                (+ 4 with z-loss below float32 compute: logsumexp's float32 copy); with
//                loss.chunk_tokens n > 0, min(n, b T) V (8, or 2 c + 8 below float32) instead:
//                one chunk's recomputed logits in backward, their float32 copy, the shifted
//                copy that becomes the gradient and its cast back, plus each row's lse (4 b T)
//   step         the optimizer step after backward: AdamW's sqrt(v) temporary (Pt s / d;
//                none with a fused AdamW kernel) and the all-gather's chunks; the peak is the
//                larger of backward and step. Offloaded on a GPU the update runs on the
//                host: the temporary and the gradient shard's float32 copy (4 Pt / d; a
//                blocking device-to-host copy with a dtype change converts on the host)
//                count in host memory, the device keeps the chunks only
//   buffers      GPUs: 1 GiB (runtime context) + 5% of the rest (allocator fragmentation)
// The CPU check of these numbers (bench/plan_check.py, docs/memory.md) compares the
// total with the measured peak RSS of real runs, the process's runtime measured apart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gradguard/amp/precision.h"
#include "gradguard/model/llama.h"
#include "gradguard/model/lora.h"
#include "gradguard/optim/memory_options.h"

namespace gradguard::config {
struct Config;
}

namespace gradguard::train {

struct PlanInputs {
  model::LlamaOptions model;
  model::LoraOptions lora;
  optim::MemoryOptions memory;
  amp::AmpDtype amp = amp::AmpDtype::kFp32;
  int64_t ranks = 1;              // GPUs (data-parallel ranks)
  int64_t seq_len = 1024;
  int64_t micro_batch = 1;
  int64_t global_batch = 0;       // sequences per step to reach; 0 = micro_batch x ranks
  bool fused_attention = true;    // a fused SDPA kernel (LibTorch >= 2.1): no T x T probabilities
  bool fused_adamw = true;        // a fused AdamW kernel (LibTorch >= 2.0 on GPUs): no sqrt(v) temporary
  bool gpu = true;                // add the GPU runtime and allocator buffers
  bool z_loss = false;            // loss.z_loss > 0: its backward keeps the float32 logits
  int64_t chunk_tokens = 0;       // loss.chunk_tokens: > 0 computes the logits that many tokens at a time
  double bucket_mb = 25;          // dist.bucket_mb: ZeRO-2's buckets in flight
  // For CPU processes of this build: its attention and AdamW kernels, no GPU buffers.
  void for_this_cpu();
  // global_batch, or micro_batch x ranks when it is 0.
  int64_t sequences_per_step() const { return global_batch > 0 ? global_batch : micro_batch * ranks; }
  static PlanInputs from_config(const config::Config& c, int64_t ranks);
};

struct MemoryEstimate {
  int64_t parameters = 0, trainable = 0;
  // Bytes per rank.
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, logits = 0, step = 0, buffers = 0;
  double optimizer_host = 0;  // offloaded state and, on a GPU, the step's host copies: host memory per rank
  double total = 0;           // the peak: weights + gradients + optimizer + max(activations + logits, step) + buffers
};

// Parameters of `model` with LoRA adapters of `lora` (trainable: all, or the adapters).
void count_parameters(const model::LlamaOptions& model, const model::LoraOptions& lora, int64_t* total,
                      int64_t* trainable);

MemoryEstimate estimate(const PlanInputs& in);

// What this machine can still give a process: MemAvailable + SwapFree of /proc/meminfo,
// in bytes; nullopt where it cannot be read.
std::optional<double> host_bytes_available();

// Refuses a run whose resident memory -- weights, gradients and optimizer state of the
// estimate, times the `local_ranks` processes sharing this machine -- is more than
// host_bytes_available(), before anything of the model's size is allocated: throws
// gradguard::Error (bad input) naming `where` (the file or key that sets the size), what
// it needs and what the machine has. For runs whose model lives in host memory (the CPU);
// a no-op where the machine's memory cannot be read.
void check_fits_this_machine(const PlanInputs& in, int64_t local_ranks, const std::string& where);

// The largest micro-batch (a power of two dividing global_batch / ranks) whose estimate
// fits `bytes`, first without activation checkpointing, then with it.
struct Suggestion {
  bool fits = false;
  int64_t micro_batch = 0, accum_steps = 0;
  bool checkpointing = false;
  MemoryEstimate estimate;
};
Suggestion suggest(PlanInputs in, double bytes);

}  // namespace gradguard::train
