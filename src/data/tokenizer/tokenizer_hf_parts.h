// The stages of a tokenizer.json pipeline (normalizer, pre-tokenizer, decoder), each
// built from its JSON object and applied as the JavaScript reference applies it. A
// stage type that is not implemented is refused at load with the JSON path of its
// "type" and the list of supported types, never skipped. Internal to src/data.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradguard::data::detail {

// Where a JSON value sits, for messages: "tokenizer.json: pre_tokenizer.pretokenizers[1]".
struct JsonPath {
  std::string file;
  std::string path;
  JsonPath key(const std::string& name) const { return {file, path.empty() ? name : path + "." + name}; }
  JsonPath index(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  std::string where() const { return file + ": " + path; }
};

// The JSON value at `key` of `object` as a string; `fallback` when missing or null;
// an error naming the path when of another type.
std::string json_string(const nlohmann::json& object, const char* key, const JsonPath& at,
                        const std::string& fallback = "");
bool json_bool(const nlohmann::json& object, const char* key, const JsonPath& at, bool fallback);

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string_view text) const = 0;
};
// nullptr for a JSON null.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const JsonPath& at);

// A piece of pre-tokenized text. `byte_level`: `text` holds raw bytes that stand for
// their GPT-2 characters (the ByteLevel pre-tokenizer's output, kept unmapped so the
// BPE model can start from bytes).
struct Piece {
  std::string text;
  bool byte_level = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its parts. `section_index` is the index of the text's
  // section between added tokens (Metaspace's "first" scheme uses it).
  virtual void apply(std::vector<Piece>* pieces, size_t section_index) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const JsonPath& at);

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>* tokens) const = 0;
};
// `added_tokens`: the text of every added token (the ByteLevel decoder passes them
// through unmapped).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const JsonPath& at,
                                      std::shared_ptr<const std::unordered_set<std::string>> added_tokens);

// The reference's clean-up of decoded text (" ." -> ".", " n't" -> "n't", ...).
std::string clean_up_tokenization(std::string text);
// Every occurrence of `from` (non-empty) in `text` replaced by `to`.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

}  // namespace gradguard::data::detail
