// GradSync on a one-rank group (a real TCPStore and process group of size 1, so every
// code path runs; the sums over ranks are the identity): buckets launch during the last
// backward only, the gradients are the plain accumulation's, the fp16/bf16 hooks round
// exactly as the wire formats do, and PowerSGD's error feedback accounts for every bit
// it did not send (approximation + error = input). Every case runs on Gloo and the CPU
// (GlooCpu) and, in a CUDA/ROCm build on a machine with a GPU, on NCCL and the GPU
// (NcclGpu; skipped elsewhere). Two-rank behaviour is tested end to end in
// data_parallel_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include "gradguard/config/config.h"
#include "gradguard/core/choice.h"
#include "gradguard/core/device.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/dist/launch.h"
#include "gradguard/model/llama.h"
#include "gradguard/train/step.h"
#include "test_util.h"

namespace gradguard {
namespace {

using dist::CommHook;

class GradSyncTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "NcclGpu") {
      if (!dist::nccl_compiled() || !torch::cuda::is_available())
        GTEST_SKIP() << "needs a CUDA/ROCm build of gradguard and a GPU";
      device_ = torch::Device(torch::kCUDA, 0);
      make_current(device_);
    }
    env_.master_port = dist::free_tcp_port("127.0.0.1");
    env_.source = "torchrun";
    torch::manual_seed(3);
    model::LlamaOptions o;
    o.vocab_size = 64, o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 2, o.num_heads = 4;
    o.num_kv_heads = 2, o.max_seq_len = 16;
    net_ = model::LlamaForCausalLM(o);
    net_->to(device_);
    for (const auto& p : net_->parameters()) params_.push_back(p);
    for (int m = 0; m < 3; ++m) {
      auto t = torch::randint(0, 64, {2, 9}, torch::kLong);
      batches_.push_back({t.narrow(1, 0, 8).contiguous(), t.narrow(1, 1, 8).contiguous()});
    }
  }
  // Gradients of the three micro-batches without any synchronisation.
  std::vector<at::Tensor> reference() {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
    train::accumulate(*net_, batches_, 48, amp_, device_, 1.0, false);
    std::vector<at::Tensor> g;
    for (auto& p : params_) g.push_back(p.grad().clone());
    return g;
  }
  // One step through GradSync with `options`; returns the summed side vector.
  at::Tensor step(dist::GradSync& sync, int64_t s) {
    sync.begin_step(s);
    int calls = 0;
    train::accumulate(*net_, batches_, 48, amp_, device_, 1.0, false, [&](const train::Accumulation& a) {
      ++calls;
      EXPECT_EQ(sync.buckets_launched_in_backward(), 0);  // nothing before the last backward
      sync.arm(torch::stack({a.loss.to(torch::kFloat), torch::tensor(2.5f, a.loss.options().dtype(torch::kFloat))}));
    });
    EXPECT_EQ(calls, 1);
    return sync.finish();
  }
  // The same gradient: bit for bit on the CPU; on a GPU up to the last bits, where some
  // backward kernels (embedding) may sum in a different order from one run to the next.
  // `rounding` widens the tolerance to the relative step of a wire format.
  void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what, double rounding = 0) {
    if (device_.is_cpu() && rounding == 0) {
      EXPECT_TRUE(torch::equal(got, want)) << what;
    } else {
      EXPECT_TRUE(torch::allclose(got, want, std::max(rounding, 1e-5), 1e-7)) << what;
    }
  }
  torch::Device device_ = torch::kCPU;
  dist::DistEnv env_;
  model::LlamaForCausalLM net_{nullptr};
  std::vector<at::Tensor> params_;
  std::vector<data::Batch> batches_;
  amp::AmpOptions amp_;
};

