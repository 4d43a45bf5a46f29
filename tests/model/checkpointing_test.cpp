// Activation checkpointing (model.activation_checkpointing) against plain autograd on the
// same weights and batches: the loss is bit-identical (the checkpointed forward runs the
// same kernels), the gradients agree to 1e-6 relative in fp32 and stay close under CPU
// bf16 autocast, micro-batches accumulate into existing .grad, the parameters'
// AccumulateGrad post hooks (what data parallelism's GradSync hangs on) fire once per
// backward, eval / no-grad forwards run the layers plainly, the config key parses and
// validates, and a short training run with it on follows the run with it off.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <set>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "gradguard/amp/precision.h"
#include "gradguard/config/config.h"
#include "gradguard/core/compat.h"
#include "gradguard/data/token_file.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/dist/launch.h"
#include "gradguard/model/llama.h"
#include "gradguard/train/step.h"
#include "gradguard/train/trainer.h"
#include "test_util.h"

namespace gradguard::model {
namespace {

using ::testing::HasSubstr;

constexpr double kFp32Tol = 1e-6;  // relative L2 difference per gradient tensor, fp32
// bf16 autocast: both runs compute the same bf16 kernels on the same inputs (on this
// machine the gradients come out bit-identical, as in fp32); 1e-4 leaves room for a
// different summation order and is still 50x below the ~5e-3 error of a recomputation
// that forgets the forward's autocast and runs in fp32.
constexpr double kBf16Tol = 1e-4;

LlamaOptions small_options() {
  LlamaOptions o;
  o.vocab_size = 64, o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 3, o.num_heads = 4;
  o.num_kv_heads = 2, o.max_seq_len = 32;
  return o;
}

class Checkpointing : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(11);
    net_ = LlamaForCausalLM(small_options());
    for (int m = 0; m < 2; ++m) {
      auto t = torch::randint(0, 64, {3, 17}, torch::kLong);
      batches_.push_back({t.narrow(1, 0, 16).contiguous(), t.narrow(1, 1, 16).contiguous()});
    }
  }
  void clear_grads() {
    for (auto& p : net_->parameters()) p.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> grads() {
    std::vector<at::Tensor> g;
    for (auto& p : net_->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    return g;
  }
  // Gradients of `batches` accumulated from empty .grad, with checkpointing `on`; the
  // global-batch mean loss through `loss`.
  std::vector<at::Tensor> accumulate(bool on, const std::vector<data::Batch>& batches, const amp::AmpOptions& amp,
                                     double* loss = nullptr) {
    net_->set_activation_checkpointing(on);
    clear_grads();
    int64_t tokens = 0;
    for (const auto& b : batches) tokens += b.targets.numel();
    auto l = train::accumulate_gradients(*net_, batches, tokens, amp, torch::kCPU);
    if (loss) *loss = l.item<double>();
    return grads();
  }
  static double rel(const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
  }
  void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol) {
    auto named = net_->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      const auto& name = named[k].key();
      ASSERT_TRUE(want[k].defined()) << name;
      ASSERT_TRUE(got[k].defined()) << name << " received no gradient";
      EXPECT_GT(want[k].abs().max().item<double>(), 0) << name;
      EXPECT_LE(rel(got[k], want[k]), tol) << name;
    }
  }
  LlamaForCausalLM net_{nullptr};
  std::vector<data::Batch> batches_;
};

// Nodes of the graph behind `t` that are checkpointed layers.
int checkpoint_nodes(const at::Tensor& t) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (t.grad_fn()) todo.push_back(t.grad_fn().get());
  int n = 0;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (node->name().find("CheckpointedLayer") != std::string::npos) ++n;
    for (const auto& e : node->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return n;
}

at::Tensor token_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

TEST_F(Checkpointing, Fp32GradientsAndLossMatchPlainAutograd) {
  const std::vector<data::Batch> one = {batches_[0]};
  double plain_loss = 0, ckpt_loss = 0;
  const auto want = accumulate(false, one, {}, &plain_loss);
  const auto got = accumulate(true, one, {}, &ckpt_loss);
  EXPECT_EQ(ckpt_loss, plain_loss);  // the same kernels on the same inputs
  expect_close(got, want, kFp32Tol);
}

TEST_F(Checkpointing, TwoMicroBatchesAccumulateLikePlainAutograd) {
  double plain_loss = 0, ckpt_loss = 0;
  const auto want = accumulate(false, batches_, {}, &plain_loss);
  const auto got = accumulate(true, batches_, {}, &ckpt_loss);
  EXPECT_EQ(ckpt_loss, plain_loss);
  expect_close(got, want, kFp32Tol);

  // Gradients add into whatever .grad already holds, as AccumulateGrad does: seeded with
  // the plain gradients, .grad ends up at twice them.
  net_->set_activation_checkpointing(true);
  auto params = net_->parameters();
  for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = want[k].clone();
  train::accumulate_gradients(*net_, batches_, 2 * batches_[0].targets.numel(), {}, torch::kCPU);
  std::vector<at::Tensor> twice;
  for (const auto& g : want) twice.push_back(2 * g);
  expect_close(grads(), twice, kFp32Tol);
}

