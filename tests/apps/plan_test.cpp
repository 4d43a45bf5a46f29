// `gradguard plan`: parameter counts against the model the trainer builds, each memory
// term against its arithmetic (the ZeRO paper's bytes per parameter, arXiv 1910.02054 §3),
// the micro-batch search, the committed golden report for Llama-2-7B on 2 x MI210 (32 and
// 64 GB) at global batch 4096 x 2048 tokens, and the CLI's errors. How close the estimate
// comes to measured peaks is bench/plan_check.py's job (docs/memory.md records it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "gradguard/apps/plan.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/model/llama.h"
#include "gradguard/model/lora.h"
#include "test_util.h"

namespace gradguard::plan {
namespace {
using ::testing::HasSubstr;

model::LlamaOptions tiny() {
  model::LlamaOptions o;
  o.vocab_size = 96, o.hidden_size = 32, o.intermediate_size = 80, o.num_layers = 3, o.num_heads = 4;
  o.num_kv_heads = 2, o.max_seq_len = 64;
  return o;
}

TEST(Plan, ParameterCountsEqualTheBuiltModel) {
  using T = model::LoraTarget;
  std::vector<std::pair<model::LlamaOptions, model::LoraOptions>> cases;
  auto o = tiny();
  cases.push_back({o, {}});
  o.tie_embeddings = true, o.attention_bias = true, o.mlp_bias = true, o.head_dim = 16;
  cases.push_back({o, {}});
  auto qwen3 = tiny();
  qwen3.qk_norm = true;
  cases.push_back({qwen3, {}});
  auto q = tiny();
  q.qkv_bias = true;
  model::LoraOptions lora;
  lora.rank = 4;
  lora.targets = {T::kQ, T::kK, T::kV, T::kO, T::kGate, T::kUp, T::kDown};
  cases.push_back({q, lora});
  for (const auto& [m, l] : cases) {
    model::LlamaForCausalLM net(m);
    if (l.enabled()) model::add_lora(*net, l);
    int64_t total = 0, trainable = 0;
    count_parameters(m, l, &total, &trainable);
    EXPECT_EQ(total, model::count_parameters(*net));
    EXPECT_EQ(trainable, model::count_trainable_parameters(*net));
  }
}

TEST(Plan, EachLayoutHoldsTheBytesTheArithmeticSays) {
  PlanInputs in;
  in.model = tiny();
  in.ranks = 3;
  in.gpu = false;
  int64_t P = 0, Pt = 0;
  count_parameters(in.model, in.lora, &P, &Pt);
  const double shard = std::ceil(P / 3.0);
  // fp32, replicated: 4 + 4 + 8 bytes per parameter.
  auto e = estimate(in);
  EXPECT_EQ(e.weights, 4.0 * P);
  EXPECT_EQ(e.gradients, 4.0 * P);
  EXPECT_EQ(e.optimizer, 8.0 * P);
  EXPECT_EQ(e.buffers, 0.0);
  // ZeRO-1: the moments of ceil(P / 3).
  in.memory.zero_stage = 1;
  EXPECT_EQ(estimate(in).optimizer, 8 * shard);
  // bf16 weights + fp32 masters: 2 + 2 + 12 / 3.
  in.memory.weights_dtype = amp::AmpDtype::kBf16;
  in.amp = amp::AmpDtype::kBf16;
  e = estimate(in);
  EXPECT_EQ(e.weights, 2.0 * P);
  EXPECT_EQ(e.optimizer, 12 * shard);
  // Pure bf16 (no masters): moments in bf16.
  in.memory.master_weights = false;
  EXPECT_EQ(estimate(in).optimizer, 4 * shard);
  // Offload: nothing on the device, the same state in host memory.
  in.memory.master_weights = true;
  in.memory.offload_optimizer = true;
  e = estimate(in);
  EXPECT_EQ(e.optimizer, 0.0);
  EXPECT_EQ(e.optimizer_host, 12 * shard);
  // On a GPU the runtime's 1 GiB and 5% for the allocator come on top.
  in.gpu = true;
  e = estimate(in);
  EXPECT_NEAR(e.buffers, 1024.0 * 1024 * 1024 + 0.05 * (e.total - e.buffers), 1.0);
  // ZeRO-2 (dist/grad_shard_sync.h): the bf16 shard of the gradients, three float32
  // buckets in flight and autograd's gradient of the largest tensor (here the embedding,
  // vocab x hidden) before it is bucketed; the optimizer as ZeRO-1.
  in.memory.offload_optimizer = false;
  in.memory.zero_stage = 2;
  in.bucket_mb = 1e-3;
  e = estimate(in);
  const double largest = std::max(96.0 * in.model.hidden_size, 1.0 * in.model.hidden_size * in.model.intermediate_size);
  EXPECT_DOUBLE_EQ(e.gradients, 2 * shard + 3 * 1e-3 * 1024 * 1024 + 2 * largest);
  EXPECT_EQ(e.optimizer, 12 * shard);
  // Buckets never exceed the gradient itself; on one rank there is nothing to shard.
  in.bucket_mb = 1e6;
  EXPECT_DOUBLE_EQ(estimate(in).gradients, 2 * shard + 4.0 * P + 2 * largest);
  in.ranks = 1;
  EXPECT_EQ(estimate(in).gradients, 2.0 * P);
}

TEST(Plan, ActivationsGrowWithTokensAndCheckpointingKeepsOnlyLayerInputs) {
  PlanInputs in;
  in.model = tiny();
  in.model.num_layers = 12;
  in.seq_len = 64;
  in.micro_batch = 1;
  const double one = estimate(in).activations;
  in.micro_batch = 4;
  EXPECT_NEAR(estimate(in).activations, 4 * one, 1e-6 * one);
  const double full = estimate(in).activations;
  in.model.activation_checkpointing = true;
  EXPECT_LT(estimate(in).activations, full / 2);
  // Matmul attention keeps T x T scores: quadratic in the sequence.
  in.model.activation_checkpointing = false;
  in.fused_attention = false;
  const double matmul = estimate(in).activations;
  EXPECT_GT(matmul, full);
}

TEST(Plan, SuggestionTakesTheLargestMicroBatchThatFits) {
  PlanInputs in;
  in.model = tiny();
  in.seq_len = 64;
  in.ranks = 2;
  in.global_batch = 64;  // 32 per rank
  in.gpu = false;
  // Room for micro-batch 8 but not 16 without checkpointing.
  in.micro_batch = 8;
  const double room = estimate(in).total + 1;
  auto s = suggest(in, room);
  ASSERT_TRUE(s.fits);
  EXPECT_EQ(s.micro_batch, 8);
  EXPECT_EQ(s.accum_steps, 4);
  EXPECT_FALSE(s.checkpointing);
  // Less room than micro 1 without checkpointing: checkpointing on.
  in.micro_batch = 1;
  const double tight = estimate(in).total - 1;
  s = suggest(in, tight);
  if (s.fits) EXPECT_TRUE(s.checkpointing);
  // No room at all, and a global batch that does not divide over the ranks.
  EXPECT_FALSE(suggest(in, 1).fits);
  in.global_batch = 63;
  EXPECT_FALSE(suggest(in, 1e12).fits);
}

TEST(Plan, GoldenLlama2_7bOnTwoMi210) {
  // Regenerate with the command in tests/golden/README.md after a deliberate change.
  for (const char* gb : {"64", "32"}) {
    auto r = test::run_cli(std::string("plan --model '") + test::source_path("tests/golden/llama2_7b") +
                           "' --gpus 2 --device mi210 --memory " + gb +
                           " --global-batch 4096 --seq 2048 --micro 1 --set amp.dtype=bf16 --set data.seq_len=2048");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, test::read_text(test::source_path(std::string("tests/golden/plan/llama2_7b_2x_mi210_") + gb +
                                                          "gb.txt")))
        << gb << " GB";
  }
  // What the golden says, in words: on 64 GB offload and LoRA fit; on 32 GB LoRA, and
  // offload with checkpointing. Offloaded, the host holds the state (40.4 GB) and the
  // step's float32 gradient copy and AdamW temporary (13.5 GB each): a device-to-host copy
  // that changes the dtype converts on the host, so the device keeps neither.
  const auto at64 = test::read_text(test::source_path("tests/golden/plan/llama2_7b_2x_mi210_64gb.txt"));
  EXPECT_THAT(at64, HasSubstr("| bf16 + fp32 masters, ZeRO-1, offload | 27.0 | 0.0 (67.4) |"));
  EXPECT_THAT(at64, HasSubstr("| bf16 + fp32 masters, ZeRO-1 | 27.0 | 40.4 | - | - |"));
  // ZeRO-2 halves the gradients (bf16 shard: 6.7 of 13.5 GB) but not enough without offload.
  EXPECT_THAT(at64, HasSubstr("| bf16 + fp32 masters, ZeRO-2 | 20.6 | 40.4 | - | - |"));
  EXPECT_THAT(at64, HasSubstr("| bf16 + fp32 masters, ZeRO-2, offload | 20.6 | 0.0 (67.4) | 2 x 1024 | off |"));
  const auto at32 = test::read_text(test::source_path("tests/golden/plan/llama2_7b_2x_mi210_32gb.txt"));
  EXPECT_THAT(at32, HasSubstr("| bf16 + fp32 masters, ZeRO-2, offload | 20.6 | 0.0 (67.4) | 2 x 1024 | on | 27.5 | yes |"));
  EXPECT_THAT(at32, HasSubstr("| bf16 + fp32 masters, ZeRO-2 | 20.6 | 40.4 | - | - | 67.5 | no |"));
}

TEST(Plan, EachLayoutNamesTheKeysThatSelectIt) {
  // The keys a layout prints are real keys whose values make a configuration with that
  // layout and the suggested batch: loading them gives back the row's inputs.
  PlanInputs in;
  in.model = tiny();
  in.ranks = 2, in.seq_len = 32, in.global_batch = 64;
  int checked = 0;
  for (const auto& row : compare_layouts(in, 40e9)) {
    SCOPED_TRACE(row.name);
    ASSERT_TRUE(row.suggestion.fits);  // a tiny model fits everywhere: the batch keys are there too
    auto sets = row.sets;
    sets.push_back("data.seq_len=32");
    config::Config c = config::load_config("", sets);
    c.finalize(2);
    const auto back = PlanInputs::from_config(c, 2);
    EXPECT_EQ(back.amp, row.inputs.amp);
    EXPECT_EQ(back.memory.weights_dtype, row.inputs.memory.weights_dtype);
    EXPECT_EQ(back.memory.master_weights || back.memory.weights_dtype == amp::AmpDtype::kFp32,
              row.inputs.memory.master_weights);
    EXPECT_EQ(back.memory.zero_stage, row.inputs.memory.zero_stage);
    EXPECT_EQ(back.memory.offload_optimizer, row.inputs.memory.offload_optimizer);
    EXPECT_EQ(back.lora.rank, row.inputs.lora.rank);
    if (row.inputs.lora.enabled()) EXPECT_EQ(back.lora.targets, row.inputs.lora.targets);
    EXPECT_EQ(back.micro_batch, row.suggestion.micro_batch);
    EXPECT_EQ(c.batch.accum_steps, row.suggestion.accum_steps);
    EXPECT_EQ(back.model.activation_checkpointing, row.suggestion.checkpointing);
    ++checked;
  }
  EXPECT_EQ(checked, 8);
  // The report and its JSON carry them; a layout that does not fit has no batch keys.
  auto r = test::run_cli(std::string("plan --json --model '") + test::source_path("tests/golden/llama2_7b") +
                         "' --gpus 2 --device mi210 --memory 64 --global-batch 4096 --seq 2048 --micro 1"
                         " --set amp.dtype=bf16 --set data.seq_len=2048");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto layouts = nlohmann::json::parse(r.output)["layouts"];
  ASSERT_EQ(layouts.size(), 8u);
  EXPECT_EQ(layouts[0]["sets"].size(), 5u);  // replicated fp32 does not fit: no batch keys
  const auto zero2_offload = layouts[6]["sets"].get<std::vector<std::string>>();
  EXPECT_EQ(layouts[6]["layout"], "bf16 + fp32 masters, ZeRO-2, offload");
  EXPECT_THAT(zero2_offload, ::testing::Contains("memory.zero_stage=2"));
  EXPECT_THAT(zero2_offload, ::testing::Contains("memory.offload_optimizer=true"));
  EXPECT_THAT(zero2_offload, ::testing::Contains("batch.micro_batch=2"));
}

TEST(Plan, FineTuningPresetsFitTwoMi210AndTwoH100) {
  // configs/finetune/ against the published shapes of their models (tests/golden/): the
  // configured run fits 2 x MI210 64 GB and 2 x H100 80 GB as it stands.
  for (const auto& [preset, model] : {std::pair<const char*, const char*>{"llama3.1-8b-lora", "llama3_1_8b"},
                                      {"qwen2.5-7b-full", "qwen2_5_7b"},
                                      {"mistral-7b-lora", "mistral_7b"}})
    for (const char* device : {"mi210", "h100"}) {
      SCOPED_TRACE(std::string(preset) + " on " + device);
      auto r = test::run_cli(std::string("plan --json --gpus 2 --device ") + device + " --config '" +
                             test::source_path(std::string("configs/finetune/") + preset + ".yaml") + "' --model '" +
                             test::source_path(std::string("tests/golden/") + model) + "'");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto j = nlohmann::json::parse(r.output);
      EXPECT_TRUE(j["fits"].get<bool>()) << j["estimate"].dump();
      EXPECT_GT(j["estimate"]["parameters"].get<double>(), 7e9);
    }
}

TEST(Plan, LogitsTermAndZLoss) {
  // b T V (c + 8): the logits in the compute dtype, float32 log-probabilities and their
  // gradient; z-loss's logsumexp keeps a float32 copy of bf16 logits (4 more bytes), and
  // nothing more in float32, where its input is the logits tensor itself.
  PlanInputs in;
  in.model = tiny();
  in.seq_len = 16, in.micro_batch = 2;
  const double tokens_v = 16.0 * 2 * 96;
  EXPECT_DOUBLE_EQ(estimate(in).logits, tokens_v * (4 + 8));
  in.z_loss = true;
  EXPECT_DOUBLE_EQ(estimate(in).logits, tokens_v * (4 + 8));
  in.amp = amp::AmpDtype::kBf16;
  EXPECT_DOUBLE_EQ(estimate(in).logits, tokens_v * (2 + 8 + 4));
  in.z_loss = false;
  EXPECT_DOUBLE_EQ(estimate(in).logits, tokens_v * (2 + 8));
  config::Config cfg = config::load_config("", {"loss.z_loss=1e-4"});
  EXPECT_TRUE(PlanInputs::from_config(cfg, 1).z_loss);
  // loss.chunk_tokens: one chunk's logits (at most all 32 tokens) in backward -- bf16
  // product, float32 copy, the shifted copy that becomes the gradient, its bf16 cast --
  // and each row's float32 lse; in float32 the product is the copy and the gradient's cast.
  in.chunk_tokens = 5;
  EXPECT_DOUBLE_EQ(estimate(in).logits, 5.0 * 96 * (2 + 4 + 4 + 2) + 4 * 32);
  in.chunk_tokens = 1000;
  EXPECT_DOUBLE_EQ(estimate(in).logits, 32.0 * 96 * (2 + 4 + 4 + 2) + 4 * 32);
  in.amp = amp::AmpDtype::kFp32;
  EXPECT_DOUBLE_EQ(estimate(in).logits, 32.0 * 96 * 8 + 4 * 32);
  cfg = config::load_config("", {"loss.chunk_tokens=512"});
  EXPECT_EQ(PlanInputs::from_config(cfg, 1).chunk_tokens, 512);
}

TEST(Plan, JsonCarriesEveryTerm) {
  auto r = test::run_cli("plan --json --gpus 2 --device h100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["device"], "h100");
  EXPECT_EQ(j["device_bytes"].get<double>(), 80e9);
  for (const char* k : {"weights", "gradients", "optimizer", "activations", "logits", "step", "buffers", "total"})
    EXPECT_TRUE(j["estimate"].contains(k)) << k;
  EXPECT_EQ(j["layouts"].size(), 8u);
}

TEST(Plan, DeviceNamesInAnyCase) {
  EXPECT_EQ(find_device("H100").name, "h100");
  EXPECT_EQ(find_device("MI300X").memory_gb, 192);  // AMD's stated 192 GB HBM3
  EXPECT_EQ(find_device("A100-40").memory_gb, 40);
  EXPECT_EQ(find_device("a100").memory_gb, 80);
  auto r = test::run_cli("plan --json --device H200");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["device"], "h200");
  EXPECT_THAT(test::bad_input_message([] { find_device("V100"); }), HasSubstr("mi300x (192.0 GB)"));
}

TEST(Plan, BadArgumentsExitTwoNamingThem) {
  struct Case {
    std::string args, what;
  };
  const std::vector<Case> cases = {
      {"plan --device mi300", "--device"},
      {"plan --gpus 0", "--gpus"},
      {"plan --memory -3", "--memory"},
      {"plan --gpus 3 --global-batch 64", "--global-batch"},
      {"plan --seq 0", "--seq"},
      {"plan --seq -1", "--seq: must be in [1, 16777216], got -1"},  // -1 was taken for "unset"
      {"plan --global-batch -1", "--global-batch: must be in [0, 1073741824]"},
      {"plan --seq 9223372036854775000", "--seq: must be in [1, 16777216]"},  // no negative token count
      {"plan --micro 0", "--micro"},
      {"plan --gpus 99999999", "--gpus"},
      {"plan --model /nonexistent/model", "/nonexistent/model"},
      {"plan --set memory.zero_stage=5", "memory.zero_stage"},
  };
  for (const auto& c : cases) {
    auto r = test::run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.what)) << c.args;
  }
}

}  // namespace
}  // namespace gradguard::plan
