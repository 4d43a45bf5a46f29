// Python semantics for chat-template values: str() and repr() (float repr is the shortest
// round-tripping form with Python's switch to exponent notation), truthiness, ==, ordering,
// iteration, and json.dumps as transformers' tojson calls it. Everything here is what makes
// the rendered text byte-identical to jinja2's, so each rule names the Python behaviour.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "chat_template_internal.h"

namespace gradguard {
namespace data {
namespace chat_detail {

void fail(const std::string& message) { throw EvalError{message}; }

namespace {
thread_local int64_t tl_size_limit = INT64_MAX;
thread_local int tl_print_depth = 0;
constexpr int kMaxPrintDepth = 200;  // nesting of lists/dicts/namespaces when printing

void check_built(const std::string& out) {
  if (static_cast<int64_t>(out.size()) > tl_size_limit)
    fail("value being printed exceeds max_output_bytes (" + std::to_string(tl_size_limit) + " bytes)");
}

struct PrintDepth {
  PrintDepth() {
    if (++tl_print_depth > kMaxPrintDepth) {
      tl_print_depth = 0;
      fail("value nests more than " + std::to_string(kMaxPrintDepth) + " levels (recursive namespace?)");
    }
  }
  ~PrintDepth() {
    if (tl_print_depth > 0) --tl_print_depth;
  }
};
}  // namespace

void set_size_limit(int64_t bytes) {
  tl_size_limit = bytes;
  tl_print_depth = 0;
}

Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::undefined(std::string message) {
  Value v;
  v.s = std::move(message);
  return v;
}
Value Value::new_list(std::vector<Value> items, SeqKind seq) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ListData>();
  v.list->data = std::move(items);
  v.list->seq = seq;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<DictData>();
  return v;
}

const Value* DictData::find(const Value& key) const {
  for (const auto& entry : entries)
    if (equals(entry.first, key)) return &entry.second;
  return nullptr;
}

void DictData::set(const Value& key, Value value) {
  for (auto& entry : entries) {
    if (equals(entry.first, key)) {
      entry.second = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

// ---- UTF-8 ------------------------------------------------------------------------------
std::vector<uint32_t> decode_utf8(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    if (c >= 0x80 && c < 0xC0) extra = 0;  // stray continuation byte: keep as is
    uint32_t cp = extra == 0 ? c : extra == 1 ? (c & 0x1F) : extra == 2 ? (c & 0x0F) : (c & 0x07);
    size_t j = 1;
    for (; j <= static_cast<size_t>(extra) && i + j < s.size(); ++j)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + j]) & 0x3F);
    out.push_back(cp);
    i += j;
  }
  return out;
}

std::string encode_utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) append_utf8(&out, cps[k]);
  return out;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t space_len_at(const std::string& s, size_t pos) {
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return is_py_space(c) ? 1 : 0;
  size_t len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (pos + len > s.size()) return 0;
  std::vector<uint32_t> cp = decode_utf8(s.substr(pos, len));
  return cp.size() == 1 && is_py_space(cp[0]) ? len : 0;
}

// ---- str / repr ---------------------------------------------------------------------------
std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf: [-]d[.ddd]e(+|-)xx  ->  digits and decimal-point position, as Python's repr uses.
  std::string text(buf);
  std::string sign;
  if (text[0] == '-') {
    sign = "-";
    text.erase(0, 1);
  }
  size_t e = text.find('e');
  int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t k = 0; k < e; ++k)
    if (text[k] != '.') digits.push_back(text[k]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int n = static_cast<int>(digits.size());
  int decpt = exponent + 1;
  if (decpt > 16 || decpt < -3) {  // Python: exponent form outside 1e-4 <= |v| < 1e16
    std::string out = sign + digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_buf;
  }
  if (decpt <= 0) return sign + "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  if (decpt >= n) return sign + digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  return sign + digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
}

namespace {

// Not str.isprintable(): control, format, separator (except space) and private-use code
// points that Python's repr escapes. Covers the common ones; unassigned code points are
// printed as they are.
bool repr_escapes(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return true;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return true;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return true;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x180E)
    return true;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB)) return true;
  return cp >= 0xF0000;
}

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : decode_utf8(s)) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (repr_escapes(cp)) {
      char buf[16];
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      append_utf8(&out, cp);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList:
      return v.list->seq == SeqKind::kTuple ? "tuple"
             : v.list->seq == SeqKind::kGenerator ? "generator" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

std::string repr(const Value& v) {
  if (v.kind == Kind::kString) return repr_string(v.s);
  if (v.kind == Kind::kUndefined) return "Undefined";
  return to_str(v);
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return float_repr(v.f);
    case Kind::kString: return v.s;
    case Kind::kList: {
      if (v.list->seq == SeqKind::kGenerator) return "<generator object>";
      PrintDepth depth;
      bool tuple = v.list->seq == SeqKind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->data.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.list->data[k]);
        check_built(out);
      }
      if (tuple && v.list->data.size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      PrintDepth depth;
      std::string out = v.kind == Kind::kNamespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->entries.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.dict->entries[k].first) + ": " + repr(v.dict->entries[k].second);
        check_built(out);
      }
      return out + (v.kind == Kind::kNamespace ? "}>" : "}");
    }
    case Kind::kCallable: return "<function " + v.callable->name + ">";
  }
  return "";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: return v.list->seq == SeqKind::kGenerator || !v.list->data.empty();
    case Kind::kDict: return !v.dict->entries.empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

