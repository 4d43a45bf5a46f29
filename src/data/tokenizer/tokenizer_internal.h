// The pieces behind gradguard::data::Tokenizer (include/gradguard/data/tokenizer/tokenizer.h):
// one backend interface with a tokenizer.json implementation (tokenizer_hf.cpp) and a
// SentencePiece one (tokenizer_sp.cpp), and the BPE model the first uses
// (tokenizer_bpe.cpp). Internal to src/data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gradguard::data::detail {

constexpr int32_t kNoToken = -1;

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // `text` is valid UTF-8.
  virtual void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>* ids) const = 0;
  // Every id is in [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t token_id(std::string_view token) const = 0;
  virtual std::string token_text(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual bool contains_special_text(std::string_view text) const = 0;
  // The model's own bos/eos/pad/unk ids (SentencePiece's built-in ones), kNoToken if none.
  virtual int32_t builtin_bos() const { return kNoToken; }
  virtual int32_t builtin_eos() const { return kNoToken; }
  virtual int32_t builtin_pad() const { return kNoToken; }
};

// Byte-pair encoding over a vocabulary and ranked merges, as a tokenizer.json "BPE"
// model. A word is split into symbols (its characters, or for byte-level tokenizers
// its bytes through the GPT-2 table), then the adjacent pair with the lowest merge rank
// is merged, the leftmost first among equal ranks, until no pair has a rank. Symbols
// are token ids throughout, so merging is integer work; results are cached per thread.
class Bpe {
 public:
  struct Options {
    std::string unk_token;       // "" = none: unknown symbols are dropped
    bool byte_fallback = false;  // unknown symbols become <0xHH> byte tokens
    bool fuse_unk = false;       // a run of unknown tokens becomes one
    bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
  };
  // `vocab`: token text -> id. `merges`: pairs of token texts, rank = index. Throws
  // gradguard::Error naming `where` for a merge whose parts or result are not tokens.
  Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      Options options, const std::string& where);

  // Appends the ids of one pre-tokenized word. With `byte_level`, `word` is raw bytes
  // that the GPT-2 table maps to symbols; otherwise its characters are the symbols.
  void encode_word(std::string_view word, bool byte_level, std::vector<int32_t>* ids) const;
  // Collapses runs of unk ids in ids[begin:] when fuse_unk is set.
  void fuse_unknown(std::vector<int32_t>* ids, size_t begin) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t lookup(std::string_view token) const;

 private:
  void merge_symbols(std::vector<int32_t>* symbols) const;
  void emit_unknown(std::string_view text, std::vector<int32_t>* ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<std::string, int32_t> byte_level_words_;  // raw bytes -> id (ignore_merges)
  std::vector<int32_t> byte_ids_;                               // [byte] id of its GPT-2 character
  std::vector<int32_t> fallback_ids_;                           // [byte] id of <0xHH>, or kNoToken
  bool has_all_fallback_ = false;
  Options options_;
  int32_t unk_id_ = kNoToken;
  uint64_t serial_;  // identifies this instance's entries in the per-thread cache
};

// A SentencePiece .model (tokenizer_sp.cpp, through the plugin plugins/sentencepiece/).
std::unique_ptr<TokenizerBackend> load_sentencepiece(const std::string& model_bytes, const std::string& where);
std::unique_ptr<TokenizerBackend> load_hf_tokenizer(const std::string& json_text, const std::string& config_text,
                                                    const std::string& where);

}  // namespace gradguard::data::detail
