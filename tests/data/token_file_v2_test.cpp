// Version-2 token files (data/token_file.h): 4-byte tokens for vocabularies over 65,536,
// the tokenizer's hash and vocabulary size in the header, read back through TokenFile and
// TokenDataset; and `prepare` with a real tokenizer, on one thread or several, writing
// them.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "gradguard/data/prepare.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/data/token_file.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace gradguard::test {
namespace {

using namespace gradguard::data;

std::vector<int32_t> header_ints(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<int32_t> ints(10);
  in.read(reinterpret_cast<char*>(ints.data()), 40);
  return ints;
}

TEST(TokenFileV2, WideVocabulariesGetFourByteTokens) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 151668, 7};
  TokenFileMeta meta;
  meta.dataset_id = 0x1122334455667788ULL;
  meta.tokenizer_hash = 0xfedcba9876543210ULL;
  meta.vocab_size = 151669;  // Qwen3's
  write_token_file(dir.file("t.bin"), tokens, meta);
  const auto h = header_ints(dir.file("t.bin"));
  EXPECT_EQ(h[0], kTokenFileMagic);
  EXPECT_EQ(h[1], 2);
  EXPECT_EQ(h[2], 5);  // count, low 32 bits
  EXPECT_EQ(h[5], 4);  // width
  EXPECT_EQ(h[6], 0);  // count, high 32 bits
  EXPECT_EQ(static_cast<uint32_t>(h[7]), 0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>(h[8]), 0xfedcba98u);
  EXPECT_EQ(h[9], 151669);
  const TokenFile file(dir.file("t.bin"), 151669);
  EXPECT_EQ(file.version(), 2);
  EXPECT_EQ(file.width(), 4);
  ASSERT_EQ(file.size(), 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(file.token(i), tokens[static_cast<size_t>(i)]);
  EXPECT_EQ(file.data(), nullptr);
  EXPECT_EQ(file.tokenizer_hash(), meta.tokenizer_hash);
  EXPECT_EQ(file.tokenizer_vocab_size(), 151669);
  EXPECT_EQ(file.dataset_id(), meta.dataset_id);
  EXPECT_NE(bad_input_message([&] { TokenFile(dir.file("t.bin"), 151668); }).find("token 151668 at position 3"),
            std::string::npos);
}

TEST(TokenFileV2, SmallVocabulariesKeepTwoBytes) {
  TempDir dir;
  TokenFileMeta meta;
  meta.vocab_size = 32000;
  meta.tokenizer_hash = 42;
  write_token_file(dir.file("t.bin"), std::vector<uint32_t>{1, 31999}, meta);
  const TokenFile file(dir.file("t.bin"), 32000);
  EXPECT_EQ(file.width(), 2);
  EXPECT_EQ(file.token(1), 31999);
  EXPECT_EQ(file.tokenizer_hash(), 42u);
}

TEST(TokenFileV2, WriterAndReaderRefuseBadFiles) {
  TempDir dir;
  TokenFileMeta meta;
  meta.vocab_size = 100;
  EXPECT_NE(bad_input_message([&] { write_token_file(dir.file("t.bin"), std::vector<uint32_t>{5, 100}, meta); })
                .find("token 100 at position 1 is outside the vocabulary (vocab_size 100)"),
            std::string::npos);
  meta.vocab_size = 0;
  EXPECT_NE(bad_input_message([&] { write_token_file(dir.file("t.bin"), std::vector<uint32_t>{}, meta); })
                .find("vocab_size 0"),
            std::string::npos);
  // A width that is neither 2 nor 4, and a count that disagrees with the file's length.
  meta.vocab_size = 100000;
  write_token_file(dir.file("t.bin"), std::vector<uint32_t>{1, 2, 3}, meta);
  std::string bytes = read_text(dir.file("t.bin"));
  std::string bad = bytes;
  const int32_t three = 3;
  std::memcpy(&bad[20], &three, 4);
  write_text(dir.file("w.bin"), bad);
  EXPECT_NE(bad_input_message([&] { TokenFile(dir.file("w.bin"), 0); }).find("3 bytes wide"), std::string::npos);
  bad = bytes;
  const int32_t one = 1;
  std::memcpy(&bad[24], &one, 4);  // count += 2^32
  write_text(dir.file("c.bin"), bad);
  EXPECT_NE(bad_input_message([&] { TokenFile(dir.file("c.bin"), 0); }).find("but file has 12 bytes"),
            std::string::npos);
  // A high count word with its top bit set (found by the token_file fuzzer: the count and the
  // byte size in the message used to overflow a signed 64-bit integer).
  bad = bytes;
  const uint32_t huge = 0x80000001u;
  std::memcpy(&bad[24], &huge, 4);
  write_text(dir.file("h.bin"), bad);
  EXPECT_NE(bad_input_message([&] { TokenFile(dir.file("h.bin"), 0); })
                .find("header says 9223372041149743107 tokens (more bytes than the whole file) but file has 12 bytes"),
            std::string::npos);
}

