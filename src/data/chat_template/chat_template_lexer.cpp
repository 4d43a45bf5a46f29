// Chat-template lexer: splits the source into text and tag tokens with jinja2's whitespace
// rules as transformers configures them (trim_blocks, lstrip_blocks). Newlines are first
// normalised to "\n" and one trailing newline is dropped (keep_trailing_newline=False).
// Then, for each tag:
//   "{%-"/"{{-"/"{#-"   strip all whitespace before the tag;
//   otherwise, unless "+", a block or comment tag that has only spaces/tabs before it on
//   its line (the line starts the text, or the text follows a tag that ended a line) takes
//   those spaces away (lstrip_blocks; never for "{{");
//   "-%}"/"-}}"/"-#}"   strip all whitespace after the tag;
//   "%}"/"#}"           swallow one following newline (trim_blocks), "+%}" keeps it.
// "Whitespace" is Python's \s (Unicode), as in jinja2's regular expressions. Inside tags
// the lexer produces names, numbers, decoded string literals and operators; an end
// delimiter only counts outside brackets, so `{{ {'a': {'b': 1}} }}` works.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "chat_template_internal.h"
#include "gradguard/core/error.h"

namespace gradguard {
namespace data {
namespace chat_detail {
namespace {

class Lexer {
 public:
  Lexer(std::string source, const std::string& where) : src_(std::move(source)), where_(where) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      char type = src_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      size_t body = start + 2 + (sign ? 1 : 0);
      std::string text = src_.substr(pos, start - pos);
      strip_before(&text, sign, type != '{', line_starting);
      emit_text(text, pos);
      if (type == '#') {
        pos = lex_comment(start, body, &line_starting);
      } else if (type == '%' && is_raw_begin(body)) {
        pos = lex_raw(start, body, &line_starting);
      } else {
        pos = lex_tag(start, body, type == '%', &line_starting);
      }
    }
    tokens_.push_back(Token{TokKind::kEof, "", line_of(src_.size()), col_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t pos, const std::string& what) const {
    throw bad_input(where_, "line " + std::to_string(line_of(pos)) + ":" +
                                std::to_string(col_of(pos)) + ": " + what);
  }
  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) -
                            line_starts_.begin());
  }
  int col_of(size_t pos) const {
    return static_cast<int>(pos - line_starts_[static_cast<size_t>(line_of(pos) - 1)]) + 1;
  }

  size_t find_tag(size_t pos) const {
    for (size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    }
    return std::string::npos;
  }

  size_t skip_space(size_t pos) const {
    while (pos < src_.size()) {
      size_t n = space_len_at(src_, pos);
      if (!n) break;
      pos += n;
    }
    return pos;
  }

  // Whitespace control before a tag: `sign` is '-', '+' or '\0'.
  void strip_before(std::string* text, char sign, bool lstrip_kind, bool line_starting) const {
    if (sign == '-') {
      size_t end = text->size();
      while (end > 0) {
        size_t k = end - 1;
        while (k > 0 && (static_cast<unsigned char>((*text)[k]) & 0xC0) == 0x80) --k;
        if (!space_len_at(*text, k)) break;
        end = k;
      }
      text->resize(end);
      return;
    }
    if (sign == '+' || !lstrip_kind) return;
    size_t nl = text->rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    if (l_pos == text->size()) return;  // Python's \s+ needs at least one character
    for (size_t k = l_pos; k < text->size();) {
      size_t n = space_len_at(*text, k);
      if (!n) return;
      k += n;
    }
    text->resize(l_pos);
  }

  void emit_text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back(Token{TokKind::kText, text, line_of(pos), col_of(pos)});
  }

  // After an end delimiter at `end` (just past it): trim_blocks / '-' handling.
  size_t after_end(size_t end, char sign, bool trim_newline, bool* line_starting) {
    if (sign == '-') end = skip_space(end);
    else if (sign != '+' && trim_newline && end < src_.size() && src_[end] == '\n') ++end;
    *line_starting = end > 0 && src_[end - 1] == '\n';
    return end;
  }

  size_t lex_comment(size_t start, size_t body, bool* line_starting) {
    size_t close = src_.find("#}", body);
    if (close == std::string::npos) error(start, "missing end of comment tag '#}'");
    char sign = close > body && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    return after_end(close + 2, sign, true, line_starting);
  }