TEST_P(GradSyncTest, BucketsLaunchDuringTheLastBackwardAndGradientsMatch) {
  const auto ref = reference();
  dist::DistOptions options;
  options.bucket_mb = 0.01;  // ~2.6k floats: several buckets on this model
  dist::Communicator comm(env_, options, device_);
  dist::GradSync sync(params_, comm, options, 2);
  ASSERT_GT(sync.num_buckets(), 3);
  const auto side = step(sync, 0);
  // Every bucket went out while backward was still running.
  EXPECT_EQ(sync.buckets_launched_in_backward(), sync.num_buckets());
  for (size_t k = 0; k < params_.size(); ++k) expect_same(params_[k].grad(), ref[k], std::to_string(k));
  EXPECT_FLOAT_EQ(side[1].item<float>(), 2.5f);
  // The next step starts from zeroed buckets, and .grad still points into them.
  const auto side2 = step(sync, 1);
  for (size_t k = 0; k < params_.size(); ++k) expect_same(params_[k].grad(), ref[k], std::to_string(k));
  EXPECT_FLOAT_EQ(side2[0].item<float>(), side[0].item<float>());
}

TEST_P(GradSyncTest, Fp16AndBf16HooksRoundLikeTheirWireFormats) {
  const auto ref = reference();
  for (const CommHook hook : {CommHook::kFp16, CommHook::kBf16}) {
    dist::DistOptions options;
    options.hook = hook;
    dist::Communicator comm(env_, options, device_);
    {
      dist::GradSync sync(params_, comm, options, 2);
      const auto side = step(sync, 0);
      const auto dtype = hook == CommHook::kFp16 ? torch::kHalf : torch::kBFloat16;
      for (size_t k = 0; k < params_.size(); ++k)
        expect_same(params_[k].grad(), ref[k].to(dtype).to(torch::kFloat),
                    std::string(name_of(hook)) + " " + std::to_string(k),
                    device_.is_cpu() ? 0 : hook == CommHook::kFp16 ? 1e-3 : 8e-3);
      EXPECT_FLOAT_EQ(side[1].item<float>(), 2.5f);  // the side vector stays fp32
    }
    env_.master_port = dist::free_tcp_port("127.0.0.1");
  }
}

TEST_P(GradSyncTest, PowerSgdApproximatesAndFeedsTheErrorBack) {
  const auto ref = reference();
  dist::DistOptions options;
  options.hook = CommHook::kPowerSgd;
  options.powersgd_rank = 2;
  options.powersgd_start_step = 1;
  dist::Communicator comm(env_, options, device_);
  dist::GradSync sync(params_, comm, options, 2);
  step(sync, 0);  // before the start step: exact
  for (size_t k = 0; k < params_.size(); ++k) expect_same(params_[k].grad(), ref[k], std::to_string(k));
  step(sync, 1);
  EXPECT_GT(sync.compressed_tensors(), 0);
  int64_t approximated = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& g = params_[k].grad();
    if (params_[k].dim() < 2) {
      expect_same(g, ref[k], "vectors travel uncompressed: " + std::to_string(k));
      continue;
    }
    const int64_t n = g.size(0), m = g.numel() / n;
    if ((n + m) * 2 >= n * m) continue;  // too small to gain: sent as is
    ++approximated;
    // A rank-2 approximation of the gradient...
    EXPECT_LE(at::linalg_matrix_rank(g.reshape({n, m})).item<int64_t>(), 2) << k;
    EXPECT_FALSE(torch::allclose(g, ref[k])) << k;
  }
  EXPECT_GT(approximated, 0);
  // ...whose residual is fed back: with the same gradient every step, the applied
  // approximations A_t sum to t * g - e_t with a bounded error e_t, so their mean closes
  // in on g like 1/t. Without error feedback it would stay at the rank-2 projection.
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); };
  std::vector<at::Tensor> first, sum;
  for (auto& p : params_) first.push_back(p.grad().clone()), sum.push_back(p.grad().clone());
  const int steps = 40;
  for (int t = 2; t <= steps; ++t) {
    step(sync, t);
    for (size_t k = 0; k < params_.size(); ++k) sum[k] += params_[k].grad();
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].dim() < 2 || rel(first[k], ref[k]) < 1e-6) continue;
    const double one = rel(first[k], ref[k]), mean = rel(sum[k] / steps, ref[k]);
    EXPECT_LT(mean, 0.25 * one) << "tensor " << k << ": one step " << one << ", mean of " << steps << " " << mean;
  }
}

