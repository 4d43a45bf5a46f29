// Configuration: defaults, files, --set overrides, every kind of rejected input with the
// key named, the YAML round trip, and docs/config.md kept in step with the code.
#include "gradguard/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::config {
namespace {
using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& fn) { return test::bad_input_message(fn); }

std::string error_of_set(const std::string& assignment) {
  return error_of([&] { load_config("", {assignment}); });
}

TEST(Config, DefaultIsValidAndDescribesTheTinyLlama) {
  Config c = load_config("", {});
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.batch.global_batch * c.data.seq_len, 8192);  // tokens per optimizer step
  EXPECT_EQ(c.data.train_path, "data/brown/train.bin");
}

TEST(Config, FileThenOverrides) {
  test::TempDir dir;
  test::write_text(dir.file("c.yaml"), "optim:\n  lr: 1.0e-3\n  betas: [0.8, 0.9]\nbatch:\n  micro_batch: 8\n");
  Config c = load_config(dir.file("c.yaml"), {"optim.lr=2e-3", "optim.betas=[0.9,0.95]", "model.tie_embeddings=true"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 2e-3);
  EXPECT_DOUBLE_EQ(c.optim.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(c.optim.betas[1], 0.95);
  EXPECT_EQ(c.batch.micro_batch, 8);
  EXPECT_TRUE(c.model.tie_embeddings);
}

TEST(Config, GlobalBatchDerivesAccumulation) {
  Config c = load_config("", {"batch.micro_batch=8", "batch.global_batch=64"});
  EXPECT_EQ(c.batch.accum_steps, 8);
  c = load_config("", {"batch.micro_batch=8", "batch.accum_steps=3"});
  EXPECT_EQ(c.batch.global_batch, 24);
  EXPECT_THAT(error_of_set("batch.global_batch=60"), HasSubstr("not a multiple of batch.micro_batch"));
  EXPECT_THAT(error_of([] { load_config("", {"batch.require_pow2=true", "batch.accum_steps=3"}); }),
              HasSubstr("batch.accum_steps: 3 is not a power of 2"));
}

TEST(Config, UnknownKeysSuggestTheNearest) {
  EXPECT_THAT(error_of_set("optim.lrr=1"), HasSubstr("did you mean 'optim.lr'"));
  EXPECT_THAT(error_of_set("schedule.warmup=5"), HasSubstr("did you mean 'schedule.warmup_steps'"));
  EXPECT_THAT(error_of_set("bogus.thing=1"), HasSubstr("unknown key"));
  test::TempDir dir;
  test::write_text(dir.file("c.yaml"), "optimizer:\n  lr: 1\n");
  auto msg = error_of([&] { load_config(dir.file("c.yaml"), {}); });
  EXPECT_THAT(msg, HasSubstr(dir.file("c.yaml")));
  EXPECT_THAT(msg, HasSubstr("did you mean 'optim'"));
  test::write_text(dir.file("d.yaml"), "batch:\n  micro_bach: 4\n");
  EXPECT_THAT(error_of([&] { load_config(dir.file("d.yaml"), {}); }),
              HasSubstr("batch.micro_bach: unknown key (did you mean 'batch.micro_batch'?)"));
}

TEST(Config, WrongTypesNameKeyAndValue) {
  EXPECT_THAT(error_of_set("optim.lr=fast"), HasSubstr("optim.lr: expected a number, got 'fast'"));
  EXPECT_THAT(error_of_set("batch.micro_batch=2.5"), HasSubstr("batch.micro_batch: expected integer, got '2.5'"));
  EXPECT_THAT(error_of_set("data.shuffle=maybe"), HasSubstr("expected a boolean"));
  EXPECT_THAT(error_of_set("optim.betas=[0.9]"), HasSubstr("expected a list of 2 numbers"));
  EXPECT_THAT(error_of_set("run.seed=-1"), HasSubstr("run.seed: expected non-negative integer"));
  EXPECT_THAT(error_of_set("optim.lr"), HasSubstr("expected key.path=value"));
}

TEST(Config, OutOfRangeValuesNameWhatIsValid) {
  EXPECT_THAT(error_of_set("optim.lr=-0.001"), HasSubstr("optim.lr: must be a finite number > 0"));
  EXPECT_THAT(error_of_set("batch.micro_batch=0"), HasSubstr("batch.micro_batch: must be >= 1, got 0"));
  EXPECT_THAT(error_of_set("schedule.warmup_steps=500"),
              HasSubstr("schedule.warmup_steps: must be in [0, schedule.total_steps = 200], got 500"));
  EXPECT_THAT(error_of_set("schedule.min_lr=1"), HasSubstr("schedule.min_lr: must be <= optim.lr"));
  EXPECT_THAT(error_of_set("clip.strategy=sometimes"), HasSubstr("valid: none, global"));
  EXPECT_THAT(error_of_set("amp.dtype=fp8"), HasSubstr("valid: fp32, bf16, fp16"));
  EXPECT_THAT(error_of_set("data.seq_len=4096"), HasSubstr("data.seq_len: must be <= model.max_seq_len"));
  EXPECT_THAT(error_of_set("model.num_kv_heads=3"), HasSubstr("model.num_kv_heads"));
  EXPECT_THAT(error_of_set("run.device=tpu"), HasSubstr("valid: cpu, auto, cuda, cuda:N"));
  EXPECT_THAT(error_of_set("run.thread_pool=both"), HasSubstr("run.thread_pool: 'both' is not valid (valid: auto, aten, blas)"));
  EXPECT_THAT(error_of_set("optim.implementation=turbo"), HasSubstr("optim.implementation"));
  EXPECT_THAT(error_of_set("log.progress=fancy"), HasSubstr("log.progress"));
  EXPECT_THAT(error_of_set("eval.batches=0"), HasSubstr("eval.batches"));
  EXPECT_THAT(error_of_set("checkpoint.keep_last=-2"), HasSubstr("checkpoint.keep_last"));
}

TEST(Config, BadFiles) {
  test::TempDir dir;
  EXPECT_THAT(error_of([&] { load_config(dir.file("missing.yaml"), {}); }), HasSubstr("missing.yaml: cannot open"));
  test::write_text(dir.file("bad.yaml"), "optim:\n  lr: [1, 2\n");
  EXPECT_THAT(error_of([&] { load_config(dir.file("bad.yaml"), {}); }), HasSubstr("invalid YAML at line"));
  test::write_text(dir.file("list.yaml"), "- 1\n- 2\n");
  EXPECT_THAT(error_of([&] { load_config(dir.file("list.yaml"), {}); }), HasSubstr("top level must be a mapping"));
  test::write_text(dir.file("sec.yaml"), "optim: 3\n");
  EXPECT_THAT(error_of([&] { load_config(dir.file("sec.yaml"), {}); }), HasSubstr("a section must be a mapping"));
  test::write_text(dir.file("empty.yaml"), "");
  EXPECT_NO_THROW(load_config(dir.file("empty.yaml"), {}));
}

TEST(Config, YamlRoundTrip) {
  Config a = load_config("", {"optim.lr=0.00123", "run.name=x y", "optim.betas=[0.85,0.999]", "data.shuffle=true",
                              "schedule.decay=linear", "batch.global_batch=128"});
  test::TempDir dir;
  test::write_text(dir.file("c.yaml"), to_yaml(a));
  Config b = load_config(dir.file("c.yaml"), {});
  EXPECT_EQ(to_yaml(a), to_yaml(b));
  EXPECT_DOUBLE_EQ(b.optim.lr, 0.00123);
  EXPECT_EQ(b.run.name, "x y");
  EXPECT_EQ(b.batch.accum_steps, 128 / 32);
}

TEST(Config, AFineTuneLearningRateNeedsNoOtherKey) {
  // The floor defaults to a share of the peak (schedule.min_lr_ratio 0.1), so a fine-tune's
  // `--set optim.lr=2e-5` is enough; an absolute min_lr over the peak is still an error.
  Config c = load_config("", {"optim.lr=2e-5"});
  EXPECT_EQ(c.schedule.min_lr, -1.0);
  EXPECT_DOUBLE_EQ(c.schedule.floor_lr(c.optim.lr, c.optim.lr), 2e-6);
  EXPECT_THAT(test::bad_input_message([] { load_config("", {"optim.lr=2e-5", "schedule.min_lr=1e-4"}); }),
              HasSubstr("schedule.min_lr: must be <= optim.lr"));
}

TEST(Config, KeysThatSayOneThingTwoWays) {
  test::TempDir dir;
  // Both in one place: exit 2 naming the key, for --set and for a file.
  EXPECT_THAT(test::bad_input_message([] { load_config("", {"schedule.epochs=2", "schedule.total_steps=50"}); }),
              HasSubstr("--set schedule.epochs: and schedule.total_steps are both set"));
  test::write_text(dir.file("both.yaml"), "schedule:\n  warmup_ratio: 0.03\n  warmup_steps: 5\n");
  EXPECT_THAT(test::bad_input_message([&] { load_config(dir.file("both.yaml"), {}); }),
              HasSubstr("both.yaml: schedule.warmup_ratio: and schedule.warmup_steps are both set"));
  EXPECT_THAT(test::bad_input_message([] { load_config("", {"schedule.min_lr=1e-5", "schedule.min_lr_ratio=0.2"}); }),
              HasSubstr("schedule.min_lr: and schedule.min_lr_ratio are both set"));
  // A --set of one replaces the file's other: a preset in epochs and warmup_ratio runs a
  // fixed number of steps, and a preset's ratio gives way to a --set warmup.
  test::write_text(dir.file("preset.yaml"),
                   "schedule:\n  epochs: 3\n  warmup_ratio: 0.1\n  min_lr: 1.0e-4\n");
  Config c = load_config(dir.file("preset.yaml"), {"schedule.total_steps=50", "schedule.warmup_steps=4",
                                                   "schedule.min_lr_ratio=0.05"});
  EXPECT_EQ(c.schedule.epochs, 0);
  EXPECT_EQ(c.schedule.total_steps, 50);
  EXPECT_EQ(c.schedule.warmup_ratio, 0);
  EXPECT_EQ(c.schedule.warmup_steps, 4);
  EXPECT_EQ(c.schedule.min_lr, -1);
  EXPECT_DOUBLE_EQ(c.schedule.floor_lr(1, 1), 0.05);
  // ... and the other way round: --set epochs over a file's total_steps.
  test::write_text(dir.file("steps.yaml"), "schedule:\n  total_steps: 40\n  warmup_steps: 4\n");
  c = load_config(dir.file("steps.yaml"), {"schedule.epochs=2", "schedule.warmup_ratio=0.1"});
  EXPECT_EQ(c.schedule.epochs, 2);
  EXPECT_EQ(c.schedule.warmup_steps, 4);  // 0.1 x the provisional 40; the run derives it again
  // A file written from such a config loads back to the same one: the replaced key is
  // written commented out.
  c = load_config(dir.file("preset.yaml"), {});
  const std::string yaml = to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("  # total_steps: 200"));
  EXPECT_THAT(yaml, HasSubstr("  # warmup_steps: 20"));
  EXPECT_THAT(yaml, HasSubstr("  # min_lr_ratio: 0.1"));
  test::write_text(dir.file("back.yaml"), yaml);
  EXPECT_EQ(to_yaml(load_config(dir.file("back.yaml"), {})), yaml);
}

TEST(Config, FineTuningPresetsAreRealisticAndNamedWhenMisspelled) {
  // configs/finetune/: each preset with its model's published config.json facts
  // (tests/golden/<model>/config.json) loads, fine-tunes that model with a method's usual
  // values, and runs on whatever device there is. `plan` checks that each fits two MI210
  // and two H100 (tests/apps/plan_test.cpp).
  struct Preset {
    const char* file;
    const char* model;
    bool lora;
  };
  for (const auto& p : {Preset{"llama3.1-8b-lora", "llama3_1_8b", true}, Preset{"qwen2.5-7b-full", "qwen2_5_7b", false},
                        Preset{"mistral-7b-lora", "mistral_7b", true}}) {
    SCOPED_TRACE(p.file);
    const std::string path = test::source_path(std::string("configs/finetune/") + p.file + ".yaml");
    // Alone it names the model directory it expects (the walkthrough's models/...).
    EXPECT_THAT(test::bad_input_message([&] { load_config(path, {}); }), HasSubstr("model.init_from"));
    Config c = load_config(path, {"model.init_from=" + test::source_path(std::string("tests/golden/") + p.model)});
    EXPECT_EQ(c.run.device, "auto");
    EXPECT_EQ(c.lora.enabled(), p.lora);
    EXPECT_GE(c.optim.lr, 1e-5);
    EXPECT_LE(c.optim.lr, 2e-4);
    EXPECT_GT(c.schedule.warmup_ratio, 0);
    EXPECT_GT(c.schedule.epochs, 0);
    EXPECT_EQ(c.schedule.min_lr, -1);  // the floor follows the peak
    EXPECT_EQ(c.amp.dtype, amp::AmpDtype::kBf16);
    EXPECT_GT(c.model.max_seq_len, 8000);  // the HF config's positions, not the default 1024
    EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
    // A learning rate alone changes nothing else (the floor is relative).
    EXPECT_NO_THROW(load_config(path, {"model.init_from=" + test::source_path(std::string("tests/golden/") + p.model),
                                       "optim.lr=5e-6"}));
  }
  const auto msg = test::bad_input_message(
      [] { load_config(test::source_path("configs/finetune/llama-8b-lora.yaml"), {}); });
  EXPECT_THAT(msg, HasSubstr("llama-8b-lora.yaml: cannot open: no such file"));
  EXPECT_THAT(msg, HasSubstr("holds llama3.1-8b-lora.yaml, mistral-7b-lora.yaml, qwen2.5-7b-full.yaml"));
}

TEST(Config, ShippedPresetsLoad) {
  for (const char* preset : {"configs/default.yaml", "configs/tiny.yaml"})
    EXPECT_NO_THROW(load_config(test::source_path(preset), {})) << preset;
  // The shipped default.yaml is the built-in default, every key spelled out as the option
  // table writes it.
  EXPECT_EQ(test::read_text(test::source_path("configs/default.yaml")), to_yaml(load_config("", {})))
      << "regenerate with: build/gradguard config show > configs/default.yaml";
  EXPECT_EQ(to_yaml(load_config(test::source_path("configs/default.yaml"), {})), to_yaml(load_config("", {})));
}

TEST(Config, ReferenceDocIsUpToDate) {
  EXPECT_EQ(test::read_text(test::source_path("docs/config.md")), reference_markdown())
      << "regenerate with: build/gradguard config docs > docs/config.md";
}

TEST(Config, NestedSectionsAndLists) {
  test::TempDir dir;
  test::write_text(dir.file("c.yaml"),
                   "amp:\n  scaler:\n    mode: dynamic\n    hysteresis: 2\nguard:\n  inject:\n    nonfinite_steps: [3, 5]\n"
                   "  recovery:\n    ladder: [skip, rollback]\n");
  Config c = load_config(dir.file("c.yaml"), {"amp.scaler.init_scale=1024"});
  EXPECT_EQ(c.amp.scaler.mode, amp::ScalerMode::kDynamic);
  EXPECT_EQ(c.amp.scaler.hysteresis, 2);
  EXPECT_EQ(c.amp.scaler.init_scale, 1024);
  EXPECT_EQ(c.guard.inject.nonfinite_steps, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(c.guard.recovery.ladder,
            (std::vector<guard::RecoveryAction>{guard::RecoveryAction::kSkip, guard::RecoveryAction::kRollback}));
  // The emitted YAML nests the sub-section and reads back identically.
  const std::string yaml = to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("  scaler:\n    mode: dynamic"));
  EXPECT_THAT(yaml, HasSubstr("ladder: [skip, rollback]"));
  test::write_text(dir.file("back.yaml"), yaml);
  EXPECT_EQ(to_yaml(load_config(dir.file("back.yaml"), {})), yaml);
  EXPECT_THAT(error_of_set("amp.scaler.hysterisis=2"), HasSubstr("did you mean 'amp.scaler.hysteresis'"));
  EXPECT_THAT(error_of_set("amp.scaler.growth_factor=0.5"), HasSubstr("amp.scaler.growth_factor"));
  EXPECT_THAT(error_of_set("guard.inject.nonfinite_steps=[1,x]"), HasSubstr("expected a list of integers"));
  EXPECT_THAT(error_of_set("guard.recovery.ladder=skip"), HasSubstr("expected a list of names"));
  EXPECT_THAT(error_of_set("guard.recovery.ladder=[skip,explode]"),
              HasSubstr("guard.recovery.ladder: 'explode' is not valid (valid: skip, precision, cooldown, reset_moments, "
                        "rollback, halt)"));
  EXPECT_THAT(error_of_set("guard.recovery.ladder=[halt,skip]"), HasSubstr("'halt' must be the last rung"));
  EXPECT_THAT(error_of_set("guard.recovery.ladder=[skip,skip]"), HasSubstr("listed twice"));
  EXPECT_THAT(error_of_set("guard.recovery.ladder=[]"), HasSubstr("at least one action"));
  EXPECT_THAT(error_of_set("guard.inject.overflow_storm=[3]"), HasSubstr("[start, length]"));
  EXPECT_THAT(error_of_set("guard.recovery.cooldown_factor=0"), HasSubstr("guard.recovery.cooldown_factor"));
  EXPECT_THAT(error_of_set("guard.snapshot.max_mb=0"), HasSubstr("guard.snapshot.max_mb"));
  EXPECT_THAT(error_of_set("guard.noise_scale.ema=1"), HasSubstr("guard.noise_scale.ema"));
  EXPECT_THAT(error_of_set("guard.grad_norm_factor=0.5"), HasSubstr("guard.grad_norm_factor"));
  EXPECT_THAT(error_of_set("guard.loss_window=1"), HasSubstr("guard.loss_window"));
  EXPECT_THAT(error_of_set("guard.warmup=-2"), HasSubstr("guard.warmup"));
  EXPECT_THAT(error_of_set("telemetry.period_ms=1"), HasSubstr("telemetry.period_ms"));
  EXPECT_THAT(error_of_set("telemetry.backend=cuda"), HasSubstr("telemetry.backend"));
  EXPECT_THAT(error_of_set("optim.lr_scaling=cubic"), HasSubstr("valid: none, linear, sqrt"));
  EXPECT_THAT(error_of_set("optim.name=sgd"), HasSubstr("valid: adamw, lamb, lars"));
}

// One rule for batch.global_batch = 0 (micro_batch x accum_steps x ranks), applied when
// the rank count is known: a config loaded for one process and finalized again for two
// ranks doubles the global batch; an explicit global batch stays and sets accum_steps.
TEST(Config, GlobalBatchZeroFollowsTheRankCount) {
  Config c = load_config("", {"batch.micro_batch=4", "batch.accum_steps=1"});
  EXPECT_EQ(c.batch.global_batch, 4);
  c.finalize(2);
  EXPECT_EQ(c.batch.global_batch, 8);
  EXPECT_EQ(c.batch.accum_steps, 1);
  Config e = load_config("", {"batch.micro_batch=4", "batch.global_batch=16"});
  e.finalize(2);
  EXPECT_EQ(e.batch.global_batch, 16);
  EXPECT_EQ(e.batch.accum_steps, 2);
  Config f = load_config("", {"batch.micro_batch=4", "batch.global_batch=4"});
  EXPECT_THAT(error_of([&] { f.finalize(2); }), HasSubstr("not a multiple of batch.micro_batch (4) x ranks (2)"));
}

// Every accepted value of every choice key appears in that key's documentation (the
// text beside the field, which `config show` and docs/config.md print), as a word.
TEST(Config, EveryChoiceValueIsDocumented) {
  const auto keys = choice_keys();
  EXPECT_EQ(keys.size(), 16u);  // run.thread_pool, model.rope_scaling ... dist.hook, lora.targets, memory.weights_dtype
  const std::string reference = test::read_text(test::source_path("docs/config.md"));
  for (const auto& k : keys) {
    ASSERT_FALSE(k.names.empty()) << k.key;
    const auto row = reference.find("| `" + k.key + "` |");
    ASSERT_NE(row, std::string::npos) << k.key << " is missing from docs/config.md";
    const std::string line = reference.substr(row, reference.find('\n', row) - row);
    for (const auto& name : k.names) {
      const std::regex word("(^|[^a-z0-9_])" + name + "([^a-z0-9_]|$)");
      EXPECT_TRUE(std::regex_search(k.doc, word)) << k.key << ": '" << name << "' is accepted but not documented: "
                                                  << k.doc;
      EXPECT_TRUE(std::regex_search(line, word)) << k.key << ": '" << name << "' missing from docs/config.md";
    }
  }
  // The keys the reference texts once got wrong.
  for (const auto& k : keys) {
    if (k.key == "optim.name")
      EXPECT_EQ(k.names, (std::vector<std::string>{"adamw", "lamb", "lars", "adam_atan2"}));
    if (k.key == "schedule.decay") EXPECT_EQ(k.names, (std::vector<std::string>{"cosine", "linear", "constant", "wsd"}));
  }
}

TEST(Config, NonPowerOfTwoBatchWarnsUnlessRequired) {
  Config c = load_config("", {"batch.accum_steps=3"});
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("batch.global_batch 96 is not a power of two"));
  EXPECT_TRUE(load_config("", {}).warnings.empty());
}