  // `{% raw %}` with optional signs: body points after "{%" and its sign.
  bool is_raw_begin(size_t body) const {
    size_t k = skip_space(body);
    if (src_.compare(k, 3, "raw") != 0) return false;
    k = skip_space(k + 3);
    return src_.compare(k, 2, "%}") == 0 || src_.compare(k, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t start, size_t body, bool* line_starting) {
    size_t k = skip_space(skip_space(body) + 3);
    size_t content = src_[k] == '-' ? skip_space(k + 3) : k + 2;  // no trim_blocks here
    *line_starting = content > 0 && src_[content - 1] == '\n';
    for (size_t tag = src_.find("{%", content); tag != std::string::npos; tag = src_.find("{%", tag + 1)) {
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      size_t q = skip_space(tag + 2 + (sign ? 1 : 0));
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_space(q + 6);
      char end_sign = '\0';
      if (src_.compare(q, 3, "-%}") == 0 || src_.compare(q, 3, "+%}") == 0) {
        end_sign = src_[q];
        ++q;
      } else if (src_.compare(q, 2, "%}") != 0) {
        continue;
      }
      std::string text = src_.substr(content, tag - content);
      strip_before(&text, sign, true, *line_starting);
      emit_text(text, content);
      return after_end(q + 2, end_sign, true, line_starting);
    }
    error(start, "missing '{% endraw %}' for this '{% raw %}'");
  }

  size_t lex_tag(size_t start, size_t body, bool block, bool* line_starting) {
    tokens_.push_back(Token{block ? TokKind::kBlockBegin : TokKind::kVarBegin, "", line_of(start),
                            col_of(start)});
    int depth = 0;
    size_t pos = body;
    while (true) {
      pos = skip_space(pos);
      if (pos >= src_.size())
        error(start, std::string("unclosed '") + (block ? "{%" : "{{") + "': expected '" +
                         (block ? "%}" : "}}") + "' before the end of the template");
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        char sign = '\0';
        size_t at = pos;
        if ((src_[pos] == '-' || (block && src_[pos] == '+')) && src_.compare(pos + 1, 2, close) == 0) {
          sign = src_[pos];
          ++at;
        }
        if (src_.compare(at, 2, close) == 0) {
          tokens_.push_back(Token{block ? TokKind::kBlockEnd : TokKind::kVarEnd, "", line_of(pos),
                                  col_of(pos)});
          return after_end(at + 2, sign, block, line_starting);
        }
      }
      pos = lex_token(pos, &depth);
    }
  }

  size_t lex_token(size_t pos, int* depth) {
    char c = src_[pos];
    Token tok{TokKind::kOp, "", line_of(pos), col_of(pos)};
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos, tok);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      tok.kind = TokKind::kName;
      tok.text = src_.substr(pos, end - pos);
      tokens_.push_back(tok);
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(pos, tok);
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) {
        tok.text = op;
        tokens_.push_back(tok);
        return pos + 2;
      }
    }
    if (std::string("+-/*%~[](){}><=.:|,;").find(c) == std::string::npos)
      error(pos, std::string("unexpected character '") + c + "' in tag");
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if (c == ')' || c == ']' || c == '}') --*depth;
    if (*depth < 0) error(pos, std::string("unexpected '") + c + "'");
    tok.text = std::string(1, c);
    tokens_.push_back(tok);
    return pos + 1;
  }

  // Digits with optional '_' separators, as jinja2 accepts them.
  size_t digits(size_t pos, std::string* out) const {
    size_t k = pos;
    while (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
      out->push_back(src_[k++]);
      if (k + 1 < src_.size() && src_[k] == '_' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) ++k;
    }
    return k;
  }

  size_t lex_number(size_t pos, Token tok) {
    std::string text;
    size_t k = digits(pos, &text);
    bool is_float = false;
    if (k + 1 < src_.size() && src_[k] == '.' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
      text.push_back('.');
      k = digits(k + 1, &text);
      is_float = true;
    }
    if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
      size_t e = k + 1;
      std::string exp = "e";
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) exp.push_back(src_[e++]);
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        k = digits(e, &exp);
        text += exp;
        is_float = true;
      }
    }
    if (is_float) {
      tok.kind = TokKind::kFloat;
      tok.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      tok.kind = TokKind::kInt;
      errno = 0;
      tok.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error(pos, "integer literal " + text + " does not fit in 64 bits");
    }
    tok.text = text;
    tokens_.push_back(tok);
    return k;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A quoted string with Python escapes (jinja2 decodes literals with unicode-escape).
  size_t lex_string(size_t pos, Token tok) {
    char quote = src_[pos];
    std::string out;
    size_t k = pos + 1;
    while (true) {
      if (k >= src_.size()) error(pos, std::string("unclosed string literal starting with ") + quote);
      char c = src_[k];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) error(pos, "unclosed string literal");
      char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int d = 0; d < n; ++d) {
            int h = k < src_.size() ? hex_value(src_[k]) : -1;
            if (h < 0) error(k, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++k;
          }
          if (cp > 0x10FFFF) error(k, "escape beyond U+10FFFF in string literal");
          append_utf8(&out, cp);
          break;
        }
        case 'N': error(k - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int d = 0; d < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++d)
              cp = cp * 8 + static_cast<uint32_t>(src_[k++] - '0');
            append_utf8(&out, cp);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    tok.kind = TokKind::kString;
    tok.text = std::move(out);
    tokens_.push_back(tok);
    return k + 1;
  }

  std::string src_;
  const std::string& where_;
  std::vector<size_t> line_starts_;  // [line - 1] -> offset of its first byte
  std::vector<Token> tokens_;
};

std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out.push_back(source[k]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& where) {
  return Lexer(normalize_newlines(source), where).run();
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
