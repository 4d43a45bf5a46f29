// Fused CPU kernels for SwiGLU, RMSNorm and RoPE (see fused_ops.h). Each is a custom
// autograd Function whose forward and backward are one loop over the data, split across
// ATen's intra-op threads with at::parallel_for; the inner loops are plain float
// arithmetic that the compiler vectorises. The one transcendental, SwiGLU's sigmoid, is
// ATen's own vectorised kernel, run once in forward and saved for backward.
//
// Gradient formulas (x the input, dy the incoming gradient):
//   SwiGLU  h = g s u, s = sigmoid(g):  du = dy g s,  dg = dy u s (1 + g (1 - s))
//   RMSNorm y = w x r, r = (mean(x^2) + eps)^-1/2, a = dy w:
//           dx = r a - x r^3 sum(a x) / d,  dw = sum over rows of dy x r
//   RoPE    out_j = x_j c_j - x_{j+h} s_j (j < h),  x_j c_j + x_{j-h} s_j (j >= h), h = hd/2:
//           dx_i = dy_i c_i + dy_{i+h} s_{i+h} (i < h),  dy_i c_i - dy_{i-h} s_{i-h} (i >= h)
#include "gradguard/model/fused_ops.h"

#include <cmath>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace gradguard::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Elements (or rows) per parallel chunk: big enough that a thread's share outweighs the
// hand-off, small enough to split a [B*T, d] activation of a small model.
constexpr int64_t kGrain = 16384;
// RMSNorm's weight gradient sums fixed blocks of rows into their own partial rows, then
// the partials in order, so the result does not depend on the number of threads.
constexpr int64_t kRowBlock = 64;

bool fusable(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

// ---- SwiGLU -------------------------------------------------------------------------------

struct SwiGluFn : torch::autograd::Function<SwiGluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    auto g = gate.contiguous(), u = up.contiguous();
    auto s = torch::sigmoid(g);
    auto h = torch::empty_like(g);
    const float *gp = g.data_ptr<float>(), *up_ = u.data_ptr<float>(), *sp = s.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hp[i] = gp[i] * sp[i] * up_[i];
    });
    ctx->save_for_backward({g, u, s});
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &g = saved[0], &u = saved[1], &s = saved[2];
    auto dy = grad_outputs[0].contiguous();
    const bool want_g = ctx->needs_input_grad(0), want_u = ctx->needs_input_grad(1);
    at::Tensor dg = want_g ? torch::empty_like(g) : at::Tensor();
    at::Tensor du = want_u ? torch::empty_like(u) : at::Tensor();
    const float *gp = g.data_ptr<float>(), *up_ = u.data_ptr<float>(), *sp = s.data_ptr<float>(),
                *dyp = dy.data_ptr<float>();
    float* dgp = want_g ? dg.data_ptr<float>() : nullptr;
    float* dup = want_u ? du.data_ptr<float>() : nullptr;
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (dup)
        for (int64_t i = begin; i < end; ++i) dup[i] = dyp[i] * gp[i] * sp[i];
      if (dgp)
        for (int64_t i = begin; i < end; ++i)
          dgp[i] = dyp[i] * up_[i] * sp[i] * (1.0f + gp[i] * (1.0f - sp[i]));
    });
    return {dg, du};
  }
};

// ---- RMSNorm ------------------------------------------------------------------------------

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, double eps) {
    auto x = input.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    auto y = torch::empty_like(x);
    auto rstd = torch::empty({rows}, x.options());  // [rows] 1/sqrt(mean(x^2) + eps)
    const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* xr = xp + r * d;
        float* yr = yp + r * d;
        float ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
        const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + static_cast<float>(eps));
        rp[r] = rs;
        for (int64_t j = 0; j < d; ++j) yr[j] = wp[j] * (xr[j] * rs);
      }
    });
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &rstd = saved[2];
    auto dy = grad_outputs[0].contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor dx = want_x ? torch::empty_like(x) : at::Tensor();
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    at::Tensor partial = want_w ? torch::zeros({blocks, d}, x.options()) : at::Tensor();  // [blocks, d]
    const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>(), *rp = rstd.data_ptr<float>(),
                *dyp = dy.data_ptr<float>();
    float* dxp = want_x ? dx.data_ptr<float>() : nullptr;
    float* pp = want_w ? partial.data_ptr<float>() : nullptr;
    const float inv_d = 1.0f / static_cast<float>(d);
    at::parallel_for(0, blocks, std::max<int64_t>(1, kGrain / (d * kRowBlock)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        float* pb = pp ? pp + b * d : nullptr;
        for (int64_t r = b * kRowBlock; r < std::min(rows, (b + 1) * kRowBlock); ++r) {
          const float *xr = xp + r * d, *dyr = dyp + r * d;
          const float rs = rp[r];
          if (dxp) {
            float c = 0;  // sum_j dy_j w_j x_j
            for (int64_t j = 0; j < d; ++j) c += dyr[j] * wp[j] * xr[j];
            const float k = rs * rs * rs * c * inv_d;
            float* dxr = dxp + r * d;
            for (int64_t j = 0; j < d; ++j) dxr[j] = rs * dyr[j] * wp[j] - xr[j] * k;
          }
          if (pb)
            for (int64_t j = 0; j < d; ++j) pb[j] += dyr[j] * xr[j] * rs;
        }
      }
    });
    at::Tensor dw = want_w ? partial.sum(0) : at::Tensor();
    return {dx, dw, at::Tensor()};
  }
};

