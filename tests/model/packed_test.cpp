// Packed sequences: LlamaForCausalLM::forward(input_ids, positions, segments).
//
// The reference is the model itself run on each sample alone with forward(input_ids):
// a sample packed into a row with its positions restarting at 0 and its own segment id
// must see exactly what it sees alone (same rotary angles, same keys), so its logits
// agree to float32 rounding (1e-5 absolute; the masked scores differ only in which
// kernels summed what) and the gradients of the packed row's summed token loss equal the
// sum of the samples' summed losses (1e-5 relative per parameter). Undefined positions
// and segments must be the unpacked forward bit for bit, activation checkpointing must
// not change the packed gradients, and malformed arguments are bad input naming the
// argument. Each case runs for MHA, GQA and MQA.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "gradguard/amp/precision.h"
#include "gradguard/core/error.h"
#include "gradguard/model/llama.h"
#include "test_util.h"

namespace gradguard::model {
namespace {

constexpr double kLogitTol = 1e-5;  // absolute, fp32 logits of O(1)
constexpr double kGradTol = 1e-5;   // relative L2 per parameter, fp32

// One row: samples of these lengths, then `pad` padding tokens (segment id -1).
struct Row {
  std::vector<int64_t> lengths;
  int64_t pad;
};

// Row 0 is the case of the brief: 5 + 7 + 4 tokens and 4 of padding; row 1 splits the
// same 20 columns differently, so the batch dimension of the mask is exercised too.
const std::vector<Row> kRows = {{{5, 7, 4}, 4}, {{9, 11}, 0}};
constexpr int64_t kT = 20;

LlamaOptions small_options(int64_t kv_heads) {
  LlamaOptions o;
  o.vocab_size = 64, o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 2, o.num_heads = 4;
  o.num_kv_heads = kv_heads, o.max_seq_len = 32;
  return o;
}

struct Packed {
  at::Tensor ids, targets, positions, segments;  // [B, T] each; targets -1 on padding
  std::vector<std::vector<std::pair<int64_t, int64_t>>> spans;  // [row][sample] (start, length)
};

Packed make_packed() {
  Packed p;
  p.ids = torch::randint(0, 64, {2, kT}, torch::kLong);
  p.targets = torch::randint(0, 64, {2, kT}, torch::kLong);
  p.positions = torch::zeros({2, kT}, torch::kLong);
  p.segments = torch::full({2, kT}, -1, torch::kLong);
  for (size_t b = 0; b < kRows.size(); ++b) {
    int64_t start = 0, id = 0;
    p.spans.emplace_back();
    for (int64_t len : kRows[b].lengths) {
      p.positions[b].narrow(0, start, len).copy_(torch::arange(len, torch::kLong));
      p.segments[b].narrow(0, start, len).fill_(id++);
      p.spans.back().emplace_back(start, len);
      start += len;
    }
    // Padding: its own segment, positions counting on (any values would do).
    p.positions[b].narrow(0, start, kT - start).copy_(torch::arange(kT - start, torch::kLong));
    p.targets[b].narrow(0, start, kT - start).fill_(-1);
  }
  return p;
}

at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-1));
}

std::vector<at::Tensor> take_grads(LlamaForCausalLMImpl& m) {
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) {
    g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    p.mutable_grad() = at::Tensor();
  }
  return g;
}

void expect_grads_close(LlamaForCausalLMImpl& m, const std::vector<at::Tensor>& got,
                        const std::vector<at::Tensor>& want, double tol) {
  auto named = m.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_GT(want[k].norm().item<double>(), 0) << named[k].key();
    const double rel = ((got[k] - want[k]).norm() / want[k].norm()).item<double>();
    EXPECT_LE(rel, tol) << named[k].key();
  }
}

class Packing : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    torch::manual_seed(5);
    net_ = LlamaForCausalLM(small_options(GetParam()));
    packed_ = make_packed();
  }
  LlamaForCausalLM net_{nullptr};
  Packed packed_;
};

// (a) Every packed sample's logits equal those of the sample run alone.
TEST_P(Packing, EachSampleMatchesItsOwnForward) {
  torch::NoGradGuard no_grad;
  auto logits = net_->forward(packed_.ids, packed_.positions, packed_.segments);  // [2, T, V]
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, kT, 64}));
  for (size_t b = 0; b < packed_.spans.size(); ++b) {
    for (const auto& [start, len] : packed_.spans[b]) {
      auto alone = net_->forward(packed_.ids[b].narrow(0, start, len).unsqueeze(0))[0];  // [len, V]
      const double diff = (logits[b].narrow(0, start, len) - alone).abs().max().item<double>();
      EXPECT_LE(diff, kLogitTol) << "row " << b << ", sample at " << start;
    }
  }
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());  // padding rows too
}

// (b) Gradients of the packed row's summed loss = the sum over the samples run alone.
TEST_P(Packing, GradientsEqualTheSumOverSamples) {
  summed_loss(net_->forward(packed_.ids, packed_.positions, packed_.segments), packed_.targets).backward();
  const auto packed_grads = take_grads(*net_);
  for (size_t b = 0; b < packed_.spans.size(); ++b)
    for (const auto& [start, len] : packed_.spans[b]) {
      auto logits = net_->forward(packed_.ids[b].narrow(0, start, len).unsqueeze(0));
      summed_loss(logits, packed_.targets[b].narrow(0, start, len).unsqueeze(0)).backward();  // accumulates
    }
  expect_grads_close(*net_, packed_grads, take_grads(*net_), kGradTol);
}

