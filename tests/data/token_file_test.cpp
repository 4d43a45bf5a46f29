// Token files: the writer's exact bytes, round trips, files built by hand in llm.c's
// raw layout, and one test per validation failure checking that the error is bad input
// and names the file and the problem.
#include "gradguard/data/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::data {
namespace {

using ::testing::HasSubstr;

using test::bad_input_message;

void put_le32(std::string& out, int32_t value) {
  const auto u = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xffu));
}

// A token file assembled byte by byte, the way llm.c lays it out.
std::string raw_token_file(int32_t magic, int32_t version, int32_t count,
                           const std::vector<uint16_t>& tokens) {
  std::string bytes;
  put_le32(bytes, magic);
  put_le32(bytes, version);
  put_le32(bytes, count);
  bytes.resize(1024, '\0');
  for (const uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  return bytes;
}

TEST(TokenFile, WriteThenReadRoundTrips) {
  test::TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  write_token_file(dir.file("t.bin"), tokens);
  TokenFile file(dir.file("t.bin"), 0);
  EXPECT_EQ(file.path(), dir.file("t.bin"));
  ASSERT_EQ(file.size(), 7);
  EXPECT_EQ(std::vector<uint16_t>(file.data(), file.data() + file.size()), tokens);
}

TEST(TokenFile, WrittenHeaderHasExactBytes) {
  test::TempDir dir;
  write_token_file(dir.file("t.bin"), {1, 2, 0x1234});
  const std::string bytes = test::read_text(dir.file("t.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  // 20240520 = 0x0134D888, little-endian.
  EXPECT_EQ(bytes.substr(0, 4), std::string("\x88\xD8\x34\x01", 4));
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x01\x00\x00\x00", 4));
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x03\x00\x00\x00", 4));
  EXPECT_EQ(bytes.substr(12, 1012), std::string(1012, '\0'));
  EXPECT_EQ(bytes.substr(1024), std::string("\x01\x00\x02\x00\x34\x12", 6));
  EXPECT_EQ(bytes, raw_token_file(20240520, 1, 3, {1, 2, 0x1234}));
}

TEST(TokenFile, EmptyTokenListIsAValidFile) {
  test::TempDir dir;
  write_token_file(dir.file("empty.bin"), {});
  TokenFile file(dir.file("empty.bin"), 256);
  EXPECT_EQ(file.size(), 0);
}

TEST(TokenFile, WriteCreatesParentsAndLeavesNoTemporaryFile) {
  test::TempDir dir;
  const std::string path = dir.file("a/b/c/t.bin");
  write_token_file(path, {5, 6});
  write_token_file(path, {7, 8, 9});  // overwrite replaces the file
  TokenFile file(path, 256);
  EXPECT_EQ(std::vector<uint16_t>(file.data(), file.data() + file.size()),
            (std::vector<uint16_t>{7, 8, 9}));
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("a/b/c"))) {
    EXPECT_EQ(entry.path().filename(), "t.bin");
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(TokenFile, WriteFailureNamesThePath) {
  test::TempDir dir;
  test::write_text(dir.file("blocker"), "a regular file, not a directory");
  const std::string path = dir.file("blocker/sub/t.bin");
  const std::string msg = bad_input_message([&] { write_token_file(path, {1}); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("cannot create directory"));
}

TEST(TokenFile, LoadsAFileInRawLlmcLayout) {
  test::TempDir dir;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0};
  test::write_text(dir.file("llmc.bin"), raw_token_file(20240520, 1, 5, tokens));
  TokenFile file(dir.file("llmc.bin"), 50257);
  ASSERT_EQ(file.size(), 5);
  EXPECT_EQ(std::vector<uint16_t>(file.data(), file.data() + 5), tokens);
}

TEST(TokenFile, MissingFileIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("nope.bin");
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("cannot open: No such file or directory"));
}

TEST(TokenFile, DirectoryIsBadInput) {
  test::TempDir dir;
  const std::string msg = bad_input_message([&] { TokenFile file(dir.path(), 256); });
  EXPECT_THAT(msg, HasSubstr(dir.path()));
  EXPECT_THAT(msg, HasSubstr("is not a regular file"));
}

TEST(TokenFile, TruncatedHeaderIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("short.bin");
  test::write_text(path, std::string(100, 'x'));
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("truncated: 100 bytes, header needs 1024"));
}

TEST(TokenFile, WrongMagicIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("foreign.bin");
  test::write_text(path, raw_token_file(12345, 1, 2, {1, 2}));
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("bad magic number 12345 (expected 20240520)"));
  EXPECT_THAT(msg, HasSubstr("not a token file written by `gradguard prepare` or llm.c"));
}

TEST(TokenFile, UnsupportedVersionIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("v3.bin");
  test::write_text(path, raw_token_file(20240520, 3, 2, {1, 2}));
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("unsupported version 3"));
}

TEST(TokenFile, HeaderClaimingMoreTokensIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("liar.bin");
  test::write_text(path, raw_token_file(20240520, 1, 10, {1, 2, 3, 4}));
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("header says 10 tokens (20 bytes) but file has 8 bytes of tokens"));
}

TEST(TokenFile, TrailingBytesAreBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("odd.bin");
  test::write_text(path, raw_token_file(20240520, 1, 2, {1, 2}) + "z");
  const std::string msg = bad_input_message([&] { TokenFile file(path, 0); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("header says 2 tokens (4 bytes) but file has 5 bytes of tokens"));
}

TEST(TokenFile, NegativeTokenCountIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("neg.bin");
  test::write_text(path, raw_token_file(20240520, 1, -1, {}));
  const std::string msg = bad_input_message([&] { TokenFile file(path, 0); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("header says -1 tokens"));
}

TEST(TokenFile, TokenOutsideVocabularyIsBadInput) {
  test::TempDir dir;
  const std::string path = dir.file("vocab.bin");
  std::vector<uint16_t> tokens(20, 65);
  tokens[17] = 300;
  write_token_file(path, tokens);
  const std::string msg = bad_input_message([&] { TokenFile file(path, 256); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg,
              HasSubstr("token 300 at position 17 is outside the vocabulary (vocab_size 256)"));
  // vocab_size 0 skips the scan; a vocabulary large enough accepts the file.
  EXPECT_EQ(TokenFile(path, 0).size(), 20);
  EXPECT_EQ(TokenFile(path, 301).size(), 20);
}

}  // namespace
}  // namespace gradguard::data
