// Buckets, hooks and the four wire formats of GradSync (see grad_sync.h for the why).
// The hooks sit on each parameter's AccumulateGrad node as post hooks: they run right
// after autograd has added the micro-batch's gradient into .grad, which is exactly when
// that tensor's contribution to its bucket is final. A hook only counts; launching and
// waiting happen here, in bucket order.
#include "gradguard/dist/grad_sync.h"

#include <chrono>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "gradguard/core/error.h"

namespace gradguard::dist {
namespace {
constexpr double kMiB = 1024.0 * 1024.0;
constexpr uint64_t kPowerSgdSeed = 0x5eedULL;

// Columns of `p` [n, r] made orthonormal in place (modified Gram-Schmidt). A column that
// is (numerically) zero stays finite thanks to the epsilon.
void orthonormalize(at::Tensor p) {
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    auto col = p.select(1, i);
    col.div_(col.norm().add(1e-8));
    if (i + 1 < r) {
      auto rest = p.narrow(1, i + 1, r - i - 1);
      rest.sub_(col.unsqueeze(1) * torch::matmul(col.unsqueeze(0), rest));
    }
  }
}
}  // namespace

struct GradSync::Bucket {
  std::vector<size_t> tensors;   // [i] parameter index
  std::vector<int64_t> offsets;  // [i] element offset in buffer
  at::Tensor buffer;             // flat fp32 [gradient elements (+ side slots)]
  int64_t grad_numel = 0;
  bool carries_side = false;
  Communicator::Work work;
  // fp16 / bf16
  at::Tensor wire;
  std::vector<at::Tensor> gathered;  // [rank] bf16 bytes
  // PowerSGD: the layout is fixed by the parameters and the rank, so it is planned once.
  struct Factor {
    size_t tensor = 0;         // parameter index
    int64_t offset = 0;        // element offset of its gradient in buffer
    int64_t n = 0, m = 0;      // the gradient as an [n, m] matrix (rows = dim 0)
    int64_t p_at = 0, q_at = 0;  // element offsets of P [n, r] in p_buffer, Q [m, r] in q_buffer
  };
  std::vector<Factor> factors;                   // [k] tensors sent as P/Q factors
  std::vector<std::pair<int64_t, int64_t>> plain;  // [j] (offset, numel) of tensors sent as they are
  at::Tensor p_buffer, q_buffer, rest;           // rest: the plain tensors, packed
  int64_t rank = 0;
  Communicator::Work rest_work, q_work;
  bool powersgd = false;  // this step's launch used PowerSGD

  at::Tensor view(size_t i, const at::Tensor& param) const {
    return buffer.narrow(0, offsets[i], param.numel()).view(param.sizes());
  }
  at::Tensor M(const Factor& f) const { return buffer.narrow(0, f.offset, f.n * f.m).view({f.n, f.m}); }
  at::Tensor P(const Factor& f) const { return p_buffer.narrow(0, f.p_at, f.n * rank).view({f.n, rank}); }
  at::Tensor Q(const Factor& f) const { return q_buffer.narrow(0, f.q_at, f.m * rank).view({f.m, rank}); }

  // Splits the bucket into factored and plain tensors: a matrix is factored when its
  // factors are smaller than it, (n + m) r < n m.
  void plan_powersgd(const std::vector<at::Tensor>& params, int64_t r) {
    rank = r;
    int64_t p_total = 0, q_total = 0, rest_total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& p = params[tensors[i]];
      const int64_t n = p.dim() >= 2 ? p.size(0) : 1, m = p.numel() / std::max<int64_t>(n, 1);
      if (p.dim() >= 2 && (n + m) * r < n * m) {
        factors.push_back({tensors[i], offsets[i], n, m, p_total, q_total});
        p_total += n * r, q_total += m * r;
      } else {
        plain.emplace_back(offsets[i], p.numel());
        rest_total += p.numel();
      }
    }
    p_buffer = torch::empty({p_total}, buffer.options());
    q_buffer = torch::empty({q_total}, buffer.options());
    rest = torch::empty({rest_total}, buffer.options());
  }
  // Copies the plain tensors between buffer and rest, in either direction.
  void copy_plain(bool to_rest) {
    int64_t at = 0;
    for (const auto& [offset, numel] : plain) {
      auto in_buffer = buffer.narrow(0, offset, numel), in_rest = rest.narrow(0, at, numel);
      (to_rest ? in_rest : in_buffer).copy_(to_rest ? in_buffer : in_rest);
      at += numel;
    }
  }
};