// (c) Undefined positions and segments are forward(input_ids), bit for bit.
TEST_P(Packing, UndefinedPositionsAndSegmentsAreThePlainForward) {
  torch::NoGradGuard no_grad;
  auto plain = net_->forward(packed_.ids);
  EXPECT_TRUE(torch::equal(net_->forward(packed_.ids, torch::Tensor(), torch::Tensor()), plain));
  // Explicit 0..T-1 positions and one segment per row describe the same attention; they
  // take the per-token and masked paths, so the agreement is to rounding, not bits.
  auto positions = torch::arange(kT, torch::kLong).expand({2, kT}).contiguous();
  auto one_segment = torch::zeros({2, kT}, torch::kLong);
  EXPECT_LE((net_->forward(packed_.ids, positions, one_segment) - plain).abs().max().item<double>(), kLogitTol);
  EXPECT_LE((net_->forward(packed_.ids, positions, torch::Tensor()) - plain).abs().max().item<double>(), kLogitTol);
  EXPECT_LE((net_->forward(packed_.ids, torch::Tensor(), one_segment) - plain).abs().max().item<double>(),
            kLogitTol);
}

// (d) Activation checkpointing carries the mask and the per-token tables: the packed
// loss is bit-identical and the gradients agree (the recomputation runs the same kernels).
TEST_P(Packing, CheckpointingGivesTheSameGradients) {
  net_->train();
  auto plain_loss = summed_loss(net_->forward(packed_.ids, packed_.positions, packed_.segments), packed_.targets);
  plain_loss.backward();
  const auto want = take_grads(*net_);
  net_->set_activation_checkpointing(true);
  auto ckpt_loss = summed_loss(net_->forward(packed_.ids, packed_.positions, packed_.segments), packed_.targets);
  ckpt_loss.backward();
  EXPECT_EQ(ckpt_loss.item<double>(), plain_loss.item<double>());
  expect_grads_close(*net_, take_grads(*net_), want, 1e-6);
}

// Under CPU bf16 autocast the masked scores are bf16: -inf still masks (no NaN), and each
// sample stays within bf16 rounding of its own bf16 forward.
TEST_P(Packing, Bf16AutocastKeepsSamplesApart) {
  torch::NoGradGuard no_grad;
  amp::AmpOptions bf16;
  bf16.dtype = amp::AmpDtype::kBf16;
  amp::AutocastScope scope(bf16, torch::kCPU);
  auto logits = net_->forward(packed_.ids, packed_.positions, packed_.segments).to(torch::kFloat);
  ASSERT_TRUE(torch::isfinite(logits).all().item<bool>());
  for (size_t b = 0; b < packed_.spans.size(); ++b)
    for (const auto& [start, len] : packed_.spans[b]) {
      auto alone = net_->forward(packed_.ids[b].narrow(0, start, len).unsqueeze(0))[0].to(torch::kFloat);
      // Logits of magnitude < 1 in bf16 (8 significant bits), through 2 layers: 2^-5.
      EXPECT_LE((logits[b].narrow(0, start, len) - alone).abs().max().item<double>(), 0.03);
    }
}

INSTANTIATE_TEST_SUITE_P(KvHeads, Packing, ::testing::Values(4, 2, 1),
                         [](const auto& info) { return std::to_string(info.param) + "kv"; });

// (e) Malformed positions / segments are bad input naming the argument.
TEST(PackingArguments, BadShapesAndDtypesNameTheArgument) {
  LlamaForCausalLM net(small_options(2));
  auto ids = torch::randint(0, 64, {2, 8}, torch::kLong);
  auto ok = torch::zeros({2, 8}, torch::kLong);
  auto where = [&](const at::Tensor& positions, const at::Tensor& segments) -> std::string {
    try {
      net->forward(ids, positions, segments);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
      return e.where();
    }
    return "(nothing thrown)";
  };
  EXPECT_EQ(where(torch::zeros({2, 9}, torch::kLong), ok), "positions");
  EXPECT_EQ(where(torch::zeros({8}, torch::kLong), ok), "positions");
  EXPECT_EQ(where(torch::zeros({2, 8}, torch::kInt), ok), "positions");
  EXPECT_EQ(where(torch::zeros({2, 8}, torch::kFloat), ok), "positions");
  EXPECT_EQ(where(ok, torch::zeros({1, 8}, torch::kLong)), "segments");
  EXPECT_EQ(where(ok, torch::zeros({2, 8, 1}, torch::kLong)), "segments");
  EXPECT_EQ(where(torch::Tensor(), torch::zeros({2, 8}, torch::kInt)), "segments");
  const std::string msg = test::bad_input_message([&] { net->forward(ids, torch::zeros({2, 8}, torch::kFloat), ok); });
  EXPECT_NE(msg.find("int64"), std::string::npos) << msg;
}

}  // namespace
}  // namespace gradguard::model
