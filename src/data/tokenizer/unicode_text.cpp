// See unicode_text.h. The invalid-UTF-8 repair follows the WHATWG Encoding Standard's
// decoder step by step (its per-lead-byte bounds on the second byte are what make
// "ED A0 80", an encoded surrogate, three replacement characters rather than one).
// The regex translation mirrors, construct by construct, what the JavaScript reference
// does to the same Oniguruma pattern before compiling it, so both engines see the same
// language: where Oniguruma and JavaScript differ (atomic groups, `X{n}+`), the
// reference's reading wins, because its ids are the ones we must reproduce.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "unicode_text.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cctype>
#include <cstdlib>
#include <vector>

#include "gradguard/core/error.h"

namespace gradguard::data::detail {

bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    for (size_t k = 1; k <= need; ++k) {
      if (i + k >= n) return false;
      const auto c = static_cast<unsigned char>(text[i + k]);
      const unsigned char lo = k == 1 ? lower : 0x80, hi = k == 1 ? upper : 0xBF;
      if (c < lo || c > hi) return false;
    }
    i += need + 1;
  }
  return true;
}

std::string to_valid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  const char32_t kReplacement = 0xFFFD;
  char32_t cp = 0;
  int needed = 0, seen = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (needed == 0) {
      ++i;
      if (b <= 0x7F) {
        out.push_back(static_cast<char>(b));
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
        cp = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
        cp = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
        cp = b & 0x07;
      } else {
        append_utf8(&out, kReplacement);
      }
      continue;
    }
    if (b < lower || b > upper) {
      // The sequence so far is one error; the byte is looked at again as a lead.
      cp = 0;
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      append_utf8(&out, kReplacement);
      continue;
    }
    ++i;
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (++seen == needed) {
      append_utf8(&out, cp);
      cp = 0;
      needed = seen = 0;
    }
  }
  if (needed != 0) append_utf8(&out, kReplacement);
  return out;
}

char32_t next_code_point(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = *pos;
  const unsigned char b = s[i];
  char32_t cp;
  size_t len;
  if (b < 0x80) {
    cp = b;
    len = 1;
  } else if (b < 0xE0) {
    cp = b & 0x1F;
    len = 2;
  } else if (b < 0xF0) {
    cp = b & 0x0F;
    len = 3;
  } else {
    cp = b & 0x07;
    len = 4;
  }
  if (i + len > text.size()) len = text.size() - i;  // never read past the end
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  *pos = i + len;
  return cp;
}

void append_utf8(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf16_length(std::string_view text) {
  size_t units = 0;
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    units += b >= 0xF0 ? 2 : 1;
    i += utf8_length(b);
  }
  return units;
}

static bool is_ascii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::string normalize(std::string_view text, NormalForm form) {
  if (is_ascii(text)) return std::string(text);  // every normal form of ASCII is itself
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &result, static_cast<utf8proc_option_t>(options));
  if (length < 0) {
    throw runtime_error("tokenizer", std::string("Unicode normalisation failed: ") + utf8proc_errmsg(length));
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
  std::free(result);
  return out;
}

bool is_js_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view trim_js(std::string_view text, bool start, bool end) {
  if (start) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t next = pos;
      if (!is_js_whitespace(next_code_point(text, &next))) break;
      pos = next;
    }
    text.remove_prefix(pos);
  }
  if (end) {
    while (!text.empty()) {
      size_t begin = text.size() - 1;
      while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
      size_t pos = begin;
      if (!is_js_whitespace(next_code_point(text, &pos))) break;
      text.remove_suffix(text.size() - begin);
    }
  }
  return text;
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    // Printable Latin-1 bytes map to themselves; the other 68 to U+0100 upwards, in
    // byte order (GPT-2's table).
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t.byte_to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(&t.byte_to_utf8[b], t.byte_to_char[b]);
    }
    return t;
  }();
  return table;
}

