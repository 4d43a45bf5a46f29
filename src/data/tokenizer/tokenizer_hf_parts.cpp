// See tokenizer_hf_parts.h. Each class below is one tokenizer.json stage type; its
// comment says where the JavaScript reference reads a field differently from the Rust
// library that wrote the file (for instance, Split treats every behavior other than
// "Removed" as "Isolated", and Metaspace never splits on its replacement character),
// because the reference's ids are the ones reproduced.
#include "tokenizer_hf_parts.h"

#include <cctype>
#include <cstdlib>

#include "gradguard/core/error.h"
#include "unicode_text.h"

namespace gradguard::data::detail {

using nlohmann::json;

std::string json_string(const json& object, const char* key, const JsonPath& at, const std::string& fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw bad_input(at.key(key).where(), "must be a string, not " + std::string(it->type_name()));
  return it->get<std::string>();
}

bool json_bool(const json& object, const char* key, const JsonPath& at, bool fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw bad_input(at.key(key).where(), "must be true or false");
  return it->get<bool>();
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

std::string clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    if (text.find(from) != std::string::npos) text = replace_all(text, from, to);
  }
  return text;
}

namespace {

std::string type_of(const json& spec, const JsonPath& at) {
  if (!spec.is_object()) throw bad_input(at.where(), "must be an object");
  const std::string type = json_string(spec, "type", at);
  if (type.empty()) throw bad_input(at.key("type").where(), "is missing");
  return type;
}

[[noreturn]] void unsupported(const JsonPath& at, const std::string& type, const char* supported) {
  throw bad_input(at.key("type").where(),
                  "\"" + type + "\" is not supported (supported: " + supported + ")");
}

// A tokenizer.json pattern: {"String": literal} or {"Regex": oniguruma}.
struct Pattern {
  std::string literal;           // set for a String pattern
  std::unique_ptr<Regex> regex;  // set for a Regex pattern
  bool is_string = false;

  // The matches of this pattern in `text`, as [begin, end) byte ranges, in order. An
  // empty match is reported and the search moves on by one character, as JavaScript's
  // matchAll does.
  template <class Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    if (is_string) {
      if (literal.empty()) return;
      size_t pos = 0;
      while ((pos = text.find(literal, pos)) != std::string_view::npos) {
        fn(pos, pos + literal.size());
        pos += literal.size();
      }
      return;
    }
    size_t start = 0;
    while (start <= text.size()) {
      size_t begin = 0, end = 0;
      if (!regex->find(text, start, &begin, &end)) return;
      fn(begin, end);
      if (end > begin) {
        start = end;
      } else {
        if (begin >= text.size()) return;
        start = begin + utf8_length(static_cast<unsigned char>(text[begin]));
      }
    }
  }

  std::string replace(std::string_view text, const std::string& content) const {
    if (is_string) return literal.empty() ? std::string(text) : replace_all(text, literal, content);
    std::string out;
    size_t prev = 0;
    for_each_match(text, [&](size_t begin, size_t end) {
      out.append(text.substr(prev, begin - prev));
      out.append(content);
      prev = end;
    });
    out.append(text.substr(prev));
    return out;
  }
};

Pattern make_pattern(const json& spec, const JsonPath& at) {
  if (!spec.is_object()) throw bad_input(at.where(), "must be an object {\"String\": ...} or {\"Regex\": ...}");
  Pattern p;
  if (spec.contains("String")) {
    p.is_string = true;
    p.literal = json_string(spec, "String", at);
  } else if (spec.contains("Regex")) {
    const std::string source = json_string(spec, "Regex", at);
    const std::string where = at.key("Regex").where();
    p.regex = std::make_unique<Regex>(oniguruma_to_pcre2(source, where), where, source);
  } else {
    throw bad_input(at.where(), "must hold \"String\" or \"Regex\"");
  }
  return p;
}

