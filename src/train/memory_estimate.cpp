// The memory estimate (train/memory_estimate.h): parameter counts from the shapes, the
// per-rank terms, and the micro-batch search.
#include "gradguard/train/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gradguard/config/config.h"
#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"
#include "gradguard/core/meminfo.h"

namespace gradguard::train {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGatherChunk = 4.0 * 1024 * 1024;  // optim::ShardingOptions::gather_chunk_bytes
// What a layer keeps per token beyond the tensors counted in memory_estimate.h (reshape and cast
// copies, autograd's own buffers), measured: the peak RSS slope over tokens of 4-, 10- and
// 20-layer models (512 wide, seq 256, LibTorch 1.13 on the CPU) is 1.3 x the count plus
// two T x T score matrices per head (docs/memory.md, "gradguard plan").
constexpr double kSavedFactor = 1.3;

double dtype_bytes(amp::AmpDtype d) { return d == amp::AmpDtype::kFp32 ? 4.0 : 2.0; }

// The layer's widths: q = heads x head_dim, kv = kv_heads x head_dim.
struct Widths {
  int64_t h, i, hd, q, kv;
};
Widths widths(const model::LlamaOptions& m) {
  const int64_t hd = m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads;
  return {m.hidden_size, m.intermediate_size, hd, m.num_heads * hd, m.num_kv_heads * hd};
}

}  // namespace

PlanInputs PlanInputs::from_config(const config::Config& c, int64_t ranks) {
  PlanInputs in;
  in.model = c.model;
  in.lora = c.lora;
  in.memory = c.memory;
  in.amp = c.amp.dtype;
  in.ranks = ranks;
  in.seq_len = c.data.seq_len;
  in.micro_batch = c.batch.micro_batch;
  in.global_batch = c.batch.global_batch;
  in.z_loss = c.loss.z_loss > 0;
  in.chunk_tokens = c.loss.chunk_tokens;
  in.bucket_mb = c.dist.bucket_mb;
  return in;
}

void PlanInputs::for_this_cpu() {
  gpu = false;
  fused_attention = GRADGUARD_HAS_SDPA;
  fused_adamw = compat::fused_adamw_available(c10::kCPU);
}

void count_parameters(const model::LlamaOptions& m, const model::LoraOptions& lora, int64_t* total,
                      int64_t* trainable) {
  const auto w = widths(m);
  const bool qkv_bias = m.attention_bias || m.qkv_bias;
  int64_t layer = w.h * w.q + 2 * w.h * w.kv + w.q * w.h + 3 * w.h * w.i + 2 * w.h;
  if (qkv_bias) layer += w.q + 2 * w.kv;
  if (m.attention_bias) layer += w.h;
  if (m.mlp_bias) layer += 2 * w.i + w.h;
  if (m.qk_norm) layer += 2 * w.hd;
  int64_t adapters = 0;
  if (lora.enabled()) {
    using T = model::LoraTarget;
    const std::pair<T, std::pair<int64_t, int64_t>> shapes[] = {  // in, out
        {T::kQ, {w.h, w.q}},    {T::kK, {w.h, w.kv}},   {T::kV, {w.h, w.kv}}, {T::kO, {w.q, w.h}},
        {T::kGate, {w.h, w.i}}, {T::kUp, {w.h, w.i}}, {T::kDown, {w.i, w.h}}};
    for (const auto& [t, io] : shapes)
      if (lora.targets_has(t)) adapters += lora.rank * (io.first + io.second);
  }
  *total = m.vocab_size * w.h * (m.tie_embeddings ? 1 : 2) + w.h + m.num_layers * (layer + adapters);
  *trainable = lora.enabled() ? m.num_layers * adapters : *total;
}