TEST(TokenFileV2, DatasetBatchesReadWideTokens) {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 65; ++i) tokens.push_back(70000 + i);
  TokenFileMeta meta;
  meta.vocab_size = 80000;
  write_token_file(dir.file("t.bin"), tokens, meta);
  auto file = std::make_shared<const TokenFile>(dir.file("t.bin"), 80000);
  const TokenDataset dataset(file, 8, /*shuffle=*/false, 1);
  const Batch b = dataset.batch(0, 2);
  EXPECT_EQ(b.inputs[0][0].item<int64_t>(), 70000);
  EXPECT_EQ(b.targets[0][7].item<int64_t>(), 70008);
  EXPECT_EQ(b.inputs[1][0].item<int64_t>(), 70008);
}

// A character-level tokenizer.json: printable ASCII, one id each, no merges; "<eos>" is
// its end-of-text token (tokenizer_config.json).
void write_char_tokenizer(const TempDir& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 32;
  vocab["<eos>"] = 95;
  const nlohmann::json doc = {
      {"added_tokens", nlohmann::json::array({{{"id", 95}, {"content", "<eos>"}, {"special", true}}})},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  write_text(dir.file("tok/tokenizer.json"), doc.dump());
  write_text(dir.file("tok/tokenizer_config.json"), R"({"eos_token": "<eos>"})");
}

TEST(PrepareWithTokenizer, WritesVersionTwoFilesWithTheTokenizersHash) {
  TempDir dir;
  write_char_tokenizer(dir);
  std::string jsonl;
  for (int i = 0; i < 40; ++i) jsonl += "{\"text\": \"document " + std::to_string(i) + " here\"}\n";
  write_text(dir.file("docs.jsonl"), jsonl);
  PrepareOptions options;
  options.inputs = {dir.file("docs.jsonl")};
  options.out_dir = dir.file("one");
  options.tokenizer = dir.file("tok");
  options.val_fraction = 0.1;
  options.threads = 1;
  const PrepareResult one = prepare_dataset(options);
  options.out_dir = dir.file("two");
  options.threads = 2;
  const PrepareResult two = prepare_dataset(options);
  EXPECT_EQ(read_text(one.train_path).substr(kTokenFileHeaderBytes), read_text(two.train_path).substr(kTokenFileHeaderBytes));
  EXPECT_EQ(one.documents, 40);
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tok"));
  EXPECT_EQ(one.tokenizer_identity, tokenizer.identity());
  const TokenFile train(one.train_path, 96);
  EXPECT_EQ(train.version(), 2);
  EXPECT_EQ(train.tokenizer_hash(), tokenizer_file_hash(dir.file("tok")));
  EXPECT_EQ(train.tokenizer_hash(), tokenizer.hash());
  EXPECT_EQ(train.tokenizer_vocab_size(), 96);
  // Document 0 (train): its ids, then <eos>.
  const auto first = tokenizer.encode("document 0 here");
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(train.token(static_cast<int64_t>(i)), first[i]);
  EXPECT_EQ(train.token(static_cast<int64_t>(first.size())), 95);
  // All 40 documents: 15 or 16 characters each, plus <eos>.
  EXPECT_EQ(one.train_tokens + one.val_tokens, 40 * 17 - 10);
}

TEST(PrepareWithTokenizer, AMissingTokenizerWritesNothing) {
  TempDir dir;
  write_text(dir.file("a.txt"), "some text");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.file("out");
  options.tokenizer = dir.file("nowhere");
  EXPECT_NE(bad_input_message([&] { prepare_dataset(options); }).find("nowhere"), std::string::npos);
  EXPECT_FALSE(std::ifstream(dir.file("out/train.bin")).good());
  options.tokenizer = "";
  options.threads = -1;
  EXPECT_NE(bad_input_message([&] { prepare_dataset(options); }).find("prepare.threads"), std::string::npos);
}

}  // namespace
}  // namespace gradguard::test
