#include "gradguard/core/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradguard {

double median(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double x) { return !std::isfinite(x); }),
               values.end());
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  if (values.size() % 2 == 1) return *mid;
  return (*mid + *std::max_element(values.begin(), mid)) / 2;  // the lower middle is the largest below
}

}  // namespace gradguard