int ByteLevelTable::char_to_byte(char32_t cp) const {
  if (cp < 256) {
    const bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255);
    return printable ? static_cast<int>(cp) : -1;
  }
  if (cp >= 256 && cp < 256 + 68) {
    for (int b = 0; b < 256; ++b) {
      if (byte_to_char[b] == cp) return b;
    }
  }
  return -1;
}

// ---- Regex ---------------------------------------------------------------------------

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string where, source;  // for messages
};

namespace {
// Backtracking through a long run (`\s+(?!\S)` over 100k spaces) needs a deep stack:
// each thread gets one JIT stack that can grow to 64 MiB.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
};
ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where, const std::string& source)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = where;
  impl_->source = source.empty() ? pattern : source;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    const std::string reason = reinterpret_cast<const char*>(message);
    throw bad_input(where, source.empty() || source == pattern
                               ? "regex \"" + pattern + "\" does not compile at offset " + std::to_string(offset) +
                                     ": " + reason
                               : "regex \"" + source + "\" does not compile: " + reason + " (at offset " +
                                     std::to_string(offset) + " of its PCRE2 translation \"" + pattern + "\")");
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

bool Regex::find(std::string_view text, size_t start, size_t* match_begin, size_t* match_end) const {
  ThreadMatchState& state = thread_match_state();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                             PCRE2_NO_UTF_CHECK, state.data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    // The text, not the program: a run this pattern cannot split within PCRE2's limits.
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    throw bad_input(impl_->where, "regex \"" + impl_->source + "\" gave up on the text at byte " + std::to_string(start) +
                                      " of a " + std::to_string(text.size()) + "-byte piece: " +
                                      reinterpret_cast<const char*>(message) +
                                      " (a run of characters this pattern cannot split in bounded time)");
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  *match_begin = ovector[0];
  *match_end = ovector[1];
  return true;
}

// ---- Oniguruma -> PCRE2 --------------------------------------------------------------

namespace {
const char* const kWordChars = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }

// One escape outside a class (`\` at pattern[i]); returns its PCRE2 text and advances.
std::string translate_escape(const std::string& p, size_t* i, bool fold) {
  const size_t start = *i;
  if (start + 1 >= p.size()) {
    *i = p.size();
    return "\\\\";
  }
  const char next = p[start + 1];
  if ((next == 'p' || next == 'P' || next == 'x' || next == 'u') && start + 2 < p.size() && p[start + 2] == '{') {
    const size_t close = p.find('}', start + 3);
    if (close != std::string::npos) {
      const std::string body = p.substr(start + 3, close - start - 3);
      *i = close + 1;
      if (next == 'u') return "\\x{" + body + "}";
      if ((next == 'p' || next == 'P') && body == "Word") {
        return next == 'p' ? std::string("[") + kWordChars + "]" : std::string("[^") + kWordChars + "]";
      }
      if (next == 'x' && fold) {
        const long cp = std::strtol(body.c_str(), nullptr, 16);
        if (cp < 128 && is_ascii_letter(static_cast<char>(cp))) {
          const char c = static_cast<char>(cp);
          return std::string("[") + ascii_lower(c) + ascii_upper(c) + "]";
        }
      }
      return p.substr(start, close + 1 - start);
    }
  }
  if (next == 'u' && start + 6 <= p.size()) {  // \uHHHH
    *i = start + 6;
    return "\\x{" + p.substr(start + 2, 4) + "}";
  }
  *i = start + 1 + utf8_length(static_cast<unsigned char>(next));
  switch (next) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'd': return "\\p{Nd}";
    case 'D': return "\\P{Nd}";
    case 'w': return std::string("[") + kWordChars + "]";
    case 'W': return std::string("[^") + kWordChars + "]";
    case 'h': return "[0-9A-Fa-f]";
    case 'H': return "[^0-9A-Fa-f]";
    case 'b':
      return std::string("(?:(?<![") + kWordChars + "])(?=[" + kWordChars + "])|(?<=[" + kWordChars + "])(?![" +
             kWordChars + "]))";
    case 'B':
      return std::string("(?:(?<![") + kWordChars + "])(?![" + kWordChars + "])|(?<=[" + kWordChars + "])(?=[" +
             kWordChars + "]))";
    case 'G': return "";
    case 'A': return "(?<![\\s\\S])";
    case 'z': return "(?![\\s\\S])";
    case 'Z': return "(?=\\n?(?![\\s\\S]))";
    default: break;
  }
  return p.substr(start, *i - start);
}

