// JSON has no NaN or Infinity, so every number that may be non-finite (a diverged loss,
// an overflowed norm) is written through json_number(): the value when finite, null
// otherwise, so readers never choke on a line and can test for null; number_or_nan()
// reads such a field back.
#pragma once

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace gradguard {

inline nlohmann::ordered_json json_number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

// The reading side: `obj[key]` as a double, NaN when it is null, absent or not a number.
inline double number_or_nan(const nlohmann::ordered_json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace gradguard