MemoryEstimate estimate(const PlanInputs& in) {
  MemoryEstimate e;
  count_parameters(in.model, in.lora, &e.parameters, &e.trainable);
  const auto& m = in.memory;
  const double P = static_cast<double>(e.parameters), Pt = static_cast<double>(e.trainable);
  const double w = dtype_bytes(m.weights_dtype);
  const bool masters = m.keeps_masters();
  const double s = masters ? 4 : w;  // bytes of m and v
  const auto layout = m.resolve(in.ranks, 0);
  const double d = static_cast<double>(layout.shard_world);
  const double shard = std::ceil(Pt / d);

  const auto wd = widths(in.model);
  e.weights = P * w;
  e.gradients = Pt * w;
  if (layout.shards_gradients) {
    // The shard, the float32 buckets being reduced (dist/grad_shard_sync.h: kInFlight + 1)
    // and the one gradient autograd has made and the hook has not yet bucketed.
    const double V = static_cast<double>(in.model.vocab_size), h = static_cast<double>(wd.h);
    const double largest = in.lora.enabled() ? 0 : std::max(V * h, h * static_cast<double>(wd.i));
    e.gradients = shard * w + std::min(3 * in.bucket_mb * kMiB, Pt * 4) + largest * w;
  }
  const double state = shard * (2 * s + (masters ? 4 : 0));
  (m.offload_optimizer ? e.optimizer_host : e.optimizer) = state;

  // Activations of one micro-batch (memory_estimate.h).
  const double c = (in.amp != amp::AmpDtype::kFp32 || w == 2) ? 2 : 4;  // compute dtype bytes
  const double r = w;                                                    // residual stream bytes
  const double T = static_cast<double>(in.seq_len), tokens = T * static_cast<double>(in.micro_batch);
  const double H = static_cast<double>(in.model.num_heads);
  // The CPU's fused float32 kernels (model/fused_ops.h) keep less than the reference
  // ops that run elsewhere: each RMSNorm's float32 input and normalised output, and
  // SwiGLU's silu(gate).
  const bool fused_ops = !in.gpu && c == 4;
  const double counted = r * 2 * wd.h + c * (2 * wd.h + 2 * wd.q + 2 * wd.kv + 3 * wd.i) +
                         (fused_ops ? 0 : 2 * (4 + c) * wd.h + c * wd.i);
  const double per_layer = kSavedFactor * counted + (in.fused_attention ? 4 * H : 2 * c * H * T);
  const double L = static_cast<double>(in.model.num_layers);
  const double layers = in.model.activation_checkpointing ? L * r * wd.h + 2 * per_layer : (L + 1) * per_layer;
  e.activations = tokens * (layers + (r + c) * wd.h);
  // z-loss's logsumexp keeps its float32 input: the logits themselves in float32 compute,
  // a float32 copy of them otherwise.
  const double V = static_cast<double>(in.model.vocab_size);
  if (in.chunk_tokens > 0)  // one chunk at a time (train/chunked_loss.h), and each row's lse
    e.logits = std::min(static_cast<double>(in.chunk_tokens), tokens) * V * (c == 4 ? 8 : 2 * c + 8) + 4 * tokens;
  else
    e.logits = tokens * V * (c + 8 + (in.z_loss && c != 4 ? 4 : 0));
  // The optimizer step (memory_estimate.h). Offloaded, the update runs on the host: the
  // gradient shard's float32 copy and AdamW's temporary are host memory (a blocking
  // device-to-host copy that changes the dtype converts on the host, as ATen's CUDA copy
  // kernel does), and the device keeps only the all-gather's chunks. On the CPU the
  // host is the device; a float32 gradient needs no copy there.
  const double gather = d > 1 ? (d + 1) * kGatherChunk : 0;
  if (!m.offload_optimizer) {
    e.step = (in.fused_adamw ? 0 : shard * s) + gather;
  } else if (in.gpu) {
    e.step = gather;
    e.optimizer_host += shard * 4 + shard * s;
  } else {
    e.step = gather + (in.fused_adamw ? 0 : shard * s) + (w == 4 ? 0 : shard * 4);
  }

  const double resident = e.weights + e.gradients + e.optimizer + (in.gpu ? 0 : e.optimizer_host);
  const double peak = resident + std::max(e.activations + e.logits, e.step);
  e.buffers = in.gpu ? 1 * kGiB + 0.05 * peak : 0;
  e.total = peak + e.buffers;
  return e;
}

Suggestion suggest(PlanInputs in, double bytes) {
  Suggestion out;
  const int64_t global = in.sequences_per_step();
  if (global % in.ranks != 0) return out;
  const int64_t per_rank = global / in.ranks;
  int64_t largest = 1;
  while (per_rank % (largest * 2) == 0) largest *= 2;
  for (const bool ckpt : {false, true}) {
    in.model.activation_checkpointing = ckpt;
    for (int64_t micro = largest; micro >= 1; micro /= 2) {
      in.micro_batch = micro;
      const auto e = estimate(in);
      if (e.total <= bytes) return {true, micro, per_rank / micro, ckpt, e};
    }
  }
  in.micro_batch = 1;
  out.micro_batch = 1;
  out.accum_steps = per_rank;
  out.checkpointing = true;
  out.estimate = estimate(in);
  return out;
}

std::optional<double> host_bytes_available() {
  const auto meminfo = read_meminfo();
  if (!meminfo) return std::nullopt;
  const auto available = meminfo->find("MemAvailable"), swap_free = meminfo->find("SwapFree");
  if (available == meminfo->end()) return std::nullopt;
  return available->second + (swap_free == meminfo->end() ? 0.0 : std::max(swap_free->second, 0.0));
}

void check_fits_this_machine(const PlanInputs& in, int64_t local_ranks, const std::string& where) {
  const auto available = host_bytes_available();
  if (!available) return;
  const auto e = estimate(in);
  const double per_rank = e.weights + e.gradients + e.optimizer + e.optimizer_host;
  const double needed = per_rank * static_cast<double>(std::max<int64_t>(local_ranks, 1));
  if (needed <= *available) return;
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "a model of %lld parameters (%lld trained) needs %.1f GiB for its weights, gradients and optimizer "
                "state%s, and this machine has %.1f GiB available (MemAvailable + SwapFree): nothing was allocated. "
                "LoRA, bf16 weights, ZeRO over more machines or a smaller model need less (`gradguard plan` "
                "compares them)",
                (long long)e.parameters, (long long)e.trainable, needed / kGiB,
                local_ranks > 1 ? (" (" + std::to_string(local_ranks) + " ranks on this machine)").c_str() : "",
                *available / kGiB);
  throw bad_input(where, msg);
}

}  // namespace gradguard::train
