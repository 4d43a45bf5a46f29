// SentencePiece .model files through the plugin: models trained here with Debian's
// spm_train (unigram, and BPE with byte fallback) on part of the Brown corpus give the
// ids of spm_encode and the text of spm_decode (the same library's command-line tools,
// the reference) line by line, round-trip plain text, and report their special ids. It
// runs in the same process as LibTorch, which a directly linked libsentencepiece cannot
// (plugins/sentencepiece/sentencepiece_plugin.cpp says why).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <sstream>

#include "data/tokenizer/tokenizer_reference.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace gradguard::test {
namespace {

using data::Tokenizer;

std::string run(const std::string& command, int* status) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string out;
  char buffer[1 << 16];
  size_t n;
  while (pipe && (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0) out.append(buffer, n);
  *status = pipe ? pclose(pipe.release()) : -1;
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class SentencePiece : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() {
#ifndef GRADGUARD_HAVE_SENTENCEPIECE
    skip_ = "this build has no SentencePiece plugin (libsentencepiece-dev not installed)";
    return;
#endif
    int status = 0;
    run("spm_train --help >/dev/null 2>&1", &status);
    if (status != 0 && status != 256) {  // spm_train --help exits 1 on some versions
      skip_ = "spm_train is not installed (Debian package sentencepiece)";
      return;
    }
    dir_ = std::make_unique<TempDir>();
    std::string corpus = brown_corpus();
    if (corpus.empty()) {
      for (int i = 0; i < 4000; ++i) corpus += "Line " + std::to_string(i) + " of a small corpus, with words.\n";
    }
    corpus.resize(std::min<size_t>(corpus.size(), 400000));
    text_ = corpus.substr(corpus.size() / 2);
    write_text(dir_->file("corpus.txt"), corpus.substr(0, corpus.size() / 2));
    for (const std::string type : {"unigram", "bpe"}) {
      const std::string command = "cd '" + dir_->path() + "' && spm_train --input=corpus.txt --model_prefix=" + type +
                                  " --model_type=" + type + " --vocab_size=800 --byte_fallback=" +
                                  (type == "bpe" ? "true" : "false") + " --minloglevel=2 >train-" + type + ".log 2>&1";
      run(command, &status);
      if (status != 0) skip_ = "spm_train failed: " + read_text(dir_->file("train-" + type + ".log"));
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    model_ = dir_->file(std::string(GetParam()) + ".model");
  }

  // spm_encode's ids of each line of `text`.
  std::vector<std::vector<int32_t>> reference_ids(const std::string& text) {
    write_text(dir_->file("in.txt"), text);
    int status = 0;
    const std::string out = run("spm_encode --model='" + model_ + "' --output_format=id < '" + dir_->file("in.txt") + "'", &status);
    EXPECT_EQ(status, 0);
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& line : lines_of(out)) {
      std::vector<int32_t> row;
      std::istringstream in(line);
      for (int32_t id; in >> id;) row.push_back(id);
      ids.push_back(row);
    }
    return ids;
  }

  static std::unique_ptr<TempDir> dir_;
  static std::string skip_, text_;
  std::string model_;
};
std::unique_ptr<TempDir> SentencePiece::dir_;
std::string SentencePiece::skip_;
std::string SentencePiece::text_;

TEST_P(SentencePiece, IdsAndTextMatchSpmEncodeAndDecode) {
  const Tokenizer tokenizer = Tokenizer::load(model_);
  EXPECT_EQ(tokenizer.format(), "sentencepiece");
  // Brown lines the model was not trained on, and the hostile text's well-formed lines
  // (ill-formed UTF-8 is repaired before SentencePiece sees it, as for tokenizer.json,
  // which spm_encode does not do).
  std::string text;
  for (const std::string& line : lines_of(text_ + hostile_text())) {
    if (line.find("Invalid:") == std::string::npos && line.find('\r') == std::string::npos) text += line + "\n";
  }
  const auto lines = lines_of(text);
  const auto expected = reference_ids(text);
  ASSERT_EQ(expected.size(), lines.size());
  std::string all_ids;
  size_t same = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto ids = tokenizer.encode(lines[i], false);
    if (ids == expected[i]) ++same;
    else ADD_FAILURE() << "line " << i << ": \"" << lines[i].substr(0, 80) << "\"";
    for (size_t k = 0; k < expected[i].size(); ++k) all_ids += (k ? " " : "") + std::to_string(expected[i][k]);
    all_ids += "\n";
  }
  EXPECT_EQ(same, lines.size());
  // spm_decode of the same ids, line by line.
  write_text(dir_->file("ids.txt"), all_ids);
  int status = 0;
  const auto decoded = lines_of(run("spm_decode --model='" + model_ + "' --input_format=id < '" + dir_->file("ids.txt") + "'", &status));
  ASSERT_EQ(decoded.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(tokenizer.decode(expected[i]), decoded[i]) << "line " << i;
}

TEST_P(SentencePiece, PlainTextRoundTripsAndSpecialIdsAreTheModels) {
  const Tokenizer tokenizer = Tokenizer::load(model_);
  for (const std::string text : {"The jury said it did find that the city was well run.", "Hello world, this is a test.",
                                 "Numbers 1961 and 42 stay."}) {
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, false)), text);
  }
  // spm_train's defaults: unk 0, bos 1, eos 2, no pad.
  EXPECT_EQ(tokenizer.vocab_size(), 800);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.pad_id(), -1);
  EXPECT_EQ(tokenizer.token_text(1), "<s>");
  EXPECT_EQ(tokenizer.token_id("</s>"), 2);
  EXPECT_EQ(tokenizer.token_id("no such piece"), -1);
  EXPECT_TRUE(tokenizer.is_special(2));
  const auto ids = tokenizer.encode("Hello", true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tokenizer.decode(ids), "<s>Hello");
  EXPECT_EQ(tokenizer.decode(ids, true), "Hello");
  EXPECT_TRUE(tokenizer.contains_special_text("a </s> b"));
  // A model directory with only tokenizer.model loads it.
  TempDir dir;
  write_text(dir.file("tokenizer.model"), read_text(model_));
  EXPECT_EQ(Tokenizer::load(dir.path()).encode("Hello world"), tokenizer.encode("Hello world"));
  EXPECT_NE(Tokenizer::load(dir.path()).hash(), 0u);
  EXPECT_EQ(data::tokenizer_file_hash(dir.path()), Tokenizer::load(dir.path()).hash());
}

INSTANTIATE_TEST_SUITE_P(TrainedHere, SentencePiece, ::testing::Values("unigram", "bpe"));

TEST(SentencePieceErrors, ANonModelFileIsBadInput) {
#ifndef GRADGUARD_HAVE_SENTENCEPIECE
  GTEST_SKIP() << "this build has no SentencePiece plugin";
#endif
  TempDir dir;
  write_text(dir.file("tokenizer.model"), std::string("\x0a\x03" "abc\xff\xff", 7));
  const std::string message = bad_input_message([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("is not a SentencePiece model"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.file("tokenizer.model")), std::string::npos) << message;
}

}  // namespace
}  // namespace gradguard::test