TEST_F(Checkpointing, Bf16AutocastGradientsMatchPlainAutograd) {
  amp::AmpOptions bf16;
  bf16.dtype = amp::AmpDtype::kBf16;
  double plain_loss = 0, ckpt_loss = 0;
  const auto want = accumulate(false, batches_, bf16, &plain_loss);
  const auto got = accumulate(true, batches_, bf16, &ckpt_loss);
  EXPECT_EQ(ckpt_loss, plain_loss);
  // Recomputed under the forward's autocast (backward itself runs outside the scope): a
  // recomputation in fp32 would differ by ~1e-2 from the bf16 forward.
  expect_close(got, want, kBf16Tol);
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
}

TEST_F(Checkpointing, AutocastCacheIsNotPoisonedByTheNoGradForward) {
  // Within one autocast region, a checkpointed forward (whose layer runs with grad mode
  // off) followed by a plain forward: had the no-grad forward cached bf16 weight casts,
  // the plain forward would reuse them and those weights would get no gradient. (The
  // Linear layers cast weight.t(), a view autocast never caches, so today this guards
  // against a future op that casts a weight itself.)
  amp::AmpOptions bf16;
  bf16.dtype = amp::AmpDtype::kBf16;
  const auto& b = batches_[0];
  auto run = [&](bool first_on) {
    clear_grads();
    amp::AutocastScope scope(bf16, torch::kCPU);
    net_->set_activation_checkpointing(first_on);
    auto l1 = token_loss(net_->forward(b.inputs), b.targets);
    net_->set_activation_checkpointing(false);
    auto l2 = token_loss(net_->forward(b.inputs), b.targets);
    (l1 + l2).backward();  // inside the scope: the recomputation meets an active autocast
    return grads();
  };
  const auto want = run(false);
  const auto got = run(true);
  expect_close(got, want, kBf16Tol);
}

TEST_F(Checkpointing, OnlyTrainingWithGradModeCheckpoints) {
  const auto& ids = batches_[0].inputs;
  net_->set_activation_checkpointing(true);
  auto train_logits = net_->forward(ids);
  EXPECT_EQ(checkpoint_nodes(train_logits), small_options().num_layers);

  net_->eval();
  auto eval_logits = net_->forward(ids);
  EXPECT_EQ(checkpoint_nodes(eval_logits), 0);
  EXPECT_TRUE(eval_logits.requires_grad());
  EXPECT_TRUE(torch::equal(eval_logits, train_logits));
  {
    torch::NoGradGuard no_grad;
    auto logits = net_->forward(ids);
    EXPECT_FALSE(logits.requires_grad());
    EXPECT_TRUE(torch::equal(logits, train_logits));
  }
  net_->train();
  {
    torch::NoGradGuard no_grad;  // training mode without grad: nothing to checkpoint
    EXPECT_FALSE(net_->forward(ids).requires_grad());
  }
  net_->set_activation_checkpointing(false);
  EXPECT_EQ(checkpoint_nodes(net_->forward(ids)), 0);
}

TEST_F(Checkpointing, DecoderLayerOutsideAModelRecomputesToo) {
  auto layer = DecoderLayer(small_options());
  auto x = torch::randn({2, 8, 32}, torch::requires_grad());
  auto cos = torch::randn({8, 8}), sin = torch::randn({8, 8});
  auto plain = layer->forward(x, cos, sin);
  plain.pow(2).sum().backward();
  const auto gx = x.grad().clone();
  std::vector<at::Tensor> gp;
  for (auto& p : layer->parameters()) gp.push_back(p.grad().clone()), p.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();

  auto ckpt = layer->forward_checkpointed(x, cos, sin);
  EXPECT_TRUE(torch::equal(ckpt, plain));
  ckpt.pow(2).sum().backward();
  EXPECT_LE(rel(x.grad(), gx), kFp32Tol);
  auto params = layer->parameters();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_LE(rel(params[k].grad(), gp[k]), kFp32Tol) << k;
}

// Counts the calls of a parameter's AccumulateGrad post hooks.
struct CountingHook : torch::autograd::FunctionPostHook {
  explicit CountingHook(std::shared_ptr<int> n) : n(std::move(n)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ++*n;
    return outputs;
  }
  std::shared_ptr<int> n;
};