// A bracketed class starting at pattern[*i] == '['; advances past its ']'.
std::string translate_class(const std::string& p, size_t* i, bool fold, const std::string& where) {
  std::string out = "[";
  size_t k = *i + 1;
  if (k < p.size() && p[k] == '^') {
    out += '^';
    ++k;
  }
  bool first = true;
  while (k < p.size()) {
    const char c = p[k];
    if (c == ']' && !first) {
      *i = k + 1;
      return out + "]";
    }
    first = false;
    if (c == '\\' && k + 1 < p.size()) {
      const char next = p[k + 1];
      if ((next == 'p' || next == 'P' || next == 'x' || next == 'u') && k + 2 < p.size() && p[k + 2] == '{') {
        const size_t close = p.find('}', k + 3);
        if (close == std::string::npos) break;
        const std::string body = p.substr(k + 3, close - k - 3);
        if (next == 'u') {
          out += "\\x{" + body + "}";
        } else if ((next == 'p') && body == "Word") {
          out += kWordChars;
        } else {
          out += p.substr(k, close + 1 - k);
        }
        k = close + 1;
        continue;
      }
      k += 1 + utf8_length(static_cast<unsigned char>(next));
      switch (next) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'd': out += "\\p{Nd}"; break;
        case 'D': out += "\\P{Nd}"; break;
        case 'w': out += kWordChars; break;
        case 'h': out += "0-9A-Fa-f"; break;
        default: out += p.substr(k - 1 - utf8_length(static_cast<unsigned char>(next)), 1 + utf8_length(static_cast<unsigned char>(next)));
      }
      continue;
    }
    if (c == '[' && p.compare(k, 2, "[:") != 0) {
      throw bad_input(where, "regex \"" + p + "\": a nested character class at offset " + std::to_string(k) +
                                 " is not supported");
    }
    if (c == '&' && p.compare(k, 2, "&&") == 0) {
      throw bad_input(where, "regex \"" + p + "\": character-class intersection (&&) at offset " +
                                 std::to_string(k) + " is not supported");
    }
    if (fold && is_ascii_letter(c)) {
      throw bad_input(where, "regex \"" + p + "\": a letter in a class inside (?i:...) at offset " +
                                 std::to_string(k) + " is not supported");
    }
    const size_t len = utf8_length(static_cast<unsigned char>(c));
    out += p.substr(k, len);
    k += len;
  }
  throw bad_input(where, "regex \"" + p + "\": the character class opened at offset " + std::to_string(*i) +
                             " is not closed");
}
}  // namespace