TEST(Config, FineTuningWithoutWarmupWarns) {
  // bench natural measured the shock (docs/natural.md): a fine-tune with fewer than 10
  // warmup steps is told so; the default's 20 and a run from random init are not.
  const std::string base = "model.init_from=" + test::source_path("tests/golden/llama2_7b");
  Config c = load_config("", {base, "schedule.warmup_steps=3"});
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("schedule.warmup_steps 3 while fine-tuning (model.init_from)"));
  EXPECT_THAT(c.warnings[0], HasSubstr("docs/natural.md"));
  EXPECT_TRUE(load_config("", {base}).warnings.empty());
  EXPECT_TRUE(load_config("", {base, "schedule.warmup_steps=10"}).warnings.empty());
  EXPECT_TRUE(load_config("", {"schedule.warmup_steps=0"}).warnings.empty());
}

TEST(Config, TheInitFromModelsArchitectureWinsBeforeValidation) {
  // docs/models.md: a fine-tune's config.json decides the architecture. Llama-2-7B's
  // (tests/golden/llama2_7b, the published facts) has 4096 positions, so data.seq_len
  // 2048 and 4096 pass although the built-in default max_seq_len is 1024.
  const std::string dir = test::source_path("tests/golden/llama2_7b");
  for (const char* seq : {"2048", "4096"}) {
    Config c = load_config("", {"model.init_from=" + dir, std::string("data.seq_len=") + seq});
    EXPECT_EQ(c.model.max_seq_len, 4096);
    EXPECT_EQ(c.model.hidden_size, 4096);
    EXPECT_EQ(c.model.vocab_size, 32000);
    EXPECT_EQ(c.model.init_from, dir);
  }
  // Over the model's own positions is still refused, naming both keys.
  EXPECT_THAT(test::bad_input_message([&] { load_config("", {"model.init_from=" + dir, "data.seq_len=8192"}); }),
              HasSubstr("data.seq_len: must be <= model.max_seq_len (4096), got 8192"));
  // A --set architecture key loses to config.json, whichever order.
  EXPECT_EQ(load_config("", {"model.max_seq_len=512", "model.init_from=" + dir}).model.max_seq_len, 4096);
  // A directory that is not a model: exit 2 naming the key and the missing file.
  test::TempDir empty;
  const auto msg = test::bad_input_message([&] { load_config("", {"model.init_from=" + empty.path()}); });
  EXPECT_THAT(msg, HasSubstr("model.init_from"));
  EXPECT_THAT(msg, HasSubstr(empty.path() + "/config.json does not exist"));
}