struct GradSync::Hook : torch::autograd::FunctionPostHook {
  Hook(std::shared_ptr<GradSync*> self, size_t index) : self(std::move(self)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (*self != nullptr) (*self)->mark_ready(index);
    return outputs;
  }
  std::shared_ptr<GradSync*> self;
  size_t index;
};

GradSync::GradSync(std::vector<at::Tensor> params, Communicator& comm, const DistOptions& options, int64_t side_slots)
    : params_(std::move(params)), comm_(comm), options_(options), side_slots_(side_slots),
      self_(std::make_shared<GradSync*>(this)) {
  TORCH_INTERNAL_ASSERT(!params_.empty());
  // fp16, and bf16 where the backend can sum it: divide by the world size, cast, sum.
  if (options_.hook == CommHook::kFp16) scaled_wire_ = torch::kHalf;
  if (options_.hook == CommHook::kBf16 && comm_.sums_bf16()) scaled_wire_ = torch::kBFloat16;
  // The buckets hold the gradients in the parameters' dtype (autograd accumulates into
  // .grad in that dtype): float32, or bf16/fp16 working weights (memory.weights_dtype).
  const auto dtype = params_[0].scalar_type();
  for (const auto& p : params_)
    if (p.scalar_type() != dtype ||
        (dtype != torch::kFloat && dtype != torch::kBFloat16 && dtype != torch::kHalf))
      throw runtime_error("dist", "data-parallel training needs every parameter in one of float32, bfloat16, "
                                  "float16");
  if (dtype != torch::kFloat && options_.hook == CommHook::kPowerSgd)
    throw bad_input("dist.hook", "powersgd needs float32 gradients; with bf16/fp16 weights use none (float32 "
                                 "sum) or bf16");
  const auto opts = params_[0].options().requires_grad(false);

  // Buckets in reverse parameter order, closed once they reach bucket_mb.
  const int64_t cap =
      std::max<int64_t>(1, static_cast<int64_t>(options_.bucket_mb * kMiB / c10::elementSize(dtype)));
  bucket_of_.assign(params_.size(), 0);
  std::vector<std::vector<size_t>> groups(1);
  int64_t filled = 0;
  // The first bucket to launch is kept small (at most 1 MiB, as PyTorch's DDP does) so
  // communication starts early in backward even when the model is only a few buckets.
  const int64_t first_cap = std::min<int64_t>(cap, static_cast<int64_t>(kMiB / 4));
  for (size_t k = params_.size(); k-- > 0;) {
    if (filled >= (groups.size() == 1 ? first_cap : cap)) groups.emplace_back(), filled = 0;
    groups.back().push_back(k);
    filled += params_[k].numel();
  }
  // The side values (the loss, ...) ride in a float32 bucket; next to low-precision
  // gradients they travel on their own so that they are not rounded.
  const bool side_in_bucket = options_.hook == CommHook::kNone && side_slots_ > 0 && dtype == torch::kFloat;
  for (size_t b = 0; b < groups.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->tensors = groups[b];
    for (size_t k : bucket->tensors) {
      bucket->offsets.push_back(bucket->grad_numel);
      bucket->grad_numel += params_[k].numel();
      bucket_of_[k] = b;
    }
    bucket->carries_side = side_in_bucket && b + 1 == groups.size();
    bucket->buffer = torch::zeros({bucket->grad_numel + (bucket->carries_side ? side_slots_ : 0)}, opts);
    if (options_.hook == CommHook::kPowerSgd) bucket->plan_powersgd(params_, options_.powersgd_rank);
    buckets_.push_back(std::move(bucket));
  }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(params_.size(), 0);

  power_.assign(params_.size(), {});
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    TORCH_INTERNAL_ASSERT(acc, "a parameter without a gradient accumulator");
    acc->add_post_hook(std::make_unique<Hook>(self_, k));
    accumulators_.push_back(std::static_pointer_cast<void>(acc));
  }
  begin_step(0);
}

