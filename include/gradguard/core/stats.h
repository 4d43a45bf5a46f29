// Small order statistics shared by the benchmarks, the diagnosis and the report.
#pragma once

#include <vector>

namespace gradguard {

// The median of the finite values in `values` (NaN and infinities are left out): the
// middle one for an odd count, the mean of the two middle ones for an even count. NaN
// when no value is finite.
double median(std::vector<double> values);

}  // namespace gradguard
