// median(): the shared order statistic of the benchmarks, the diagnosis and the report.
// Expected values are the textbook definition (numpy.median gives the same).
#include "gradguard/core/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace gradguard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Median, OddCountIsTheMiddleValue) {
  EXPECT_EQ(median({7}), 7);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({5, -1, 9, 9, 0}), 5);
}

TEST(Median, EvenCountIsTheMeanOfTheTwoMiddleValues) {
  EXPECT_EQ(median({1, 2}), 1.5);
  EXPECT_EQ(median({10, 1, 4, 3}), 3.5);
  EXPECT_EQ(median({2, 2, 2, 8}), 2);
}

TEST(Median, NonFiniteValuesAreLeftOut) {
  EXPECT_EQ(median({1, kNaN, 3, kInf, 2}), 2);
  EXPECT_EQ(median({-kInf, 4, 6}), 5);
}

TEST(Median, NothingFiniteIsNaN) {
  EXPECT_TRUE(std::isnan(median({})));
  EXPECT_TRUE(std::isnan(median({kNaN, kInf})));
}

}  // namespace
}  // namespace gradguard
