// The fused SwiGLU, RMSNorm and RoPE kernels against their composite formulas evaluated
// in float64 (the references in fused_ops.h, which are HF's LlamaMLP, LlamaRMSNorm and
// apply_rotary_pos_emb written as ATen ops): outputs and every input's gradient, with
// the fused path checked to be the one that ran (its autograd node), plus the inputs that
// must take the reference path instead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include <torch/torch.h>

#include "gradguard/model/fused_ops.h"

namespace gradguard::model {
namespace {

std::string node_name(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "none"; }

// Max |a - b| / (1 + |b|) over all elements.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs() / (1 + b.to(torch::kDouble).abs())).max().item<double>();
}

// Leaf copies of `inputs` in `dtype` that require grad where `grad` says.
std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& inputs, std::vector<bool> grad, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i)
    out.push_back(inputs[i].to(dtype).detach().requires_grad_(static_cast<bool>(grad[i])));
  return out;
}

TEST(FusedOps, SwiGluMatchesTheFormulaInFloat64) {
  torch::manual_seed(1);
  const auto g0 = torch::randn({3, 17, 96}) * 3, u0 = torch::randn({3, 17, 96});
  auto f = leaves({g0, u0}, {true, true}, torch::kFloat);
  auto r = leaves({g0, u0}, {true, true}, torch::kDouble);
  auto y = swiglu(f[0], f[1]);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("SwiGluFn"));
  auto yr = swiglu_reference(r[0], r[1]);
  EXPECT_LT(rel_err(y, yr), 1e-6);
  const auto dy = torch::randn_like(g0);
  y.backward(dy);
  yr.backward(dy.to(torch::kDouble));
  EXPECT_LT(rel_err(f[0].grad(), r[0].grad()), 1e-5);
  EXPECT_LT(rel_err(f[1].grad(), r[1].grad()), 1e-5);
}

TEST(FusedOps, SwiGluGradientOfOneInputOnly) {
  torch::manual_seed(2);
  const auto g0 = torch::randn({64, 40}), u0 = torch::randn({64, 40});
  auto f = leaves({g0, u0}, {false, true}, torch::kFloat);
  auto r = leaves({g0, u0}, {false, true}, torch::kDouble);
  swiglu(f[0], f[1]).sum().backward();
  swiglu_reference(r[0], r[1]).sum().backward();
  EXPECT_FALSE(f[0].grad().defined());
  EXPECT_LT(rel_err(f[1].grad(), r[1].grad()), 1e-5);
}

TEST(FusedOps, RmsNormMatchesTheFormulaInFloat64) {
  torch::manual_seed(3);
  // 300 rows: more than one block of the weight gradient's partial sums, and a ragged last one.
  const auto x0 = torch::randn({4, 75, 48}) * 2 + 0.5, w0 = torch::randn({48});
  auto f = leaves({x0, w0}, {true, true}, torch::kFloat);
  auto r = leaves({x0, w0}, {true, true}, torch::kDouble);
  auto y = rms_norm(f[0], f[1], 1e-5);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("RmsNormFn"));
  auto yr = rms_norm_reference(r[0], r[1], 1e-5);
  EXPECT_LT(rel_err(y, yr), 1e-5);
  const auto dy = torch::randn_like(x0);
  y.backward(dy);
  yr.backward(dy.to(torch::kDouble));
  EXPECT_LT(rel_err(f[0].grad(), r[0].grad()), 1e-5);
  EXPECT_LT(rel_err(f[1].grad(), r[1].grad()), 1e-5);
}

TEST(FusedOps, RmsNormWeightGradientDoesNotDependOnTheThreadCount) {
  torch::manual_seed(4);
  const auto x0 = torch::randn({1000, 64}), w0 = torch::randn({64}), dy = torch::randn({1000, 64});
  const int before = at::get_num_threads();
  std::vector<at::Tensor> grads;
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    auto w = w0.clone().requires_grad_(true);
    rms_norm(x0, w, 1e-6).backward(dy);
    grads.push_back(w.grad());
  }
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
  EXPECT_TRUE(torch::equal(grads[0], grads[2]));
}

TEST(FusedOps, RopeMatchesTheFormulaInFloat64) {
  torch::manual_seed(5);
  const int64_t B = 3, T = 11, H = 5, hd = 16;
  const auto x0 = torch::randn({B, T, H, hd});
  // Tables with distinct halves, so a kernel that read the wrong half would be caught
  // (HF's tables repeat the frequencies, which would hide it).
  const auto cos = torch::randn({T, hd}), sin = torch::randn({T, hd});
  auto x = x0.clone().requires_grad_(true);
  auto xr = x0.to(torch::kDouble).requires_grad_(true);
  auto y = rope(x, cos, sin);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("RopeFn"));
  auto yr = rope_reference(xr, cos.to(torch::kDouble), sin.to(torch::kDouble));
  EXPECT_LT(rel_err(y, yr), 1e-6);
  const auto dy = torch::randn_like(x0);
  y.backward(dy);
  yr.backward(dy.to(torch::kDouble));
  EXPECT_LT(rel_err(x.grad(), xr.grad()), 1e-6);
}

