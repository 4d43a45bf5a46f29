// JSON has no NaN or Infinity, so every number that may be non-finite (a diverged loss,
// an overflowed norm) is written through json_number(): the value when finite, null
// otherwise, so readers never choke on a line and can test for null.
#pragma once

#include <cmath>

#include <nlohmann/json.hpp>

namespace gradguard {

inline nlohmann::ordered_json json_number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

}  // namespace gradguard
