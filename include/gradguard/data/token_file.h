// Token files in llm.c's format: a header of 256 little-endian int32 (magic 20240520,
// version 1, token count, then -- written by `gradguard prepare`, zero in llm.c's own
// files -- a 64-bit dataset id in ints 3 and 4, the rest zero) followed by the tokens as
// uint16. The dataset id is the same in the train and val files of one `prepare` run
// and differs between runs, so a train file next to a validation file of another
// dataset (a prepare killed half-way over an older one) is recognised. gradguard
// writes them with `gradguard prepare` and reads them (its own and llm.c's shards)
// through a read-only memory map, so a multi-gigabyte corpus costs no RAM up front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int64_t kTokenFileHeaderInts = 256;
constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// Writes `tokens` to `path` atomically (a temporary file in the same directory, fsync,
// rename), creating parent directories. Throws gradguard::Error (bad input) naming the
// path when it cannot be written.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, uint64_t dataset_id = 0);

// A fresh dataset id for one `prepare` run: random and non-zero.
uint64_t new_dataset_id();

// Throws gradguard::Error (bad input) naming both files when `train` and `val` carry
// dataset ids from different `prepare` runs (files without an id are not checked).
class TokenFile;
void check_same_dataset(const TokenFile& train, const TokenFile& val);

// A validated, read-only memory map of one token file.
class TokenFile {
 public:
  // Maps `path` and validates it: the file exists and is readable, is at least one
  // header long, has the magic and version above, and its size is exactly
  // header + 2 * token_count bytes (a header that lies about the length is rejected).
  // With vocab_size > 0 every token is checked to be < vocab_size (one linear scan).
  // Every failure throws gradguard::Error (bad input) naming the file and the problem.
  TokenFile(const std::string& path, int64_t vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return num_tokens_; }        // number of tokens
  const uint16_t* data() const { return tokens_; }    // [size()]
  uint64_t dataset_id() const { return dataset_id_; }  // 0 = none recorded

 private:
  std::string path_;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
  uint64_t dataset_id_ = 0;
};

}  // namespace gradguard::data
