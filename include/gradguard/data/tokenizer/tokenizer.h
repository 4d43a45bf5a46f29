// A model's own tokenizer, so that fine-tuning data is tokenized exactly as the
// checkpoint was trained. Two formats are read:
//  - tokenizer.json (Hugging Face "tokenizers"): BPE models with the normalizers,
//    pre-tokenizers (regex Split, ByteLevel, Metaspace), added/special tokens,
//    post-processors and decoders that Llama-2/3, Mistral, Qwen2/3 and GPT-2 style
//    checkpoints use. Ids are those of the JavaScript reference implementation
//    (@huggingface/tokenizers), which the tests compare against token for token;
//    docs/tokenizers.md lists what is supported and where the reference's reading is
//    followed.
//  - SentencePiece .model files, through libsentencepiece in a plugin
//    (plugins/sentencepiece/: why it cannot be linked in directly).
// A tokenizer_config.json beside tokenizer.json supplies bos/eos/pad tokens, extra
// special tokens and the chat template.
//
// Text that is not valid UTF-8 is repaired first (each ill-formed sequence becomes
// U+FFFD, as JavaScript's TextDecoder does), so any bytes can be encoded. A Tokenizer
// is immutable after load and safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gradguard::data {

namespace detail {
class TokenizerBackend;
}

class Tokenizer {
 public:
  // `path`: a model directory (its tokenizer.json, else its tokenizer.model), a
  // tokenizer.json file, or a SentencePiece .model file. Throws gradguard::Error (bad
  // input) naming the file and, for tokenizer.json, the JSON path of what is missing,
  // malformed or not supported.
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text`. `add_special_tokens` applies the post-processor (Llama's <s>).
  // Special-token strings inside `text` ("<|im_end|>") become their ids, as in the
  // reference; contains_special_text() tells when a user's text holds one.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The text of `ids`; `skip_special_tokens` leaves special tokens out. Throws
  // gradguard::Error (bad input) for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Number of ids (the largest id + 1, added tokens included).
  int64_t vocab_size() const;
  // The id of a token's text (its vocabulary form, e.g. "<|im_end|>"); -1 if none.
  int32_t token_id(std::string_view token) const;
  // The vocabulary form of an id ("" outside the vocabulary).
  std::string token_text(int32_t id) const;
  bool is_special(int32_t id) const;
  // True when `text` contains the text of a special token.
  bool contains_special_text(std::string_view text) const;

  // Ids of the beginning/end-of-sequence and padding tokens; -1 when the tokenizer has
  // none.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // tokenizer_config.json's chat_template ("" when there is none).
  const std::string& chat_template() const { return chat_template_; }

  // "fnv1a64:<16 hex digits>" of the tokenizer file's bytes: token files record it, and
  // training refuses data made with another tokenizer.
  const std::string& identity() const { return identity_; }
  // The same hash as a number (what a version-2 token file records).
  uint64_t hash() const { return hash_; }
  // "tokenizer.json" or "sentencepiece".
  const std::string& format() const { return format_; }
  // The file the tokenizer was read from.
  const std::string& path() const { return path_; }

 private:
  Tokenizer() = default;
  std::unique_ptr<detail::TokenizerBackend> backend_;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
  uint64_t hash_ = 0;
  std::string bos_token_, eos_token_, chat_template_, identity_, format_, path_;
};

// FNV-1a (64-bit) of `bytes`.
uint64_t fnv1a64(std::string_view bytes);
// Tokenizer::hash() of the tokenizer at `path` (a model directory, its tokenizer.json or
// .model) without loading it; 0 when `path` holds neither. Throws gradguard::Error when
// the file exists but cannot be read.
uint64_t tokenizer_file_hash(const std::string& path);

}  // namespace gradguard::data
