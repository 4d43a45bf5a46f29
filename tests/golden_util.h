// Reading golden JSON files (tests/golden/, produced by make_golden.py with torch 1.13).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "test_util.h"

namespace gradguard::test {

inline nlohmann::json load_golden(const std::string& name) {
  return nlohmann::json::parse(read_text(source_path("tests/golden/" + name)));
}

// A float32 tensor from a flat JSON list and a shape.
inline torch::Tensor golden_tensor(const nlohmann::json& values, std::vector<int64_t> shape) {
  auto flat = values.get<std::vector<float>>();
  return torch::tensor(flat, torch::kFloat).reshape(shape);
}

// Largest |a - b| / max(|b|, floor) over all elements.
inline double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b, double floor = 1e-3) {
  auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  return ((ad - bd).abs() / bd.abs().clamp_min(floor)).max().item<double>();
}

}  // namespace gradguard::test