// ---- normalizers ---------------------------------------------------------------------

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  std::string apply(std::string_view text) const override {
    std::string out(text);
    for (const auto& stage : stages_) {
      if (stage) out = stage->apply(out);
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  std::string apply(std::string_view text) const override { return normalize(text, form_); }

 private:
  NormalForm form_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string_view text) const override { return prefix_ + std::string(text); }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string apply(std::string_view text) const override { return pattern_.replace(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string_view text) const override { return std::string(trim_js(text, left_, right_)); }

 private:
  bool left_, right_;
};

// ---- pre-tokenizers ------------------------------------------------------------------

void materialize(Piece* piece) {
  if (!piece->byte_level) return;
  const ByteLevelTable& table = byte_level_table();
  std::string mapped;
  for (const char c : piece->text) mapped += table.byte_to_utf8[static_cast<unsigned char>(c)];
  piece->text = std::move(mapped);
  piece->byte_level = false;
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> stages) : stages_(std::move(stages)) {}
  void apply(std::vector<Piece>* pieces, size_t section_index) const override {
    for (const auto& stage : stages_) stage->apply(pieces, section_index);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

// The reference keeps only the matches with "invert", drops the separators with
// "Removed" (keeping them for a String pattern, which it wraps in a capture group), and
// reads every other behavior as "Isolated".
class SplitPreTokenizer final : public PreTokenizer {
 public:
  enum class Mode { kIsolated, kRemoved, kMatchesOnly };
  SplitPreTokenizer(Pattern pattern, Mode mode) : pattern_(std::move(pattern)), mode_(mode) {}
  void apply(std::vector<Piece>* pieces, size_t) const override {
    std::vector<Piece> out;
    size_t bytes = 0;
    for (const Piece& piece : *pieces) bytes += piece.text.size();
    out.reserve(bytes / 4 + 4);
    for (Piece& piece : *pieces) {
      materialize(&piece);
      const std::string_view text = piece.text;
      size_t prev = 0;
      pattern_.for_each_match(text, [&](size_t begin, size_t end) {
        if (mode_ != Mode::kMatchesOnly && prev < begin) out.push_back({std::string(text.substr(prev, begin - prev))});
        const bool keep_match = mode_ != Mode::kRemoved || pattern_.is_string;
        if (keep_match && end > begin) out.push_back({std::string(text.substr(begin, end - begin))});
        prev = end;
      });
      if (mode_ != Mode::kMatchesOnly && prev < text.size()) out.push_back({std::string(text.substr(prev))});
    }
    *pieces = std::move(out);
  }

 private:
  Pattern pattern_;
  Mode mode_;
};

// GPT-2's split, as a JavaScript literal: its \s is JavaScript's whitespace.
const char* const kJsSpace = "[\\t\\n\\x{B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}]";
const char* const kJsNotSpace = "[^\\t\\n\\x{B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}]";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const JsonPath& at) : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      const std::string s = kJsSpace, ns = kJsNotSpace;
      const std::string inner = std::string(kJsSpace).substr(1, std::string(kJsSpace).size() - 2);
      const std::string source = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + inner + "\\p{L}\\p{N}]+|" + s +
                                 "+(?!" + ns + ")|" + s + "+";
      regex_ = std::make_unique<Regex>(source, at.where());
    }
  }
  void apply(std::vector<Piece>* pieces, size_t) const override {
    if (!regex_) {  // in place: the common case after a Split
      for (Piece& piece : *pieces) {
        materialize(&piece);
        if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) piece.text.insert(piece.text.begin(), ' ');
        piece.byte_level = true;
      }
      return;
    }
    std::vector<Piece> out;
    for (Piece& piece : *pieces) {
      materialize(&piece);
      std::string text = std::move(piece.text);
      if (add_prefix_space_ && (text.empty() || text[0] != ' ')) text.insert(text.begin(), ' ');
      size_t start = 0, begin = 0, end = 0;
      while (start <= text.size() && regex_->find(text, start, &begin, &end)) {
        if (end > begin) out.push_back({text.substr(begin, end - begin), true});
        if (end > begin) {
          start = end;
        } else {
          if (begin >= text.size()) break;
          start = begin + utf8_length(static_cast<unsigned char>(text[begin]));
        }
      }
    }
    *pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