// ---- RoPE ---------------------------------------------------------------------------------

// out = x * c + rotate_half(x) * s over x [rows = B*T*H, hd] with tables [T, hd], or
// [B, T, hd] when `per_row` (one position per token); `transpose` applies the rotation's
// transpose (the backward pass, which also reads the table entries of the partner index:
// see the formulas at the top).
void rope_kernel(const float* x, const float* c, const float* s, float* out, int64_t B, int64_t T, int64_t H,
                 int64_t hd, bool per_row, bool transpose) {
  const int64_t h = hd / 2;
  at::parallel_for(0, B * T, std::max<int64_t>(1, kGrain / (H * hd)), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t t = per_row ? bt : bt % T;
      const float *ct = c + t * hd, *st = s + t * hd;
      for (int64_t head = 0; head < H; ++head) {
        const float* xr = x + (bt * H + head) * hd;
        float* o = out + (bt * H + head) * hd;
        if (!transpose) {
          for (int64_t j = 0; j < h; ++j) o[j] = xr[j] * ct[j] - xr[j + h] * st[j];
          for (int64_t j = h; j < hd; ++j) o[j] = xr[j] * ct[j] + xr[j - h] * st[j];
        } else {
          for (int64_t j = 0; j < h; ++j) o[j] = xr[j] * ct[j] + xr[j + h] * st[j + h];
          for (int64_t j = h; j < hd; ++j) o[j] = xr[j] * ct[j] - xr[j - h] * st[j - h];
        }
      }
    }
  });
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& cos,
                            const at::Tensor& sin) {
    auto x = input.contiguous();
    auto c = cos.contiguous(), s = sin.contiguous();
    auto out = torch::empty_like(x);
    rope_kernel(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), out.data_ptr<float>(), x.size(0),
                x.size(1), x.size(2), x.size(3), /*per_row=*/c.dim() == 3, /*transpose=*/false);
    ctx->save_for_backward({c, s});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (!ctx->needs_input_grad(0)) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto dy = grad_outputs[0].contiguous();
    auto dx = torch::empty_like(dy);
    rope_kernel(dy.data_ptr<float>(), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(), dx.data_ptr<float>(),
                dy.size(0), dy.size(1), dy.size(2), dy.size(3), /*per_row=*/saved[0].dim() == 3,
                /*transpose=*/true);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

}  // namespace

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) { return torch::silu(gate) * up; }

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (fusable(gate) && fusable(up) && gate.sizes() == up.sizes() && gate.numel() > 0)
    return SwiGluFn::apply(gate, up);
  return swiglu_reference(gate, up);
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(torch::kFloat);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fusable(x) && fusable(weight) && x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0) &&
      x.numel() > 0 && weight.is_contiguous())
    return RmsNormFn::apply(x, weight, eps);
  return rms_norm_reference(x, weight, eps);
}

at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x [B, T, H, hd]; the tables broadcast as [T, 1, hd] (or [B, T, 1, hd]), in x's dtype as
  // HF does under autocast.
  auto c = cos.unsqueeze(-2), s = sin.unsqueeze(-2);
  if (c.scalar_type() != x.scalar_type()) c = c.to(x.scalar_type()), s = s.to(x.scalar_type());
  return x * c + rotate_half(x) * s;
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const bool per_row = cos.dim() == 3 && cos.size(0) == x.size(0);  // [B, T, hd]
  const bool shapes = x.dim() == 4 && x.size(3) % 2 == 0 && (cos.dim() == 2 || per_row) &&
                      sin.sizes() == cos.sizes() && cos.size(-2) == x.size(1) && cos.size(-1) == x.size(3);
  if (shapes && fusable(x) && fusable(cos) && fusable(sin) && !cos.requires_grad() && !sin.requires_grad() &&
      x.numel() > 0)
    return RopeFn::apply(x, cos, sin);
  return rope_reference(x, cos, sin);
}

}  // namespace gradguard::model
