// The memory plan: parameter counts from the shapes, the per-rank terms of plan.h, the
// micro-batch search and the report.
#include "gradguard/apps/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"

namespace gradguard::plan {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGB = 1e9;
constexpr double kGatherChunk = 4.0 * 1024 * 1024;  // optim::ShardingOptions::gather_chunk_bytes
// What a layer keeps per token beyond the tensors counted in plan.h (reshape and cast
// copies, autograd's own buffers), measured: the peak RSS slope over tokens of 4-, 10- and
// 20-layer models (512 wide, seq 256, LibTorch 1.13 on the CPU) is 1.3 x the count plus
// two T x T score matrices per head (docs/memory.md, "gradguard plan").
constexpr double kSavedFactor = 1.3;

double dtype_bytes(amp::AmpDtype d) { return d == amp::AmpDtype::kFp32 ? 4.0 : 2.0; }

std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / kGB);
  return b;
}

// The layer's widths: q = heads x head_dim, kv = kv_heads x head_dim.
struct Widths {
  int64_t h, i, hd, q, kv;
};
Widths widths(const model::LlamaOptions& m) {
  const int64_t hd = m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads;
  return {m.hidden_size, m.intermediate_size, hd, m.num_heads * hd, m.num_kv_heads * hd};
}

std::string describe_layout(const PlanInputs& in) {
  std::string s = std::string(name_of(in.memory.weights_dtype)) + " weights";
  if (in.memory.keeps_masters()) s += " + fp32 masters";
  s += in.memory.zero_stage > 0 ? ", ZeRO-" + std::to_string(in.memory.zero_stage) : std::string(", replicated");
  if (in.memory.offload_optimizer) s += ", offload";
  if (in.lora.enabled()) s += ", LoRA r" + std::to_string(in.lora.rank);
  return s;
}

}  // namespace

const std::vector<Device>& known_devices() {
  static const std::vector<Device> devices = {{"mi210", 64},    {"mi250x", 128}, {"mi300x", 192}, {"a100-40", 40},
                                              {"a100", 80},     {"h100", 80},    {"h200", 141}};
  return devices;
}

Device find_device(const std::string& name) {
  // Vendors and users write H100, MI300X: names match whatever their case.
  std::string lower = name;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string known;
  for (const auto& d : known_devices()) {
    if (d.name == lower) return d;
    known += (known.empty() ? "" : ", ") + d.name + " (" + gb(d.memory_gb * kGB) + " GB)";
  }
  throw bad_input("--device", "unknown device '" + name + "'; known: " + known + ", or give --memory GB");
}

Device device_for(const std::string& name, double memory_gb) {
  Device d = name.empty() && memory_gb > 0 ? Device{"custom", memory_gb} : find_device(name.empty() ? "mi210" : name);
  if (memory_gb > 0) d.memory_gb = memory_gb;
  return d;
}

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
  const double d = m.zero_stage > 0 ? static_cast<double>(in.ranks) : 1;
  const double shard = std::ceil(Pt / d);

  const auto wd = widths(in.model);
  e.weights = P * w;
  e.gradients = Pt * w;
  if (m.zero_stage == 2 && in.ranks > 1) {
    // The shard, the float32 buckets being reduced (dist/grad_shard_sync.h: kInFlight + 1)
    // and the one gradient autograd has made and the hook has not yet bucketed.
    const double V = static_cast<double>(in.model.vocab_size), h = static_cast<double>(wd.h);
    const double largest = in.lora.enabled() ? 0 : std::max(V * h, h * static_cast<double>(wd.i));
    e.gradients = shard * w + std::min(3 * in.bucket_mb * kMiB, Pt * 4) + largest * w;
  }
  const double state = shard * (2 * s + (masters ? 4 : 0));
  (m.offload_optimizer ? e.optimizer_host : e.optimizer) = state;

  // Activations of one micro-batch (plan.h).
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
  e.logits = tokens * static_cast<double>(in.model.vocab_size) * (c + 8 + (in.z_loss && c != 4 ? 4 : 0));
  e.step = (in.fused_adamw ? 0 : shard * s) + (d > 1 ? (d + 1) * kGatherChunk : 0) + (m.offload_optimizer ? shard * 4 : 0);

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

