// NF4 quantization, dequantization and the linear map over a quantized weight (nf4.h).
#include "gradguard/model/nf4.h"

#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::model {
namespace {

// The code book as published with the paper's NF4 data type (bitsandbytes), float32;
// tests/model/nf4_test.cpp rebuilds it from the construction in float64.
constexpr std::array<float, 16> kCodeBook = {
    -1.0f,          -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f,  0.16093020141124725f,  0.24611230194568634f,  0.33791524171829224f,
    0.44070982933044434f,  0.5626170039176941f,   0.7229568362236023f,   1.0f};

at::Tensor code_book_tensor(const c10::Device& device, at::ScalarType dtype) {
  return torch::tensor(std::vector<float>(kCodeBook.begin(), kCodeBook.end()), torch::kFloat).to(device, dtype);
}

// Each element's code index (uint8) for a weight already divided by its block absmax, in
// float64: the first code whose midpoint with the next is >= the value.
at::Tensor nearest_codes(const at::Tensor& normalized) {
  std::vector<double> mid;
  for (size_t i = 0; i + 1 < kCodeBook.size(); ++i) mid.push_back((double(kCodeBook[i]) + double(kCodeBook[i + 1])) / 2);
  const auto boundaries = torch::tensor(mid, torch::kDouble).to(normalized.device());
  return torch::bucketize(normalized, boundaries, /*out_int32=*/false, /*right=*/false).to(torch::kUInt8);
}

class Nf4Linear : public torch::autograd::Function<Nf4Linear> {
 public:
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                              const at::Tensor& codes, const at::Tensor& scales,
                                              const at::Tensor& steps, double mean, at::IntArrayRef shape) {
    Nf4Tensor w{shape.vec(), codes, scales, steps, mean};
    ctx->save_for_backward({codes, scales, steps});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["shape"] = shape.vec();
    return {at::matmul(x, nf4_dequantize(w, x.scalar_type()).t())};
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    Nf4Tensor w{ctx->saved_data["shape"].toIntVector(), saved[0], saved[1], saved[2],
                ctx->saved_data["mean"].toDouble()};
    const auto& g = grads[0];
    return {at::matmul(g, nf4_dequantize(w, g.scalar_type())), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

const std::array<float, 16>& nf4_code_book() { return kCodeBook; }

int64_t Nf4Tensor::numel() const { return codes.numel() * 2; }

int64_t Nf4Tensor::bytes() const {
  return codes.numel() + scales.numel() + group_steps.numel() * 4 + static_cast<int64_t>(sizeof(double));
}

Nf4Tensor nf4_quantize(const at::Tensor& weight, const std::string& name) {
  if (!weight.is_floating_point())
    throw bad_input(name, "nf4 quantizes floating-point weights, this one is " + std::string(c10::toString(weight.scalar_type())));
  if (weight.numel() == 0 || weight.numel() % kNf4Block != 0)
    throw bad_input(name, "has " + std::to_string(weight.numel()) + " elements, which do not split into blocks of " +
                              std::to_string(kNf4Block) + " (nf4 keeps one scale per block)");
  torch::NoGradGuard no_grad;
  Nf4Tensor q;
  q.shape = weight.sizes().vec();
  const auto blocks = weight.detach().reshape({-1, kNf4Block}).to(torch::kDouble);
  const auto absmax = blocks.abs().amax(1);  // [B]
  // Double quantization of the scales: int8 around their mean, a float32 step per group.
  const int64_t B = absmax.size(0);
  q.scale_mean = absmax.mean().item<double>();
  const int64_t groups = (B + kNf4ScaleGroup - 1) / kNf4ScaleGroup;
  auto centred = torch::zeros({groups * kNf4ScaleGroup}, torch::kDouble).to(absmax.device());
  centred.narrow(0, 0, B).copy_(absmax - q.scale_mean);
  const auto grouped = centred.view({groups, kNf4ScaleGroup});
  q.group_steps = (grouped.abs().amax(1) / 127.0).to(torch::kFloat);
  const auto steps = q.group_steps.to(torch::kDouble).clamp_min(1e-30).unsqueeze(1);
  q.scales = (grouped / steps).round().clamp(-127, 127).to(torch::kInt8).reshape({-1}).narrow(0, 0, B).contiguous();
  // The codes, against the scales as they will be read back, so dequantization is the
  // nearest code times the stored scale.
  const auto stored = nf4_block_scales(q).to(torch::kDouble).unsqueeze(1);
  const auto normalized = torch::where(stored > 0, blocks / stored.clamp_min(1e-300), torch::zeros_like(blocks));
  const auto codes = nearest_codes(normalized.clamp(-1, 1)).reshape({-1, 2});
  q.codes = (codes.select(1, 0).to(torch::kInt32) * 16 + codes.select(1, 1).to(torch::kInt32)).to(torch::kUInt8);
  return q;
}

at::Tensor nf4_block_scales(const Nf4Tensor& q) {
  const int64_t B = q.scales.numel();
  const auto group_of = torch::div(torch::arange(B, torch::TensorOptions().dtype(torch::kLong).device(q.scales.device())),
                                   kNf4ScaleGroup, "floor");
  return (q.scales.to(torch::kFloat) * q.group_steps.index_select(0, group_of) + static_cast<float>(q.scale_mean))
      .clamp_min(0);
}

at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype) {
  const auto codes = q.codes.to(torch::kLong);
  const auto high = torch::div(codes, 16, "floor"), low = codes.remainder(16);
  const auto index = torch::stack({high, low}, 1).reshape({-1});
  const auto values = code_book_tensor(q.codes.device(), torch::kFloat).index_select(0, index).view({-1, kNf4Block});
  return (values * nf4_block_scales(q).unsqueeze(1)).reshape(q.shape).to(dtype);
}

at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& weight) {
  return Nf4Linear::apply(x, weight.codes, weight.scales, weight.group_steps, weight.scale_mean, weight.shape)[0];
}

}  // namespace gradguard::model
