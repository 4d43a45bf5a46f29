// LoRA through the `gradguard` executable: a fine-tune from an HF directory with
// lora.rank set leaves every base weight bit-identical and trains only the adapters, a
// resumed LoRA run continues bit for bit, a changed LoRA setting stops the resume naming
// the key, and `gradguard export` writes the merged model (W + (alpha / r) B A, checked
// here in float64 against the checkpoint's own tensors) beside a PEFT adapter directory.
// Every user error exits 2 naming the key or file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/model/lora.h"
#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;
using test::run_cli;

// Prepared byte-level data and a trained base model (runs/base, 6 steps) to adapt.
class LoraCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    std::ostringstream text;
    for (int i = 0; i < 400; ++i) text << "Adapters learn " << i << " small updates on a frozen model.\n";
    test::write_text(dir_->file("corpus.txt"), text.str());
    auto r = run_cli("prepare corpus.txt --out data --val-fraction 0.2", dir_->path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_cli(args("--name base"), dir_->path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string args(const std::string& extra) {
    return "train --config '" + test::source_path("configs/tiny.yaml") +
           "' --set data.train_path=data/train.bin --set data.val_path=data/val.bin " + extra;
  }
  static std::string lora_args(const std::string& name, const std::string& extra = "") {
    return args("--name " + name + " --set model.init_from=runs/base/checkpoints/step-0000006 --set lora.rank=4 " +
                "--set lora.alpha=8 --set lora.targets=[q_proj,v_proj,down_proj] " + extra);
  }
  static std::map<std::string, at::Tensor> tensors(const std::string& file) {
    return checkpoint::load_safetensors(dir_->file(file)).tensors;
  }
  static test::TempDir* dir_;
};
test::TempDir* LoraCli::dir_ = nullptr;

TEST_F(LoraCli, TrainsOnlyTheAdapters) {
  auto r = run_cli(lora_args("adapt"), dir_->path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 2 layers x (q 32->32, v 32->16, down 64->32) adapters of rank 4.
  const int64_t trainable = 2 * 4 * ((32 + 32) + (32 + 16) + (64 + 32));
  EXPECT_THAT(r.output, HasSubstr("lora: rank 4, alpha 8 on q_proj,v_proj,down_proj: " + std::to_string(trainable) +
                                  " of "));
  const auto base = tensors("runs/base/checkpoints/step-0000006/model.safetensors");
  const auto adapted = tensors("runs/adapt/checkpoints/step-0000006/model.safetensors");
  int adapters = 0;
  for (const auto& [name, t] : adapted) {
    if (model::is_lora_name(name)) {
      ++adapters;
      if (name.find("lora_B") != std::string::npos) EXPECT_GT(t.abs().max().item<double>(), 0.0) << name;  // trained
      continue;
    }
    ASSERT_TRUE(base.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, base.at(name))) << name << " changed: the base must stay frozen";
  }
  EXPECT_EQ(adapters, 2 * 3 * 2);
  EXPECT_EQ(adapted.size(), base.size() + adapters);
  const auto config = nlohmann::json::parse(test::read_text(dir_->file("runs/adapt/checkpoints/step-0000006/lora.json")));
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["base_model_name_or_path"], "runs/base/checkpoints/step-0000006");
  // The loss moved: the adapters learn something.
  const auto metrics = test::read_jsonl(dir_->file("runs/adapt/metrics.jsonl"));
  double first = -1, last = -1;
  for (const auto& m : metrics)
    if (m.contains("loss") && !m.contains("event")) (first < 0 ? first : last) = m["loss"].get<double>();
  EXPECT_NE(first, last);
}