std::string oniguruma_to_pcre2(const std::string& p, const std::string& where) {
  std::string out;
  size_t atom_start = std::string::npos;
  bool last_was_quantifier = false;
  bool fold = false;
  std::vector<std::pair<size_t, bool>> groups;  // [open group] (output offset, fold outside)
  auto emit_atom = [&](const std::string& text) {
    atom_start = out.size();
    out += text;
    last_was_quantifier = false;
  };
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    switch (c) {
      case '\\':
        emit_atom(translate_escape(p, &i, fold));
        continue;
      case '[':
        emit_atom(translate_class(p, &i, fold, where));
        continue;
      case '.':
        emit_atom("[^\\n]");
        ++i;
        continue;
      case '^':
        emit_atom("(?:(?<![\\s\\S])|(?<=\\n))");
        ++i;
        continue;
      case '$':
        emit_atom("(?:(?=\\n)|(?![\\s\\S]))");
        ++i;
        continue;
      case '(': {
        groups.emplace_back(out.size(), fold);
        if (p.compare(i, 4, "(?i:") == 0) {
          fold = true;
          out += "(?:";
          i += 4;
        } else if (p.compare(i, 3, "(?>") == 0) {
          out += "(?:";  // the reference has no atomic groups: a plain group, as it reads it
          i += 3;
        } else if (p.compare(i, 4, "(?<=") == 0 || p.compare(i, 4, "(?<!") == 0) {
          out += p.substr(i, 4);
          i += 4;
        } else if (p.compare(i, 3, "(?:") == 0 || p.compare(i, 3, "(?=") == 0 || p.compare(i, 3, "(?!") == 0) {
          out += p.substr(i, 3);
          i += 3;
        } else if (p.compare(i, 2, "(?") == 0 && p.compare(i, 3, "(?<") == 0) {
          const size_t close = p.find('>', i);
          if (close == std::string::npos)
            throw bad_input(where, "regex \"" + p + "\": the group name at offset " + std::to_string(i) + " is not closed");
          out += p.substr(i, close + 1 - i);
          i = close + 1;
        } else if (p.compare(i, 2, "(?") == 0) {
          throw bad_input(where, "regex \"" + p + "\": group syntax at offset " + std::to_string(i) + " is not supported");
        } else {
          out += '(';
          ++i;
        }
        last_was_quantifier = false;
        continue;
      }
      case ')':
        out += ')';
        if (groups.empty()) {
          atom_start = std::string::npos;
        } else {
          atom_start = groups.back().first;
          fold = groups.back().second;
          groups.pop_back();
        }
        last_was_quantifier = false;
        ++i;
        continue;
      case '|':
        out += '|';
        atom_start = std::string::npos;
        last_was_quantifier = false;
        ++i;
        continue;
      case '{': {
        size_t k = i + 1;
        std::string body;
        while (k < p.size() && (std::isdigit(static_cast<unsigned char>(p[k])) || p[k] == ',')) body += p[k++];
        const bool quantifier = k < p.size() && p[k] == '}' && !body.empty() && body != "," &&
                                body.find(',') == body.rfind(',') && atom_start != std::string::npos;
        if (!quantifier) {
          emit_atom("\\{");
          ++i;
          continue;
        }
        if (body[0] == ',') body = "0" + body;
        i = k + 1;
        if (i < p.size() && (p[i] == '+' || p[i] == '*')) {
          // Oniguruma (Ruby syntax) reads X{n}+ as a repeat of a repeat, not possessive.
          out = out.substr(0, atom_start) + "(?:" + out.substr(atom_start) + "{" + body + "})" + p[i];
          ++i;
        } else {
          out += "{" + body + "}";
        }
        last_was_quantifier = true;
        continue;
      }
      case '}':
        emit_atom("\\}");
        ++i;
        continue;
      case '+':
        if (!last_was_quantifier) out += '+';
        last_was_quantifier = true;
        ++i;
        continue;
      case '*':
      case '?':
        out += c;
        last_was_quantifier = true;
        ++i;
        continue;
      default: {
        const size_t len = utf8_length(static_cast<unsigned char>(c));
        if (fold && is_ascii_letter(c)) {
          emit_atom(std::string("[") + ascii_lower(c) + ascii_upper(c) + "]");
        } else {
          emit_atom(p.substr(i, len));
        }
        i += len;
        continue;
      }
    }
  }
  return out;
}

std::string regex_escape(std::string_view literal) {
  // \Q...\E quotes everything except "\E" itself, which is split.
  std::string out = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal.compare(i, 2, "\\E") == 0) {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out += literal[i];
    }
  }
  return out + "\\E";
}

}  // namespace gradguard::data::detail