double as_double(const Value& v) {
  if (v.kind == Kind::kFloat) return v.f;
  if (v.kind == Kind::kBool) return v.b ? 1.0 : 0.0;
  return static_cast<double>(v.i);
}

namespace {
int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i; }
}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList: {
      if (a.list == b.list) return true;
      if (a.list->seq != b.list->seq || a.list->seq == SeqKind::kGenerator) return false;
      if (a.list->data.size() != b.list->data.size()) return false;
      for (size_t k = 0; k < a.list->data.size(); ++k)
        if (!equals(a.list->data[k], b.list->data[k])) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& entry : a.dict->entries) {
        const Value* other = b.dict->find(entry.first);
        if (!other || !equals(entry.second, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    case Kind::kCallable: return a.callable == b.callable;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      int64_t x = as_int(a), y = as_int(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) {
    int c = a.s.compare(b.s);  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::kList && b.kind == Kind::kList && a.list->seq == b.list->seq &&
      a.list->seq != SeqKind::kGenerator) {
    const auto& x = a.list->data;
    const auto& y = b.list->data;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equals(x[k], y[k])) return compare(x[k], y[k], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) fail(a.is_undefined() ? a.s : b.s);
  fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) +
       "' and '" + type_name(b) + "'");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList:
      if (v.list->seq == SeqKind::kGenerator) {
        if (v.list->consumed) return {};
        v.list->consumed = true;
      }
      return v.list->data;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : v.dict->entries) keys.push_back(entry.first);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      std::string one;
      for (uint32_t cp : decode_utf8(v.s)) {
        one.clear();
        append_utf8(&one, cp);
        chars.push_back(Value::string(one));
      }
      return chars;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

// ---- json.dumps ---------------------------------------------------------------------------
namespace {

void json_string(std::string* out, const std::string& s, bool ensure_ascii) {
  out->push_back('"');
  for (uint32_t cp : decode_utf8(s)) {
    char buf[16];
    switch (cp) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      *out += buf;
    } else {
      append_utf8(out, cp);
    }
  }
  out->push_back('"');
}

std::string json_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return float_repr(v);
}

std::string json_key(const Value& key) {
  switch (key.kind) {
    case Kind::kString: return key.s;
    case Kind::kBool: return key.b ? "true" : "false";
    case Kind::kNone: return "null";
    case Kind::kInt: return std::to_string(key.i);
    case Kind::kFloat: return json_float(key.f);
    default: fail("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

struct JsonWriter {
  const std::string* indent;
  bool ensure_ascii;
  bool sort_keys;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out.push_back('\n');
    for (int k = 0; k < level; ++k) out += *indent;
  }

  void write(const Value& v, int level) {
    if (level > kMaxPrintDepth) fail("Circular reference detected");
    check_built(out);
    switch (v.kind) {
      case Kind::kNone: out += "null"; return;
      case Kind::kBool: out += v.b ? "true" : "false"; return;
      case Kind::kInt: out += std::to_string(v.i); return;
      case Kind::kFloat: out += json_float(v.f); return;
      case Kind::kString: json_string(&out, v.s, ensure_ascii); return;
      case Kind::kList:
        if (v.list->seq != SeqKind::kGenerator) {
          const auto& items = v.list->data;
          if (items.empty()) {
            out += "[]";
            return;
          }
          out.push_back('[');
          for (size_t k = 0; k < items.size(); ++k) {
            if (k) out += item_sep;
            if (indent) newline(level + 1);
            write(items[k], level + 1);
          }
          if (indent) newline(level);
          out.push_back(']');
          return;
        }
        break;
      case Kind::kDict: {
        std::vector<std::pair<std::string, const Value*>> entries;
        for (const auto& entry : v.dict->entries) entries.emplace_back(json_key(entry.first), &entry.second);
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& x, const auto& y) { return x.first < y.first; });
        if (entries.empty()) {
          out += "{}";
          return;
        }
        out.push_back('{');
        for (size_t k = 0; k < entries.size(); ++k) {
          if (k) out += item_sep;
          if (indent) newline(level + 1);
          json_string(&out, entries[k].first, ensure_ascii);
          out += key_sep;
          write(*entries[k].second, level + 1);
        }
        if (indent) newline(level);
        out.push_back('}');
        return;
      }
      default: break;
    }
    fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
};

}  // namespace

std::string to_json(const Value& v, const std::string* indent, bool ensure_ascii, bool sort_keys,
                    const std::string& item_sep, const std::string& key_sep) {
  JsonWriter writer{indent, ensure_ascii, sort_keys, item_sep, key_sep, {}};
  writer.write(v, 0);
  return writer.out;
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