// The reference replaces spaces and prepends the replacement; it never splits, and it
// reads only prepend_scheme (default "always"), not the older add_prefix_space.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Scheme { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, std::string str_rep, Scheme scheme)
      : replacement_(std::move(replacement)), str_rep_(std::move(str_rep)), scheme_(scheme) {}
  void apply(std::vector<Piece>* pieces, size_t section_index) const override {
    for (Piece& piece : *pieces) {
      materialize(&piece);
      std::string text = replace_all(piece.text, " ", str_rep_);
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == Scheme::kAlways || (scheme_ == Scheme::kFirst && section_index == 0))) {
        text = str_rep_ + text;
      }
      piece.text = std::move(text);
    }
  }

 private:
  std::string replacement_, str_rep_;
  Scheme scheme_;
};

// ---- decoders ------------------------------------------------------------------------

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages) : stages_(std::move(stages)) {}
  void apply(std::vector<std::string>* tokens) const override {
    for (const auto& stage : stages_) stage->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

// Added tokens pass through verbatim; runs of other tokens are mapped back to bytes
// (a character outside the table becomes byte 0, as in the reference) and decoded,
// ill-formed sequences becoming U+FFFD, a byte-order mark kept.
class ByteLevelDecoder final : public Decoder {
 public:
  explicit ByteLevelDecoder(std::shared_ptr<const std::unordered_set<std::string>> added) : added_(std::move(added)) {}
  void apply(std::vector<std::string>* tokens) const override {
    const ByteLevelTable& table = byte_level_table();
    std::vector<std::string> out;
    std::string bytes;
    bool pending = false;
    const auto flush = [&] {
      if (pending) out.push_back(to_valid_utf8(bytes));
      bytes.clear();
      pending = false;
    };
    for (std::string& token : *tokens) {
      if (added_->count(token)) {
        flush();
        out.push_back(std::move(token));
        continue;
      }
      pending = true;
      for (size_t pos = 0; pos < token.size();) {
        const int b = table.char_to_byte(next_code_point(token, &pos));
        bytes.push_back(static_cast<char>(b < 0 ? 0 : b));
      }
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  std::shared_ptr<const std::unordered_set<std::string>> added_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = pattern_.replace(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xHH>" tokens become bytes; each run of them is decoded (ill-formed sequences
// become U+FFFD; a leading byte-order mark is dropped, as TextDecoder's default does).
// The two digits are read as JavaScript's parseInt(.., 16) reads them.
class ByteFallbackDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    const auto flush = [&] {
      if (bytes.empty()) return;
      std::string text = to_valid_utf8(bytes);
      if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
      out.push_back(std::move(text));
      bytes.clear();
    };
    for (std::string& token : *tokens) {
      int value = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') value = parse_hex(token.substr(3, 2));
      if (value >= 0) {
        bytes.push_back(static_cast<char>(value));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  // parseInt(s, 16) of a two-character string, taken modulo 256 as a Uint8Array
  // stores it; -1 where parseInt gives NaN.
  static int parse_hex(const std::string& s) {
    size_t i = 0;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v')) ++i;
    int sign = 1;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) sign = s[i++] == '-' ? -1 : 1;
    int value = 0, digits = 0;
    for (; i < s.size(); ++i, ++digits) {
      const char c = s[i];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) break;
      value = value * 16 + d;
    }
    if (digits == 0) return -1;
    return ((sign * value) % 256 + 256) % 256;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined += token;
    tokens->assign(1, std::move(joined));
  }
};

// Strips up to `start` leading and `stop` trailing characters equal to `content` from
// each token (a content of more than one UTF-16 unit never matches, as in the reference).
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>* tokens) const override {
    if (content_.empty() || utf16_length(content_) != 1) return;
    for (std::string& token : *tokens) {
      size_t begin = 0;
      for (size_t k = 0; k < start_ && token.compare(begin, content_.size(), content_) == 0; ++k) begin += content_.size();
      size_t end = token.size();
      for (size_t k = 0; k < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(std::string replacement) : replacement_(std::move(replacement)) {}
  void apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      if (!replacement_.empty()) token = replace_all(token, replacement_, " ");
      if (i == 0 && !token.empty() && token[0] == ' ') token.erase(0, 1);
    }
  }

 private:
  std::string replacement_;
};

size_t json_count(const json& spec, const char* key, const JsonPath& at) {
  const auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20)) {
    throw bad_input(at.key(key).where(), "must be a non-negative integer");
  }
  return static_cast<size_t>(it->get<int64_t>());
}

const json& json_array(const json& spec, const char* key, const JsonPath& at) {
  const auto it = spec.find(key);
  if (it == spec.end() || !it->is_array()) throw bad_input(at.key(key).where(), "must be an array");
  return *it;
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& spec, const JsonPath& at) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> stages;
    const json& list = json_array(spec, "normalizers", at);
    for (size_t i = 0; i < list.size(); ++i) stages.push_back(make_normalizer(list[i], at.key("normalizers").index(i)));
    return std::make_unique<SequenceNormalizer>(std::move(stages));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(spec, "prepend", at));
  if (type == "Replace") {
    const auto it = spec.find("pattern");
    if (it == spec.end()) throw bad_input(at.key("pattern").where(), "is missing");
    return std::make_unique<ReplaceNormalizer>(make_pattern(*it, at.key("pattern")), json_string(spec, "content", at));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool(spec, "strip_left", at, false),
                                             json_bool(spec, "strip_right", at, false));
  }
  unsupported(at, type, "Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec, const JsonPath& at) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    const json& list = json_array(spec, "pretokenizers", at);
    for (size_t i = 0; i < list.size(); ++i) {
      auto stage = make_pre_tokenizer(list[i], at.key("pretokenizers").index(i));
      if (stage) stages.push_back(std::move(stage));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(stages));
  }
  if (type == "Split") {
    const auto it = spec.find("pattern");
    if (it == spec.end()) throw bad_input(at.key("pattern").where(), "is missing");
    Pattern pattern = make_pattern(*it, at.key("pattern"));
    const bool invert = json_bool(spec, "invert", at, true);
    std::string behavior = json_string(spec, "behavior", at);
    for (char& c : behavior) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto mode = invert ? SplitPreTokenizer::Mode::kMatchesOnly
                      : behavior == "removed" ? SplitPreTokenizer::Mode::kRemoved
                                              : SplitPreTokenizer::Mode::kIsolated;
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), mode);
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(json_bool(spec, "add_prefix_space", at, false),
                                                   json_bool(spec, "use_regex", at, true), at);
  }
  if (type == "Metaspace") {
    const std::string replacement = json_string(spec, "replacement", at, "\xE2\x96\x81");
    std::string str_rep = json_string(spec, "str_rep", at);
    if (str_rep.empty()) str_rep = replacement;
    const std::string scheme = json_string(spec, "prepend_scheme", at, "always");
    MetaspacePreTokenizer::Scheme s;
    if (scheme == "always") {
      s = MetaspacePreTokenizer::Scheme::kAlways;
    } else if (scheme == "first") {
      s = MetaspacePreTokenizer::Scheme::kFirst;
    } else if (scheme == "never") {
      s = MetaspacePreTokenizer::Scheme::kNever;
    } else {
      throw bad_input(at.key("prepend_scheme").where(), "\"" + scheme + "\" is not one of always, first, never");
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, str_rep, s);
  }
  unsupported(at, type, "Sequence, Split, ByteLevel, Metaspace");
}

std::unique_ptr<Decoder> make_decoder(const json& spec, const JsonPath& at,
                                      std::shared_ptr<const std::unordered_set<std::string>> added_tokens) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, at);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> stages;
    const json& list = json_array(spec, "decoders", at);
    for (size_t i = 0; i < list.size(); ++i) {
      auto stage = make_decoder(list[i], at.key("decoders").index(i), added_tokens);
      if (stage) stages.push_back(std::move(stage));
    }
    return std::make_unique<SequenceDecoder>(std::move(stages));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>(std::move(added_tokens));
  if (type == "Replace") {
    const auto it = spec.find("pattern");
    if (it == spec.end()) throw bad_input(at.key("pattern").where(), "is missing");
    return std::make_unique<ReplaceDecoder>(make_pattern(*it, at.key("pattern")), json_string(spec, "content", at));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(json_string(spec, "content", at), json_count(spec, "start", at),
                                          json_count(spec, "stop", at));
  }
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(json_string(spec, "replacement", at, "\xE2\x96\x81"));
  unsupported(at, type, "Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace");
}

}  // namespace gradguard::data::detail
