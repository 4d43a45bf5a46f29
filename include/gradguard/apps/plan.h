// `gradguard plan`: how much memory a run needs per GPU, whether it fits a device, and
// which micro-batch x accumulation reaches a target global batch -- before any GPU time
// is spent. Pure arithmetic over the model's shapes and the run's layout, no tensors.
//
// The per-rank terms and their arithmetic are in train/memory_estimate.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/train/memory_estimate.h"

namespace gradguard::plan {

// A device with its memory; `--memory GB` makes one named "custom".
struct Device {
  std::string name;
  double memory_gb = 0;  // decimal GB (1e9 bytes), as vendors state it
};
const std::vector<Device>& known_devices();  // mi210, mi250x, mi300x, a100-40, a100 (80 GB), h100, h200
// The known device of that name, in any case ("H100" is h100). Throws gradguard::Error
// (bad input, "--device") naming the known ones.
Device find_device(const std::string& name);
// The device of `--device NAME` and `--memory GB` together: a named one ("" = mi210) with
// its memory replaced by memory_gb when that is > 0, or, with no name and memory_gb > 0,
// one named "custom". Throws gradguard::Error (bad input) naming --device for an unknown name.
Device device_for(const std::string& name, double memory_gb);

// The estimate itself is the train layer's (train/memory_estimate.h); `plan` presents it.
using train::count_parameters;
using train::estimate;
using train::MemoryEstimate;
using train::PlanInputs;
using train::suggest;
using train::Suggestion;

// The layouts `plan` compares for a model (replicated fp32 ... LoRA on a bf16 base), each
// with its suggestion for `bytes` per device.
struct LayoutRow {
  std::string name;
  PlanInputs inputs;
  Suggestion suggestion;
  // The overrides that select this layout in a run ("amp.dtype=bf16", ...), then, when
  // it fits, those of its suggestion (batch.micro_batch, batch.global_batch,
  // model.activation_checkpointing): `gradguard train KEY=VALUE ...` or one --set each.
  std::vector<std::string> sets;
};
std::vector<LayoutRow> compare_layouts(const PlanInputs& base, double bytes);

// The report `gradguard plan` prints, and its JSON.
std::string render(const PlanInputs& in, const Device& device);
nlohmann::ordered_json to_json(const PlanInputs& in, const Device& device);

}  // namespace gradguard::plan