TEST_P(GradSyncTest, AnInfSurvivesEveryHook) {
  for (const CommHook hook : {CommHook::kNone, CommHook::kFp16, CommHook::kBf16, CommHook::kPowerSgd}) {
    dist::DistOptions options;
    options.hook = hook;
    options.powersgd_start_step = 0;
    dist::Communicator comm(env_, options, device_);
    {
      dist::GradSync sync(params_, comm, options, 2);
      sync.begin_step(0);
      train::accumulate(*net_, batches_, 48, amp_, device_, 1.0, false, [&](const train::Accumulation& a) {
        torch::NoGradGuard no_grad;
        params_[0].grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
        sync.arm(torch::stack({a.loss.to(torch::kFloat), torch::tensor(0.f)}));
      });
      sync.finish();
      double total = 0;
      for (const auto& p : params_) total += p.grad().sum().item<double>();
      EXPECT_FALSE(std::isfinite(total)) << name_of(hook);
    }
    env_.master_port = dist::free_tcp_port("127.0.0.1");
  }
}

TEST_P(GradSyncTest, ParameterChecksumsAgreeOnOneRank) {
  dist::DistOptions options;
  dist::Communicator comm(env_, options, device_);
  std::vector<std::string> names;
  for (const auto& item : net_->named_parameters()) names.push_back(item.key());
  dist::broadcast_parameters(comm, params_);
  EXPECT_NO_THROW(dist::verify_parameters(comm, params_, names, 0));
}

TEST_P(GradSyncTest, Bf16GradientsAreSummedInFloat32AndTheSideValuesAreNotRounded) {
  // memory.weights_dtype bf16: the buckets hold bf16 gradients; on one rank the float32
  // sum is the identity, so .grad equals the plain bf16 accumulation bit for bit, and the
  // side vector (travelling on its own, in float32) keeps 2.5 + 2^-20, which bf16 would round.
  net_->to(torch::kBFloat16);
  const auto ref = reference();
  dist::DistOptions options;
  dist::Communicator comm(env_, options, device_);
  {
    dist::GradSync sync(params_, comm, options, 2);
    sync.begin_step(0);
    train::accumulate(*net_, batches_, 48, amp_, device_, 1.0, false, [&](const train::Accumulation& a) {
      sync.arm(torch::stack({a.loss.to(torch::kFloat), torch::tensor(2.5f + 0x1p-20f, a.loss.options().dtype(torch::kFloat))}));
    });
    const auto side = sync.finish();
    for (size_t k = 0; k < params_.size(); ++k) {
      EXPECT_EQ(params_[k].grad().scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(params_[k].grad(), ref[k])) << k;
    }
    EXPECT_EQ(side.scalar_type(), torch::kFloat);
    EXPECT_EQ(side[1].item<float>(), 2.5f + 0x1p-20f);
  }
  // The replicas' checksums read 2-byte weights too; powersgd needs float32.
  std::vector<std::string> names;
  for (const auto& item : net_->named_parameters()) names.push_back(item.key());
  EXPECT_NO_THROW(dist::verify_parameters(comm, params_, names, 0));
  options.hook = dist::CommHook::kPowerSgd;
  EXPECT_THAT(test::bad_input_message([&] { dist::GradSync(params_, comm, options, 2); }),
              ::testing::HasSubstr("powersgd needs float32"));
}

