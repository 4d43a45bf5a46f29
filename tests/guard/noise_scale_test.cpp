// The noise-scale estimator against a synthetic case whose answer is known: per-sample
// gradients g_i = G + sigma * e_i with e_i standard normal in d dimensions, so
// tr(Sigma) = d sigma^2 and B_simple = d sigma^2 / |G|^2 (McCandlish et al. 2018, eq. 2.8).
#include "gradguard/guard/noise_scale.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"

namespace gradguard::guard {
namespace {

TEST(NoiseScale, RecoversTheKnownNoiseScale) {
  const int d = 200;
  const double sigma = 1.0, g = 0.1;  // |G|^2 = 2, tr(S) = 200 -> B_simple = 100
  const int b_small = 8, b_big = 64;
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal;
  NoiseScaleEstimator est(0.99);
  for (int it = 0; it < 3000; ++it) {
    // Mean of the first 8 samples, and of the other 56, drawn exactly.
    double small_sq = 0, big_sq = 0;
    for (int k = 0; k < d; ++k) {
      const double small = g + sigma * normal(rng) / std::sqrt(double(b_small));
      const double rest = g + sigma * normal(rng) / std::sqrt(double(b_big - b_small));
      const double big = (b_small * small + (b_big - b_small) * rest) / b_big;
      small_sq += small * small;
      big_sq += big * big;
    }
    est.update(small_sq, b_small, big_sq, b_big);
  }
  EXPECT_NEAR(est.grad_sq(), 2.0, 0.2);
  EXPECT_NEAR(est.trace_cov(), 200.0, 12.0);
  EXPECT_NEAR(est.b_simple(), 100.0, 12.0);
}

TEST(NoiseScale, IgnoresUnusableMeasurementsAndRoundTrips) {
  NoiseScaleEstimator est(0.9);
  EXPECT_TRUE(std::isnan(est.b_simple()));
  est.update(NAN, 8, 1, 64);
  est.update(2, 8, 1, 8);  // b_big must exceed b_small
  EXPECT_EQ(est.count(), 0);
  // A noise-free case: |G_small|^2 = |G_big|^2 -> tr(S) = 0.
  est.update(4, 8, 4, 64);
  EXPECT_NEAR(est.grad_sq(), 4, 1e-12);
  EXPECT_NEAR(est.b_simple(), 0, 1e-12);
  NoiseScaleEstimator copy(0.9);
  copy.load_state_dict(est.state_dict());
  EXPECT_EQ(copy.state_dict().dump(), est.state_dict().dump());
  EXPECT_THROW(copy.load_state_dict(nlohmann::json::object()), Error);
  EXPECT_THROW(NoiseScaleEstimator(1.0), Error);
}

}  // namespace
}  // namespace gradguard::guard
