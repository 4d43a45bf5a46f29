// 4-bit NormalFloat (NF4) weights, QLoRA's storage for a frozen base (Dettmers et al.
// 2023, arXiv 2305.14314, section 3 and appendix E):
//
//   code book   16 values: the quantiles of N(0, 1) that split its mass evenly, built
//               asymmetrically so that 0 is exact -- 8 positive values Q(p) for p spaced
//               evenly from 0.9677083 down to 0.5 (9 points, the last dropped), 7 negative
//               values -Q(p) over 8 points likewise, and 0 -- then divided by the largest,
//               so they span [-1, 1]. Q is the normal quantile function; 0.9677083 is
//               the mean of 1 - 1/(2 x 15) and 1 - 1/(2 x 16).
//   blocks      each run of 64 consecutive elements (row-major) is divided by its absmax
//               and every element stored as the index of the nearest code (a tie goes to
//               the lower one), two per byte: element 2k in the high nibble, 2k + 1 in
//               the low one.
//   scales      double quantization: the blocks' absmax values are stored as int8 around
//               their mean, in groups of 256 blocks each with a float32 scale (the paper
//               stores them as 8-bit floats; the bytes per parameter are the same:
//               0.5 + 1/64 + 4/(64 x 256), about 0.516).
//
// Dequantization is code_book[index] x (scale of the block). A weight is quantized once
// (at load) and dequantized into a temporary each time it is used; nf4_linear does so in
// both forward and backward, so autograd never keeps a dequantized copy.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::model {

inline constexpr int64_t kNf4Block = 64;         // elements per absmax
inline constexpr int64_t kNf4ScaleGroup = 256;   // absmax values per float32 scale

// The 16 code values, ascending (-1 ... 0 ... 1), as float32.
const std::array<float, 16>& nf4_code_book();

struct Nf4Tensor {
  std::vector<int64_t> shape;  // of the original weight
  at::Tensor codes;            // uint8 [numel / 2]
  at::Tensor scales;           // int8 [numel / 64]: each block's absmax - scale_mean, in units of its group's step
  at::Tensor group_steps;      // float32 [ceil(blocks / 256)]: max |absmax - mean| of the group / 127
  double scale_mean = 0;       // mean of the blocks' absmax
  int64_t numel() const;
  int64_t bytes() const;       // of the four parts together
};

// Quantizes a floating weight whose element count is a multiple of 64. Throws
// gradguard::Error (bad input) naming `name` otherwise.
Nf4Tensor nf4_quantize(const at::Tensor& weight, const std::string& name);
// The blocks' absmax values as stored (after double quantization), float32 [numel / 64].
at::Tensor nf4_block_scales(const Nf4Tensor& q);
// The weight back, in `dtype`, on the codes' device.
at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype);

// x [..., in] -> x W^T [..., out] with W [out, in] stored as `weight`, differentiable in x
// only (the base is frozen). The dequantized W exists only inside the forward and the
// backward computation, in x's dtype.
at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& weight);

}  // namespace gradguard::model
