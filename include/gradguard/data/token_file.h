// Token files. Version 1 is llm.c's format: a header of 256 little-endian int32 (magic
// 20240520, version 1, token count, then -- written by `gradguard prepare`, zero in
// llm.c's own files -- a 64-bit dataset id in ints 3 and 4, the rest zero) followed by
// the tokens as uint16. Version 2, written when a real tokenizer is used, has the same
// header start and adds: int 5 the token width in bytes (2, or 4 for vocabularies over
// 65,536 ids such as Qwen's 151k), int 6 the high 32 bits of the token count (int 2 holds
// the low 32), ints 7 and 8 the 64-bit hash of the tokenizer.json the ids come from
// (data::tokenizer_file_hash), int 9 that tokenizer's vocabulary size. Training refuses
// a file whose tokenizer is not the model's. Int 10 is 1 when a flags section follows the
// tokens: one byte per token, bit 0 (kTokenTrained) when the token is a training target
// (its prediction counts in the loss; prompts and chat headers have it clear) and bit 1
// (kTokenSampleStart) on the first token of each sample (`gradguard prepare` on chat and
// prompt/completion data, docs/data.md).
//
// The dataset id is the same in the train and val files of one `prepare` run and
// differs between runs, so a train file next to a validation file of another dataset (a
// prepare killed half-way over an older one) is recognised. gradguard writes them with
// `gradguard prepare` and reads them (its own and llm.c's shards) through a read-only
// memory map, so a multi-gigabyte corpus costs no RAM up front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;   // uint16 tokens, llm.c's
constexpr int32_t kTokenFileVersion2 = 2;  // width and tokenizer in the header
constexpr int64_t kTokenFileHeaderInts = 256;
constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;
constexpr uint8_t kTokenTrained = 1;      // flags: a training target
constexpr uint8_t kTokenSampleStart = 2;  // flags: the first token of a sample

// Writes `tokens` to `path` atomically (a temporary file in the same directory, fsync,
// rename), creating parent directories. Throws gradguard::Error (bad input) naming the
// path when it cannot be written.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, uint64_t dataset_id = 0);

// What a version-2 file records about its tokens.
struct TokenFileMeta {
  uint64_t dataset_id = 0;      // see above; 0 = none
  uint64_t tokenizer_hash = 0;  // data::tokenizer_file_hash of the tokenizer.json; 0 = none
  int64_t vocab_size = 0;       // the tokenizer's; > 65536 makes the tokens 4 bytes wide
};
// Writes a version-2 file atomically, as write_token_file above does a version-1 one.
// Throws gradguard::Error (bad input) naming the path when it cannot be written or a
// token is outside [0, vocab_size).
// `flags`, when not empty, is the flags section: one byte per token (same length as
// `tokens`, only bits 0 and 1 used, the first byte a sample start).
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileMeta& meta,
                      const std::vector<uint8_t>& flags = {});

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
  // header long, has the magic and a version above, and its size is exactly
  // header + width * token_count bytes (a header that lies about the length is rejected).
  // With vocab_size > 0 every token is checked to be < vocab_size (one linear scan).
  // Every failure throws gradguard::Error (bad input) naming the file and the problem.
  TokenFile(const std::string& path, int64_t vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return num_tokens_; }          // number of tokens
  int width() const { return width_; }                  // bytes per token: 2 or 4
  const uint16_t* data() const { return width_ == 2 ? static_cast<const uint16_t*>(tokens_) : nullptr; }
  const uint32_t* data32() const { return width_ == 4 ? static_cast<const uint32_t*>(tokens_) : nullptr; }
  int64_t token(int64_t i) const {  // i in [0, size())
    return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i] : static_cast<const uint32_t*>(tokens_)[i];
  }
  int version() const { return version_; }
  uint64_t dataset_id() const { return dataset_id_; }          // 0 = none recorded
  uint64_t tokenizer_hash() const { return tokenizer_hash_; }  // 0 = byte-level or unknown (version 1)
  int64_t tokenizer_vocab_size() const { return tokenizer_vocab_size_; }  // 0 = not recorded
  // The flags section (version 2 with int 10 = 1): null when the file has none, which
  // means every token is a target and the file is one stream without samples.
  const uint8_t* flags() const { return flags_; }
  bool has_flags() const { return flags_ != nullptr; }

 private:
  std::string path_;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
  int width_ = 2;
  int version_ = kTokenFileVersion;
  uint64_t dataset_id_ = 0;
  uint64_t tokenizer_hash_ = 0;
  int64_t tokenizer_vocab_size_ = 0;
  const uint8_t* flags_ = nullptr;
};

}  // namespace gradguard::data