std::vector<LayoutRow> compare_layouts(const PlanInputs& base, double bytes) {
  auto layout = [&](const char* name, amp::AmpDtype weights, int64_t zero, bool offload, int64_t lora_rank) {
    PlanInputs in = base;
    in.amp = amp::AmpDtype::kBf16;
    in.memory.weights_dtype = weights;
    in.memory.master_weights = true;
    in.memory.zero_stage = zero;
    in.memory.offload_optimizer = offload;
    in.lora.rank = lora_rank;
    if (lora_rank > 0) {
      using T = model::LoraTarget;
      in.lora.targets = {T::kQ, T::kK, T::kV, T::kO, T::kGate, T::kUp, T::kDown};
    }
    LayoutRow row{name, in, suggest(in, bytes), {}};
    auto& sets = row.sets;
    sets.push_back("amp.dtype=bf16");
    sets.push_back(std::string("memory.weights_dtype=") + name_of(weights));
    if (weights != amp::AmpDtype::kFp32) sets.push_back("memory.master_weights=true");
    sets.push_back("memory.zero_stage=" + std::to_string(zero));
    sets.push_back(std::string("memory.offload_optimizer=") + (offload ? "true" : "false"));
    sets.push_back("lora.rank=" + std::to_string(lora_rank));
    if (lora_rank > 0) {
      std::string targets;
      for (const auto t : in.lora.targets) targets += (targets.empty() ? "" : ",") + std::string(name_of(t));
      sets.push_back("lora.targets=[" + targets + "]");
    }
    if (row.suggestion.fits) {
      sets.push_back("batch.micro_batch=" + std::to_string(row.suggestion.micro_batch));
      sets.push_back("batch.global_batch=" + std::to_string(in.sequences_per_step()));
      sets.push_back(std::string("model.activation_checkpointing=") + (row.suggestion.checkpointing ? "true" : "false"));
    }
    return row;
  };
  const auto f32 = amp::AmpDtype::kFp32, bf16 = amp::AmpDtype::kBf16;
  return {layout("fp32 weights, replicated", f32, 0, false, 0),
          layout("fp32 weights, ZeRO-1", f32, 1, false, 0),
          layout("bf16 + fp32 masters, replicated", bf16, 0, false, 0),
          layout("bf16 + fp32 masters, ZeRO-1", bf16, 1, false, 0),
          layout("bf16 + fp32 masters, ZeRO-1, offload", bf16, 1, true, 0),
          layout("bf16 + fp32 masters, ZeRO-2", bf16, 2, false, 0),
          layout("bf16 + fp32 masters, ZeRO-2, offload", bf16, 2, true, 0),
          layout("LoRA r16 on all 7 projections, bf16 base", bf16, 0, false, 16)};
}