INSTANTIATE_TEST_SUITE_P(Backend, GradSyncTest, ::testing::Values("GlooCpu", "NcclGpu"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(DistOptions, EveryBadValueNamesItsKey) {
  auto check = [](auto mutate, const std::string& key) {
    dist::DistOptions o;
    mutate(o);
    EXPECT_NE(test::bad_input_message([&] { o.validate(); }).find(key), std::string::npos) << key;
  };
  check([](dist::DistOptions& o) { o.timeout_s = 0; }, "dist.timeout_s");
  check([](dist::DistOptions& o) { o.bucket_mb = -1; }, "dist.bucket_mb");
  check([](dist::DistOptions& o) { o.powersgd_rank = 0; }, "dist.powersgd_rank");
  check([](dist::DistOptions& o) { o.powersgd_start_step = -1; }, "dist.powersgd_start_step");
  check([](dist::DistOptions& o) { o.check_every = -2; }, "dist.check_every");
  check([](dist::DistOptions& o) { o.heartbeat_s = 0; }, "dist.heartbeat_s");
  check([](dist::DistOptions& o) { o.heartbeat_s = 200; }, "dist.heartbeat_s");  // > timeout / 3
  // Unknown names are rejected where the config is read, with the valid ones.
  auto rejected = [](const std::string& assignment) {
    return test::bad_input_message([&] { config::load_config("", {assignment}); });
  };
  EXPECT_NE(rejected("dist.backend=mpi").find("dist.backend: 'mpi' is not valid (valid: auto, gloo, nccl)"),
            std::string::npos);
  EXPECT_NE(rejected("dist.hook=int8").find("dist.hook: 'int8' is not valid (valid: none, fp16, bf16, powersgd)"),
            std::string::npos);
}

TEST(DistBackend, AutoIsNcclOnGpusAndGlooOnTheCpu) {
  const torch::Device cpu(torch::kCPU), gpu(torch::kCUDA, 0);  // only the choice: nothing touches a GPU
  using dist::DistBackend;
  EXPECT_EQ(dist::choose_backend(DistBackend::kAuto, cpu, false), DistBackend::kGloo);
  EXPECT_EQ(dist::choose_backend(DistBackend::kAuto, cpu, true), DistBackend::kGloo);
  EXPECT_EQ(dist::choose_backend(DistBackend::kGloo, cpu, true), DistBackend::kGloo);
  EXPECT_EQ(dist::choose_backend(DistBackend::kAuto, gpu, true), DistBackend::kNccl);
  EXPECT_EQ(dist::choose_backend(DistBackend::kNccl, gpu, true), DistBackend::kNccl);
}

TEST(DistBackend, CombinationsThatCannotWorkSayWhatWould) {
  const torch::Device cpu(torch::kCPU), gpu(torch::kCUDA, 1);
  auto message = [](const std::function<void()>& f) {
    const auto m = test::bad_input_message(f);
    EXPECT_NE(m.find("dist.backend"), std::string::npos) << m;
    return m;
  };
  using dist::DistBackend;
  EXPECT_NE(message([&] { dist::choose_backend(DistBackend::kNccl, cpu, true); }).find("GPUs only"),
            std::string::npos);
  EXPECT_NE(message([&] { dist::choose_backend(DistBackend::kNccl, gpu, false); })
                .find("LibTorch built with CUDA or ROCm"),
            std::string::npos);
  EXPECT_NE(message([&] { dist::choose_backend(DistBackend::kAuto, gpu, false); })
                .find("LibTorch built with CUDA or ROCm"),
            std::string::npos);
  EXPECT_NE(message([&] { dist::choose_backend(DistBackend::kGloo, gpu, true); }).find("on GPUs use nccl"),
            std::string::npos);
  // An unknown name cannot reach choose_backend: it is rejected where it is parsed.
  EXPECT_NE(message([&] { parse_choice<DistBackend>("mpi", "dist.backend"); }).find("valid: auto, gloo, nccl"),
            std::string::npos);
}

TEST(DistBackend, NcclOnTheCpuStopsBeforeTheRendezvous) {
  dist::DistEnv env;
  env.world_size = 2;  // nobody else comes: the check must come first
  dist::DistOptions o;
  o.backend = dist::DistBackend::kNccl;
  EXPECT_NE(test::bad_input_message([&] { dist::Communicator comm(env, o, torch::kCPU); }).find("dist.backend"),
            std::string::npos);
}

TEST(DistBackend, ThisBuildSaysWhetherItHasNccl) {
  // NCCL's process group comes with the GPU code: a CUDA or ROCm build has both.
  EXPECT_EQ(dist::nccl_compiled(), std::string(gpu_build_kind()) != "CPU");
}

}  // namespace
}  // namespace gradguard
