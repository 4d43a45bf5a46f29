// safetensors: round trips for every dtype, reading the files make_golden.py wrote with
// its own independent writer, and rejection of truncated, corrupt and hostile files.
#include "gradguard/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden_util.h"
#include "gradguard/core/error.h"

namespace gradguard::checkpoint {
namespace {
using ::testing::HasSubstr;

// A file with a hand-written header and `data_bytes` zero bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t declared_len = 0) {
  uint64_t n = declared_len ? declared_len : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

void expect_rejected(const std::string& bytes, const std::string& needle) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  test::write_text(path, bytes);
  try {
    load_safetensors(path);
    FAIL() << "accepted a file that should fail with: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

TEST(Safetensors, RoundTripsAllDtypes) {
  test::TempDir dir;
  NamedTensors tensors;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt,
                     torch::kShort, torch::kChar, torch::kByte, torch::kBool})
    tensors.emplace_back(std::string("t_") + c10::toString(dtype), (torch::arange(12) % 5).reshape({3, 4}).to(dtype));
  tensors.emplace_back("scalar", torch::tensor(3.5f).reshape({}));
  tensors.emplace_back("empty", torch::zeros({0, 4}));
  save_safetensors(dir.file("x.safetensors"), tensors, {{"format", "pt"}, {"note", "hi"}});
  auto back = load_safetensors(dir.file("x.safetensors"));
  EXPECT_EQ(back.metadata.at("note"), "hi");
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    EXPECT_EQ(back.tensors[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back.tensors[name], t)) << name;
  }
}

TEST(Safetensors, HeaderIsAlignedAndReadableByOtherWriters) {
  test::TempDir dir;
  save_safetensors(dir.file("a.safetensors"), {{"w", torch::ones({3})}});
  auto bytes = test::read_text(dir.file("a.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  // Written by make_golden.py's own writer.
  auto golden = load_safetensors(test::source_path("tests/golden/llama_tiny/model.safetensors"));
  EXPECT_EQ(golden.tensors.at("model.embed_tokens.weight").sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(golden.metadata.at("format"), "pt");
}

TEST(Safetensors, RejectsTruncatedFile) { expect_rejected("abc", "truncated"); }

TEST(Safetensors, RejectsHugeHeaderLength) { expect_rejected(raw_file("{}", 0, 1ull << 40), "exceeds"); }

TEST(Safetensors, RejectsHeaderPastEnd) { expect_rejected(raw_file("{}", 0, 64), "past the end"); }

TEST(Safetensors, RejectsBadJson) { expect_rejected(raw_file("{not json", 0), "not valid JSON"); }

TEST(Safetensors, RejectsOffsetsPastEnd) {
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "outside the data");
}

TEST(Safetensors, RejectsOverlappingTensors) {
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           16),
                  "overlap");
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_rejected(raw_file(R"({"a":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2), "unknown dtype");
}

TEST(Safetensors, RejectsShapeByteLengthMismatch) {
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "does not match");
}

TEST(Safetensors, RejectsMalformedEntry) {
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "non-negative");
  expect_rejected(raw_file(R"({"a":[1,2]})", 0), "must be an object");
}

TEST(Safetensors, MissingFileNamesThePath) {
  try {
    load_safetensors("/nonexistent/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/model.safetensors"));
  }
}

TEST(SafetensorsHeader, ParsesEntriesFromMemory) {
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},)"
                             R"("a":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})";
  const std::string bytes = raw_file(header, 20);
  const SafetensorsHeader h = parse_safetensors_header("mem", bytes.data(), bytes.size());
  EXPECT_EQ(h.data_start, 8 + header.size());
  EXPECT_EQ(h.metadata.at("format"), "pt");
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].name, "a");  // JSON object order: sorted by name
  EXPECT_EQ(h.entries[0].dtype, "F64");
  EXPECT_EQ(h.entries[0].element_size, 8);
  EXPECT_TRUE(h.entries[0].shape.empty());
  EXPECT_EQ(h.entries[0].begin, 0u);
  EXPECT_EQ(h.entries[0].end, 8u);
  EXPECT_EQ(h.entries[1].name, "b");
  EXPECT_EQ(h.entries[1].dtype, "BF16");
  EXPECT_EQ(h.entries[1].element_size, 2);
  EXPECT_EQ(h.entries[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.entries[1].begin, 8u);
  EXPECT_EQ(h.entries[1].end, 20u);
}

TEST(SafetensorsHeader, MatchesWhatTheWriterProduces) {
  test::TempDir dir;
  save_safetensors(dir.file("w.safetensors"), {{"w", torch::ones({3, 2})}, {"z", torch::zeros({0})}});
  const std::string bytes = test::read_text(dir.file("w.safetensors"));
  const SafetensorsHeader h = parse_safetensors_header("w", bytes.data(), bytes.size());
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(h.entries[0].end - h.entries[0].begin, 24u);
  EXPECT_EQ(h.entries[1].begin, h.entries[1].end);
  EXPECT_EQ(h.data_start + 24, bytes.size());
}

TEST(SafetensorsHeader, RejectsWithTheGivenPathAndSameMessages) {
  const auto rejects = [](const std::string& bytes, const std::string& needle) {
    try {
      parse_safetensors_header("where.safetensors", bytes.data(), bytes.size());
      ADD_FAILURE() << "accepted bytes that should fail with: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_THAT(e.what(), HasSubstr("where.safetensors"));
      EXPECT_THAT(e.what(), HasSubstr(needle));
    }
  };
  rejects("", "truncated");
  rejects(raw_file("{}", 0, 1ull << 40), "exceeds");
  rejects(raw_file("[]", 0), "expected a JSON object");
  rejects(raw_file(R"({"__metadata__":{"k":1}})", 0), "is not a string");
  rejects(raw_file(R"({"a":{"dtype":"F32","shape":[1099511627777],"data_offsets":[0,4]}})", 4),
          "implausibly large");
  rejects(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), "outside the data");
}

}  // namespace
}  // namespace gradguard::checkpoint