GradSync::~GradSync() {
  *self_ = nullptr;  // hooks outlive us on the accumulators: make them inert
}

int64_t GradSync::num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

int64_t GradSync::compressed_tensors() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += static_cast<int64_t>(b->factors.size());
  return n;
}

bool GradSync::powersgd_active() const {
  return options_.hook == CommHook::kPowerSgd && step_ >= options_.powersgd_start_step;
}

void GradSync::begin_step(int64_t step) {
  step_ = step;
  armed_ = false;
  next_launch_ = 0;
  launched_in_backward_ = 0;
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    bucket->buffer.zero_();
    for (size_t i = 0; i < bucket->tensors.size(); ++i) {
      auto& p = params_[bucket->tensors[i]];
      auto view = bucket->view(i, p);
      if (!p.grad().defined() || p.grad().data_ptr() != view.data_ptr()) p.mutable_grad() = view;
    }
  }
}

void GradSync::arm(const at::Tensor& side) {
  TORCH_INTERNAL_ASSERT(side.numel() == side_slots_);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int64_t>(buckets_[b]->tensors.size());
  std::fill(ready_.begin(), ready_.end(), 0);
  if (side_slots_ > 0) {
    torch::NoGradGuard no_grad;
    auto& last = *buckets_.back();
    if (last.carries_side) {
      last.buffer.narrow(0, last.grad_numel, side_slots_).copy_(side.to(torch::kFloat));
    } else {
      side_ = side.to(torch::kFloat).clone();
      side_work_ = comm_.allreduce_sum_async(side_, "the step's loss all-reduce");
    }
  }
  armed_ = true;
}

void GradSync::mark_ready(size_t tensor) {
  if (!armed_ || ready_[tensor]) return;
  ready_[tensor] = 1;
  --pending_[bucket_of_[tensor]];
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) {
    launch(next_launch_++);
    ++launched_in_backward_;
  }
}

void GradSync::launch(size_t b) {
  torch::NoGradGuard no_grad;
  auto& B = *buckets_[b];
  const std::string what = "gradient all-reduce (bucket " + std::to_string(b) + " of " +
                           std::to_string(buckets_.size()) + ", step " + std::to_string(step_) + ")";
  const double world = static_cast<double>(comm_.world_size());
  B.powersgd = false;
  if (scaled_wire_) {
    B.wire = B.buffer.mul(1.0 / world).to(*scaled_wire_);
    B.work = comm_.allreduce_sum_async(B.wire, what);
  } else if (options_.hook == CommHook::kBf16) {
    B.wire = B.buffer.to(torch::kBFloat16).view(torch::kByte);
    B.gathered.clear();
    for (int64_t r = 0; r < comm_.world_size(); ++r) B.gathered.push_back(torch::empty_like(B.wire));
    B.work = comm_.allgather_async(B.wire, B.gathered, what);
  } else if (powersgd_active()) {
    B.powersgd = true;
    for (const auto& f : B.factors) {
      auto M = B.M(f);
      auto& st = power_[f.tensor];
      if (!st.q.defined()) {
        auto gen = at::detail::createCPUGenerator(kPowerSgdSeed + f.tensor);
        st.q = at::randn({f.m, B.rank}, gen, torch::TensorOptions().dtype(torch::kFloat)).to(M.device());
        st.error = torch::zeros({f.n, f.m}, M.options());
      }
      M.add_(st.error);  // error feedback: what earlier steps did not transmit
      auto P = B.P(f);
      torch::mm_out(P, M, st.q);
    }
    B.copy_plain(/*to_rest=*/true);
    B.work = comm_.allreduce_sum_async(B.p_buffer, what + " [PowerSGD P]");
    B.rest_work = comm_.allreduce_sum_async(B.rest, what + " [uncompressed part]");
  } else if (B.buffer.scalar_type() != torch::kFloat) {
    // Low-precision gradients summed in float32 (one rounding, at the end). Gloo has no
    // bf16 sum at all.
    B.wire = B.buffer.to(torch::kFloat);
    B.work = comm_.allreduce_sum_async(B.wire, what);
  } else {
    B.work = comm_.allreduce_sum_async(B.buffer, what);
  }
}