TEST(Config, AFileReportsEveryBadKeyAtOnce) {
  test::TempDir dir;
  test::write_text(dir.file("bad.yaml"),
                   "optim:\n  lrr: 1e-3\n  eps: -1\nschedul:\n  total_steps: 5\nbatch:\n  micro_batch: abc\n"
                   "model:\n  hidden_size: 64\n");
  // Unknown keys and values of the wrong type are reported together; ranges (eps > 0) are
  // checked once the file reads, by each section's validate().
  const std::string msg = test::bad_input_message([&] { load_config(dir.file("bad.yaml"), {}); });
  EXPECT_THAT(msg, HasSubstr("3 bad keys:"));
  EXPECT_THAT(msg, HasSubstr("optim.lrr: unknown key (did you mean 'optim.lr'?)"));
  EXPECT_THAT(msg, HasSubstr("schedul: unknown key (did you mean 'schedule'?)"));
  EXPECT_THAT(msg, HasSubstr("batch.micro_batch: expected integer, got 'abc'"));
  // One bad key reads as before: the key, then the problem.
  test::write_text(dir.file("one.yaml"), "optim:\n  lrr: 1e-3\n");
  EXPECT_THAT(test::bad_input_message([&] { load_config(dir.file("one.yaml"), {}); }),
              HasSubstr("one.yaml: optim.lrr: unknown key"));
}

TEST(Config, NearestKey) {
  EXPECT_EQ(nearest_key("optim.lrr", {"optim.lr", "optim.eps"}), "optim.lr");
  EXPECT_EQ(nearest_key("zzzzzzzz", {"optim.lr"}), "");
  // The right name in the wrong section points at its section, not at a shorter neighbour.
  EXPECT_EQ(nearest_key("optim.min_lr", {"optim.lr", "schedule.min_lr"}), "schedule.min_lr");
  EXPECT_EQ(nearest_key("schedule.warmup_step", {"schedule.warmup_steps", "schedule.min_lr"}), "schedule.warmup_steps");
  EXPECT_THAT(test::bad_input_message([] { load_config("", {"optim.min_lr=1e-4"}); }),
              HasSubstr("did you mean 'schedule.min_lr'"));
}

}  // namespace
}  // namespace gradguard::config