std::string render(const PlanInputs& in, const Device& device) {
  const double bytes = device.memory_gb * kGB;
  const auto e = estimate(in);
  const auto& m = in.model;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "model: %.2fB parameters (%lld layers x %lld wide, %lld heads / %lld kv heads, vocab %lld)%s\n",
                e.parameters / 1e9, (long long)m.num_layers, (long long)m.hidden_size, (long long)m.num_heads,
                (long long)m.num_kv_heads, (long long)m.vocab_size,
                in.lora.enabled() ? (", " + std::to_string(e.trainable) + " train (LoRA)").c_str() : "");
  out += line;
  const int64_t global = in.sequences_per_step();
  std::snprintf(line, sizeof line,
                "devices: %lld x %s (%s GB each); seq %lld; global batch %lld sequences (%lld tokens)\n",
                (long long)in.ranks, device.name.c_str(), gb(bytes).c_str(), (long long)in.seq_len,
                (long long)global, (long long)(global * in.seq_len));
  out += line;
  std::snprintf(line, sizeof line, "\nthis run: %s, compute %s, micro-batch %lld, activation checkpointing %s\n",
                describe_layout(in).c_str(), name_of(in.amp), (long long)in.micro_batch,
                m.activation_checkpointing ? "on" : "off");
  out += line;
  auto row = [&](const char* what, double v) {
    std::snprintf(line, sizeof line, "  %-12s %8s GB\n", what, gb(v).c_str());
    out += line;
  };
  row("weights", e.weights);
  row("gradients", e.gradients);
  row("optimizer", e.optimizer);
  row("activations", e.activations);
  row("logits", e.logits);
  row("step", e.step);
  row("buffers", e.buffers);
  row("total", e.total);
  if (e.optimizer_host > 0) row("host/rank", e.optimizer_host);
  std::snprintf(line, sizeof line, "  -> %s %s GB per device\n", e.total <= bytes ? "fits" : "does NOT fit",
                gb(bytes).c_str());
  out += line;
  const auto s = suggest(in, bytes);
  if (s.fits)
    std::snprintf(line, sizeof line,
                  "  for global batch %lld: micro-batch %lld x accumulation %lld x %lld ranks, checkpointing %s "
                  "(%s GB)\n",
                  (long long)global, (long long)s.micro_batch, (long long)s.accum_steps, (long long)in.ranks,
                  s.checkpointing ? "on" : "off", gb(s.estimate.total).c_str());
  else
    std::snprintf(line, sizeof line, "  no micro-batch fits, even 1 with checkpointing (%s GB)\n",
                  gb(s.estimate.total).c_str());
  out += line;

  std::snprintf(line, sizeof line, "\nlayouts (compute bf16) for global batch %lld on %lld x %s GB:\n",
                (long long)global, (long long)in.ranks, gb(bytes).c_str());
  out += line;
  out += "| layout | weights + grads GB | optimizer GB (host) | micro x accum | checkpointing | per device GB "
         "(smallest when it does not fit) | fits |\n";
  out += "|---|---:|---:|---|---|---:|---|\n";
  for (const auto& l : compare_layouts(in, bytes)) {
    const auto& x = l.suggestion.estimate;
    const std::string opt = gb(x.optimizer) + (x.optimizer_host > 0 ? " (" + gb(x.optimizer_host) + ")" : "");
    const auto& sg = l.suggestion;
    const std::string shape = sg.fits ? std::to_string(sg.micro_batch) + " x " + std::to_string(sg.accum_steps) : "-";
    std::snprintf(line, sizeof line, "| %s | %s | %s | %s | %s | %s | %s |\n", l.name.c_str(),
                  gb(x.weights + x.gradients).c_str(), opt.c_str(), shape.c_str(),
                  sg.fits ? (sg.checkpointing ? "on" : "off") : "-", gb(x.total).c_str(), sg.fits ? "yes" : "no");
    out += line;
  }
  out += "\nkeys of each layout (append to `gradguard train`, or give each to --set; batch sizes where it fits):\n";
  for (const auto& l : compare_layouts(in, bytes)) {
    out += "  " + l.name + ":\n   ";
    for (const auto& kv : l.sets) out += " " + kv;
    out += "\n";
  }
  return out;
}

nlohmann::ordered_json to_json(const PlanInputs& in, const Device& device) {
  const double bytes = device.memory_gb * kGB;
  auto est = [](const MemoryEstimate& e) {
    return nlohmann::ordered_json{{"parameters", e.parameters}, {"trainable", e.trainable},
                                  {"weights", e.weights},       {"gradients", e.gradients},
                                  {"optimizer", e.optimizer},   {"optimizer_host", e.optimizer_host},
                                  {"activations", e.activations}, {"logits", e.logits},
                                  {"step", e.step},             {"buffers", e.buffers},
                                  {"total", e.total}};
  };
  auto sug = [&](const Suggestion& s) {
    return nlohmann::ordered_json{{"fits", s.fits},
                                  {"micro_batch", s.micro_batch},
                                  {"accum_steps", s.accum_steps},
                                  {"activation_checkpointing", s.checkpointing},
                                  {"estimate", est(s.estimate)}};
  };
  nlohmann::ordered_json layouts = nlohmann::ordered_json::array();
  for (const auto& l : compare_layouts(in, bytes)) layouts.push_back({{"layout", l.name}, {"sets", l.sets}, {"suggestion", sug(l.suggestion)}});
  const auto e = estimate(in);
  return {{"device", device.name},
          {"device_bytes", bytes},
          {"ranks", in.ranks},
          {"layout", describe_layout(in)},
          {"estimate", est(e)},
          {"fits", e.total <= bytes},
          {"suggestion", sug(suggest(in, bytes))},
          {"layouts", layouts}};
}

}  // namespace gradguard::plan
