// See tokenizer.h. This file finds the tokenizer's files, reads tokenizer_config.json
// (special tokens, chat template) and checks ids before they reach a backend; the
// formats themselves live in tokenizer_hf.cpp and tokenizer_sp.cpp.
#include "gradguard/data/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <cstdio>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "tokenizer_internal.h"
#include "unicode_text.h"

namespace gradguard::data {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

// A special token in tokenizer_config.json: a string, or an object with "content".
std::string config_token(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return string_field(*it, "content");
  return "";
}

std::string config_chat_template(const nlohmann::json& config, const std::string& where) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // A list of named templates: the one named "default".
    for (const auto& entry : *it) {
      if (entry.is_object() && string_field(entry, "name") == "default") return string_field(entry, "template");
    }
    return "";
  }
  throw bad_input(where + ": chat_template", "must be a string or a list of {name, template}");
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::string file = path;
  if (is_directory(path)) {
    const std::string json_path = path + "/tokenizer.json", model_path = path + "/tokenizer.model";
    if (fs::exists(json_path)) {
      file = json_path;
    } else if (fs::exists(model_path)) {
      file = model_path;
    } else {
      throw bad_input(path, "holds no tokenizer.json and no tokenizer.model");
    }
  }
  const std::string bytes = fs::read_file(file);
  Tokenizer t;
  t.path_ = file;
  t.hash_ = fnv1a64(bytes);
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(t.hash_));
  t.identity_ = std::string("fnv1a64:") + hex;
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  nlohmann::json config;
  const std::string config_path = parent_of(file) + "/tokenizer_config.json";
  std::string config_text;
  if (fs::exists(config_path)) {
    config_text = fs::read_file(config_path, size_t{64} << 20);
    config = parse_json(config_text, config_path);
  }
  if (first != std::string::npos && bytes[first] == '{') {
    t.format_ = "tokenizer.json";
    t.backend_ = detail::load_hf_tokenizer(bytes, config_text, file);
  } else {
    t.format_ = "sentencepiece";
    t.backend_ = detail::load_sentencepiece(bytes, file);
  }
  t.chat_template_ = config_chat_template(config, config_path);
  t.bos_token_ = config_token(config, "bos_token");
  t.eos_token_ = config_token(config, "eos_token");
  const std::string pad = config_token(config, "pad_token");
  t.bos_id_ = t.bos_token_.empty() ? t.backend_->builtin_bos() : t.token_id(t.bos_token_);
  t.eos_id_ = t.eos_token_.empty() ? t.backend_->builtin_eos() : t.token_id(t.eos_token_);
  t.pad_id_ = pad.empty() ? t.backend_->builtin_pad() : t.token_id(pad);
  if (t.bos_token_.empty() && t.bos_id_ >= 0) t.bos_token_ = t.token_text(t.bos_id_);
  if (t.eos_token_.empty() && t.eos_id_ >= 0) t.eos_token_ = t.token_text(t.eos_id_);
  return t;
}

uint64_t tokenizer_file_hash(const std::string& path) {
  std::string file = path;
  if (is_directory(path)) {
    file = path + "/tokenizer.json";
    if (!fs::exists(file)) file = path + "/tokenizer.model";
  }
  if (!fs::exists(file)) return 0;
  return fnv1a64(fs::read_file(file));
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (detail::is_valid_utf8(text)) {
    backend_->encode(text, add_special_tokens, &ids);
  } else {
    backend_->encode(detail::to_valid_utf8(text), add_special_tokens, &ids);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const int64_t size = backend_->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size) {
      throw bad_input(path_, "id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                 " is outside the vocabulary [0, " + std::to_string(size) + ")");
    }
  }
  return backend_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const { return backend_->vocab_size(); }
int32_t Tokenizer::token_id(std::string_view token) const { return backend_->token_id(token); }
std::string Tokenizer::token_text(int32_t id) const { return backend_->token_text(id); }
bool Tokenizer::is_special(int32_t id) const { return backend_->is_special(id); }
bool Tokenizer::contains_special_text(std::string_view text) const { return backend_->contains_special_text(text); }

}  // namespace gradguard::data