TEST_F(LoraCli, ResumeContinuesBitForBitAndAChangedSettingStopsIt) {
  ASSERT_EQ(run_cli(lora_args("straight"), dir_->path()).exit_code, 0);
  // runs/halves: the same run as it was when step 4 was its newest checkpoint.
  std::filesystem::copy(dir_->file("runs/straight"), dir_->file("runs/halves"),
                        std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(dir_->file("runs/halves/checkpoints/step-0000006"));
  test::write_text(dir_->file("runs/halves/checkpoints/latest"), "step-0000004\n");
  auto r = run_cli("train --resume runs/halves --set lora.rank=8", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.rank = 4 but the configuration asks for 8"));
  r = run_cli("train --resume runs/halves --set lora.targets=[q_proj]", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.targets = [down_proj, q_proj, v_proj] but the configuration asks for [q_proj]"));
  r = run_cli("train --resume runs/halves", dir_->path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed at step 4"));
  const auto a = tensors("runs/straight/checkpoints/step-0000006/model.safetensors");
  const auto b = tensors("runs/halves/checkpoints/step-0000006/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
}

TEST_F(LoraCli, ExportWritesTheMergedModelAndAPeftAdapter) {
  ASSERT_EQ(run_cli(lora_args("exp"), dir_->path()).exit_code, 0);
  auto r = run_cli("export runs/exp --out merged", dir_->path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("LoRA rank 4 merged"));
  EXPECT_FALSE(std::filesystem::exists(dir_->file("merged/lora.json")));
  EXPECT_FALSE(std::filesystem::exists(dir_->file("merged/adapter_config.json")));
  const auto trained = tensors("runs/exp/checkpoints/step-0000006/model.safetensors");
  const auto merged = tensors("merged/model.safetensors");
  auto d = [](const at::Tensor& t) { return t.to(torch::kDouble); };
  for (const auto& [name, t] : merged) {
    EXPECT_FALSE(model::is_lora_name(name)) << name;
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    if (trained.count(stem + ".lora_A.weight")) {
      // PEFT's merge: W + B @ A * lora_alpha / r.
      const auto want = d(trained.at(name)) + torch::matmul(d(trained.at(stem + ".lora_B.weight")),
                                                            d(trained.at(stem + ".lora_A.weight"))) * (8.0 / 4.0);
      EXPECT_LT((d(t) - want).abs().max().item<double>(), 1e-6) << name;
      EXPECT_FALSE(torch::equal(t, trained.at(name))) << name;
    } else {
      EXPECT_TRUE(torch::equal(t, trained.at(name))) << name;
    }
  }
  // The merged directory is a plain model.
  auto plain = checkpoint::read_hf_config(dir_->file("merged"), {});
  model::LlamaForCausalLM m(plain);
  EXPECT_NO_THROW(checkpoint::load_hf_weights(dir_->file("merged"), *m));
  // The adapter as PEFT writes it.
  const auto adapter = tensors("merged/adapter/adapter_model.safetensors");
  EXPECT_EQ(adapter.size(), 12u);
  const std::string key = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
  ASSERT_TRUE(adapter.count(key));
  EXPECT_TRUE(torch::equal(adapter.at(key), trained.at("model.layers.1.mlp.down_proj.lora_B.weight")));
  const auto config = nlohmann::json::parse(test::read_text(dir_->file("merged/adapter/adapter_config.json")));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["target_modules"].dump(), R"(["q_proj","v_proj","down_proj"])");
  EXPECT_EQ(config["base_model_name_or_path"], "runs/base/checkpoints/step-0000006");

  // Not over an earlier export without --force; with it, a plain export removes the stale adapter.
  r = run_cli("export runs/exp --out merged", dir_->path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--force"));
  r = run_cli("export runs/base --out merged --force", dir_->path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_->file("merged/adapter/adapter_model.safetensors")));
}

TEST_F(LoraCli, ExportNeverWritesOverItsSourceOrTrainingState) {
  // A LoRA checkpoint exported onto itself with --force used to be rewritten with the
  // merged weights and lose lora.json; now every such target is refused before a byte
  // is written, and the checkpoint stays byte for byte as it was.
  ASSERT_EQ(run_cli(lora_args("src"), dir_->path()).exit_code, 0);
  const std::string ckpt = "runs/src/checkpoints/step-0000006";
  std::map<std::string, std::string> before;
  for (const auto& e : std::filesystem::directory_iterator(dir_->file(ckpt)))
    before[e.path().filename().string()] = test::read_text(e.path().string());
  test::write_text(dir_->file("a_file"), "x");
  struct Case {
    std::string out, needle;
  };
  const std::vector<Case> cases = {
      {ckpt, "is the checkpoint being exported"},
      {ckpt + "/sub", "is inside the checkpoint being exported"},
      {"runs/src/checkpoints/step-0000004", "holds a training checkpoint"},
      {"runs/src", "is a run directory"},
      {"runs/base", "is a run directory"},
      {"a_file", "is a file, not a directory"},
  };
  for (const auto& c : cases) {
    auto r = run_cli("export " + ckpt + " --out " + c.out + " --force", dir_->path());
    EXPECT_EQ(r.exit_code, 2) << c.out << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.out + ": " + c.needle)) << c.out;
  }
  // From a run directory onto the checkpoint it resolves to, too.
  auto r = run_cli("export runs/src --out " + ckpt + " --force", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const auto& [name, text] : before) EXPECT_EQ(test::read_text(dir_->file(ckpt + "/" + name)), text) << name;
  EXPECT_FALSE(std::filesystem::exists(dir_->file(ckpt + "/sub")));
  EXPECT_EQ(test::read_text(dir_->file("a_file")), "x");
}

TEST_F(LoraCli, UserErrorsExitTwoNamingTheKeyOrFile) {
  auto r = run_cli(lora_args("bad1", "--set lora.targets=[q_proj,lm_head]"), dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.targets"));
  EXPECT_THAT(r.output, HasSubstr("lm_head"));
  r = run_cli(lora_args("bad2", "--set lora.dropout=0.1 --set model.activation_checkpointing=true"), dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.dropout"));
  r = run_cli(lora_args("bad3", "--set lora.alpha=0"), dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.alpha"));
  EXPECT_FALSE(std::filesystem::exists(dir_->file("runs/bad1/metrics.jsonl")));

  // A LoRA checkpoint is not a plain model to start from: the message says what it is.
  ASSERT_EQ(run_cli(lora_args("src"), dir_->path()).exit_code, 0);
  r = run_cli(args("--name from_lora --set model.init_from=runs/src/checkpoints/step-0000006"), dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("LoRA adapter tensor"));
  EXPECT_THAT(r.output, HasSubstr("gradguard export"));
  // lora.json is covered by the checkpoint's manifest, and read strictly where there is none.
  namespace stdfs = std::filesystem;
  const std::string ckpt = dir_->file("runs/src/checkpoints/step-0000006");
  stdfs::create_directories(dir_->file("loose"));
  for (const char* name : {"config.json", "model.safetensors"})
    stdfs::copy_file(ckpt + "/" + name, dir_->file(std::string("loose/") + name));
  test::write_text(ckpt + "/lora.json", R"({"peft_type": "LORA", "r": 4})");
  r = run_cli("export runs/src/checkpoints/step-0000006 --out broken", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lora.json"));
  EXPECT_THAT(r.output, HasSubstr("manifest"));
  test::write_text(dir_->file("loose/lora.json"), R"({"peft_type": "LORA", "r": 4})");
  r = run_cli("export loose --out broken", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("loose/lora.json"));
  EXPECT_THAT(r.output, HasSubstr("lora_alpha"));
  stdfs::remove(dir_->file("loose/lora.json"));  // adapters in the weights, no settings: not a plain model either
  r = run_cli("export loose --out broken", dir_->path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("LoRA adapter tensor"));
  EXPECT_FALSE(stdfs::exists(dir_->file("broken/model.safetensors")));
}

}  // namespace
}  // namespace gradguard
