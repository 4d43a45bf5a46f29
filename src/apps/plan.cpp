// The memory plan: the devices, the layouts compared and the report, over the estimate of
// train/memory_estimate.h.
#include "gradguard/apps/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

namespace gradguard::plan {
namespace {

constexpr double kGB = 1e9;
std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / kGB);
  return b;
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