TEST_F(Checkpointing, AccumulateGradHooksFireOncePerParameterAndBackward) {
  std::vector<std::shared_ptr<int>> counts;
  // A parameter holds its AccumulateGrad node only weakly: keep the nodes (and so the
  // hooks) alive, as GradSync does.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (auto& p : net_->parameters()) {
    counts.push_back(std::make_shared<int>(0));
    accumulators.push_back(torch::autograd::impl::grad_accumulator(p));
    accumulators.back()->add_post_hook(std::make_unique<CountingHook>(counts.back()));
  }
  accumulate(true, batches_, {});  // two micro-batches, two backward passes
  auto named = net_->named_parameters();
  for (size_t k = 0; k < counts.size(); ++k) EXPECT_EQ(*counts[k], 2) << named[k].key();
}

TEST_F(Checkpointing, GradSyncSeesTheSameGradientsDuringBackward) {
  // GradSync on a one-rank Gloo group (as tests/dist/grad_sync_test.cpp): its hooks on the
  // AccumulateGrad nodes must launch every bucket during the last backward and leave the
  // plain gradients in .grad.
  const auto want = accumulate(false, batches_, {});
  dist::DistEnv env;
  env.master_port = dist::free_tcp_port("127.0.0.1");
  env.source = "torchrun";
  dist::DistOptions options;
  options.bucket_mb = 0.01;  // several buckets on this model
  std::vector<at::Tensor> params = net_->parameters();
  dist::Communicator comm(env, options, torch::kCPU);
  dist::GradSync sync(params, comm, options, 1);
  ASSERT_GT(sync.num_buckets(), 3);
  net_->set_activation_checkpointing(true);
  for (int64_t step = 0; step < 2; ++step) {
    sync.begin_step(step);
    train::accumulate(*net_, batches_, 2 * batches_[0].targets.numel(), {}, torch::kCPU, 1.0, false,
                      [&](const train::Accumulation& a) { sync.arm(a.loss.to(torch::kFloat).reshape({1})); });
    sync.finish();
    EXPECT_EQ(sync.buckets_launched_in_backward(), sync.num_buckets()) << "step " << step;
    expect_close(grads(), want, kFp32Tol);
  }
}

TEST(CheckpointingConfig, KeyParsesDefaultsOffAndRejectsNonBooleans) {
  EXPECT_FALSE(config::load_config("", {}).model.activation_checkpointing);
  EXPECT_FALSE(LlamaOptions{}.activation_checkpointing);
  auto c = config::load_config("", {"model.activation_checkpointing=true"});
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_THAT(config::to_yaml(c), HasSubstr("activation_checkpointing: true"));
  test::TempDir dir;
  test::write_text(dir.file("c.yaml"), "model:\n  activation_checkpointing: yes please\n");
  auto msg = test::bad_input_message([&] { config::load_config(dir.file("c.yaml"), {}); });
  EXPECT_THAT(msg, HasSubstr("model.activation_checkpointing"));
  EXPECT_THAT(msg, HasSubstr("boolean"));
  msg = test::bad_input_message([] { config::load_config("", {"model.activation_checkpointing=2"}); });
  EXPECT_THAT(msg, HasSubstr("model.activation_checkpointing"));
}

TEST(CheckpointingTraining, ShortRunFollowsTheRunWithoutCheckpointing) {
  test::TempDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 97 + 32));
  data::write_token_file(dir.file("train.bin"), tokens);
  auto config = [&](const std::string& name, bool on) {
    return config::load_config(test::source_path("configs/tiny.yaml"),
                               {"data.train_path=" + dir.file("train.bin"), "data.val_path=", "run.dir=" + dir.path(),
                                "run.name=" + name, "log.progress=quiet", "checkpoint.every=0", "telemetry.enabled=false",
                                std::string("model.activation_checkpointing=") + (on ? "true" : "false")});
  };
  const auto plain = train::Trainer(config("plain", false)).run();
  const auto ckpt = train::Trainer(config("ckpt", true)).run();
  EXPECT_EQ(ckpt.steps, 6);
  EXPECT_EQ(ckpt.skipped_steps, 0);
  EXPECT_EQ(ckpt.first_loss, plain.first_loss);
  EXPECT_NEAR(ckpt.final_loss, plain.final_loss, 1e-5 * plain.final_loss);
  EXPECT_THAT(test::read_text(dir.file("ckpt/config.yaml")), HasSubstr("activation_checkpointing: true"));
  auto step_lines = [&](const std::string& run) {
    std::vector<nlohmann::json> out;
    for (auto& l : test::read_jsonl(dir.file(run + "/metrics.jsonl")))
      if (l.contains("grad_norm") && !l.contains("event")) out.push_back(l);
    return out;
  };
  const auto a = step_lines("plain"), b = step_lines("ckpt");
  ASSERT_EQ(a.size(), b.size());
  size_t compared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i]["step"]);
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-5 * a[i]["loss"].get<double>())
        << "step " << i;
    EXPECT_NEAR(b[i]["grad_norm"].get<double>(), a[i]["grad_norm"].get<double>(),
                1e-5 * a[i]["grad_norm"].get<double>())
        << "step " << i;
    ++compared;
  }
  EXPECT_EQ(compared, 6u);
}

}  // namespace
}  // namespace gradguard::model