at::Tensor GradSync::finish() {
  torch::NoGradGuard no_grad;
  armed_ = false;
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  const auto start = std::chrono::steady_clock::now();
  const double world = static_cast<double>(comm_.world_size());
  // First pass: wait; finish the single-round formats; PowerSGD: orthonormalise P,
  // compute Q = M^T P and launch its all-reduce.
  for (auto& bp : buckets_) {
    auto& B = *bp;
    B.work.wait();
    if (scaled_wire_) {
      B.buffer.copy_(B.wire.to(torch::kFloat).mul_(world));
    } else if (options_.hook == CommHook::kBf16) {
      auto sum = B.gathered[0].view(torch::kBFloat16).to(torch::kFloat);
      for (size_t r = 1; r < B.gathered.size(); ++r) sum.add_(B.gathered[r].view(torch::kBFloat16).to(torch::kFloat));
      B.buffer.copy_(sum);
    } else if (B.buffer.scalar_type() != torch::kFloat && !B.powersgd) {
      B.buffer.copy_(B.wire);
    } else if (B.powersgd) {
      B.rest_work.wait();
      B.copy_plain(/*to_rest=*/false);
      for (const auto& f : B.factors) {
        auto P = B.P(f), Q = B.Q(f);
        orthonormalize(P);
        torch::mm_out(Q, B.M(f).t(), P);
      }
      B.q_work = comm_.allreduce_sum_async(B.q_buffer, "PowerSGD Q all-reduce (step " + std::to_string(step_) + ")");
    }
  }
  // Second pass (PowerSGD): M_sum ~ P Q^T; this rank keeps M - P Q^T / world.
  for (auto& bp : buckets_) {
    auto& B = *bp;
    if (!B.powersgd) continue;
    B.q_work.wait();
    for (const auto& f : B.factors) {
      auto M = B.M(f), Q = B.Q(f);
      auto approx = torch::mm(B.P(f), Q.t());
      power_[f.tensor].error.copy_(M).sub_(approx, 1.0 / world);
      M.copy_(approx);
      power_[f.tensor].q.copy_(Q);  // warm start of the next step
    }
  }
  at::Tensor side;
  if (side_slots_ > 0) {
    auto& last = *buckets_.back();
    if (last.carries_side) {
      side = last.buffer.narrow(0, last.grad_numel, side_slots_);
    } else {
      side_work_.wait();
      side = side_;
    }
  }
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return side;
}

void broadcast_parameters(Communicator& comm, const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape({-1}));
  auto buffer = torch::cat(flat);
  // As bytes: Gloo has no bfloat16, and a broadcast needs no arithmetic.
  comm.broadcast({buffer.view(torch::kByte)}, "parameter broadcast from rank 0");
  int64_t at = 0;
  for (const auto& p : params) {
    p.detach().copy_(buffer.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
  }
}

void verify_parameters(Communicator& comm, const std::vector<at::Tensor>& params,
                       const std::vector<std::string>& names, int64_t step) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;  // [tensor] integer sum of the float bits: exact, order-free
  for (const auto& p : params) {
    const auto bits = p.detach().contiguous().view(p.element_size() == 2 ? torch::kShort : torch::kInt);
    sums.push_back(bits.to(torch::kLong).sum());
  }
  auto local = torch::stack(sums);  // on the parameters' device: NCCL reduces device tensors only
  auto both = torch::cat({local, -local});
  comm.allreduce_max(both, "parameter checksum (step " + std::to_string(step) + ")");
  both = both.cpu();
  const auto n = static_cast<int64_t>(params.size());
  const auto* h = both.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    if (h[i] != -h[n + i])
      throw runtime_error("dist", "step " + std::to_string(step) + ": the weights differ across ranks (first in '" +
                                      names[static_cast<size_t>(i)] +
                                      "'); data-parallel replicas must stay identical -- check that every rank runs "
                                      "the same build, config and thread settings");
}

}  // namespace gradguard::dist