// Per-token tables [B, T, hd] (packed rows, each token its own position): the fused kernel
// reads row b*T + t of the table, the reference broadcasts it over heads.
TEST(FusedOps, RopeWithPerTokenTablesMatchesTheFormulaInFloat64) {
  torch::manual_seed(9);
  const int64_t B = 2, T = 7, H = 3, hd = 8;
  const auto x0 = torch::randn({B, T, H, hd});
  const auto cos = torch::randn({B, T, hd}), sin = torch::randn({B, T, hd});
  auto x = x0.clone().requires_grad_(true);
  auto xr = x0.to(torch::kDouble).requires_grad_(true);
  auto y = rope(x, cos, sin);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("RopeFn"));
  auto yr = rope_reference(xr, cos.to(torch::kDouble), sin.to(torch::kDouble));
  EXPECT_LT(rel_err(y, yr), 1e-6);
  const auto dy = torch::randn_like(x0);
  y.backward(dy);
  yr.backward(dy.to(torch::kDouble));
  EXPECT_LT(rel_err(x.grad(), xr.grad()), 1e-6);
  // Row b of the per-token table applied to row b alone is the [T, hd] case.
  for (int64_t b = 0; b < B; ++b)
    EXPECT_TRUE(torch::equal(y.detach()[b], rope(x0[b].unsqueeze(0), cos[b], sin[b])[0]));
}

TEST(FusedOps, RopeOfANonContiguousViewAndItsGradient) {
  torch::manual_seed(6);
  // A narrowed view (not contiguous) as input and a transposed incoming gradient.
  const auto base = torch::randn({2, 9, 3, 10});
  const auto cos = torch::randn({9, 6}), sin = torch::randn({9, 6});
  auto leaf = base.clone().requires_grad_(true);
  auto leaf_r = base.to(torch::kDouble).requires_grad_(true);
  auto x = leaf.narrow(3, 2, 6);  // [B, T, H, hd], not contiguous
  ASSERT_FALSE(x.is_contiguous());
  auto y = rope(x, cos, sin);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("RopeFn"));
  auto yr = rope_reference(leaf_r.narrow(3, 2, 6), cos.to(torch::kDouble), sin.to(torch::kDouble));
  EXPECT_LT(rel_err(y, yr), 1e-6);
  y.transpose(1, 2).sum(-1).pow(2).sum().backward();
  yr.transpose(1, 2).sum(-1).pow(2).sum().backward();
  EXPECT_LT(rel_err(leaf.grad(), leaf_r.grad()), 1e-5);
}

TEST(FusedOps, OtherInputsTakeTheReferencePath) {
  torch::manual_seed(7);
  const auto g = torch::randn({4, 8}, torch::requires_grad()), u = torch::randn({4, 8});
  // bf16 (CPU autocast) and float64 are not fused; neither are mismatched shapes.
  EXPECT_THAT(node_name(swiglu(g.to(torch::kBFloat16), u.to(torch::kBFloat16))), ::testing::HasSubstr("Mul"));
  EXPECT_THAT(node_name(swiglu(g.to(torch::kDouble), u.to(torch::kDouble))), ::testing::HasSubstr("Mul"));
  EXPECT_THAT(node_name(swiglu(g, u.narrow(1, 0, 1))), ::testing::HasSubstr("Mul"));  // broadcasting
  // RMSNorm with a bf16 input: normalised in float32, cast back, as the reference says.
  auto xb = torch::randn({4, 8}).to(torch::kBFloat16);
  auto w = torch::ones({8});
  auto yb = rms_norm(xb, w, 1e-5);
  EXPECT_TRUE(torch::allclose(yb, rms_norm_reference(xb, w, 1e-5)));
  // RoPE tables that require grad (never so in the model) keep autograd's own path.
  auto cos = torch::randn({3, 4}, torch::requires_grad()), sin = torch::randn({3, 4});
  auto y = rope(torch::randn({1, 3, 2, 4}), cos, sin);
  EXPECT_THAT(node_name(y), ::testing::Not(::testing::HasSubstr("RopeFn")));
}

TEST(FusedOps, EmptyTensorsPassThrough) {
  auto g = torch::randn({0, 8}), u = torch::randn({0, 8});
  EXPECT_EQ(swiglu(g, u).numel(), 0);
  EXPECT_EQ(rms_norm(torch::randn({0, 8}), torch::ones({8}), 1e-5).numel(), 0);
  EXPECT_EQ(rope(torch::randn({0, 3, 2, 4}), torch::randn({3, 4}), torch::randn({3, 4})).numel(), 0);
}

}  // namespace
}  // namespace gradguard::model
