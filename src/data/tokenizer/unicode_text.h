// UTF-8 text handling shared by the tokenizers: validation and repair of invalid UTF-8
// (replaced exactly as the WHATWG decoder that JavaScript's TextDecoder implements
// does, so that a file with broken bytes is tokenized as the JS reference tokenizes
// it), Unicode normalisation (utf8proc), the GPT-2 byte <-> character table of
// byte-level BPE, JavaScript's whitespace trimming, and a PCRE2 regex wrapper that
// takes the Oniguruma dialect of tokenizer.json and matches as the reference's
// translation to JavaScript does. Internal to src/data.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gradguard::data::detail {

// True when `text` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid_utf8(std::string_view text);
// `text` with every ill-formed sequence replaced by U+FFFD, one per maximal subpart
// (the WHATWG "utf-8 decode" algorithm). Valid text comes back unchanged.
std::string to_valid_utf8(std::string_view text);
// The code point starting at text[*pos] (valid UTF-8 assumed); advances *pos.
char32_t next_code_point(std::string_view text, size_t* pos);
void append_utf8(std::string* out, char32_t cp);
// Length of a code point's encoding from its first byte (1 for a stray byte).
inline size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// Number of UTF-16 code units `text` would take (what a JS string's .length says).
size_t utf16_length(std::string_view text);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// `text` (valid UTF-8) in the normal form; ASCII text is returned as is.
std::string normalize(std::string_view text, NormalForm form);

// JavaScript's String.prototype.trim/trimStart/trimEnd: strips WhiteSpace and
// LineTerminator code points (which include U+FEFF, unlike Unicode's White_Space).
bool is_js_whitespace(char32_t cp);
std::string_view trim_js(std::string_view text, bool start, bool end);

// GPT-2's reversible byte -> printable character map used by byte-level BPE.
struct ByteLevelTable {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8;  // the character, UTF-8 encoded
  // Character -> byte; -1 where the character is not one of the 256.
  int char_to_byte(char32_t cp) const;
};
const ByteLevelTable& byte_level_table();

// A compiled regex (PCRE2, UTF + UCP, JIT when available). Thread-safe: each thread
// matches with its own match data.
class Regex {
 public:
  // `pattern` in PCRE2 syntax; `source` is what the user wrote when `pattern` was
  // translated from it ("" = the pattern itself), shown in messages. Throws
  // gradguard::Error (bad input) naming `where`, the source and PCRE2's offset and reason
  // when it does not compile.
  Regex(const std::string& pattern, const std::string& where, const std::string& source = "");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // The first match at or after byte `start`: true and [*match_begin, *match_end).
  // Throws gradguard::Error (bad input) naming `where`, the source and the byte where the
  // match started when PCRE2 gives up on the text (its match or depth limit).
  bool find(std::string_view text, size_t start, size_t* match_begin, size_t* match_end) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A tokenizer.json regex (Oniguruma syntax, as the Rust tokenizers compile it) turned
// into PCRE2 syntax matching as the JavaScript reference's translation does:
// `\s`/`\S` as Unicode White_Space, `\d` as Nd, `(?i:...)` folding ASCII letters only,
// `.` not matching a newline.
// Throws gradguard::Error (bad input) naming `where` and the offset in `pattern` of a
// construct it cannot translate.
std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& where = "tokenizer.json");
// `literal` escaped so PCRE2 matches it verbatim.
std::string regex_escape(std::string_view literal);

}  // namespace gradguard::data::detail
