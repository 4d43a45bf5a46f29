// jinja2's built-in filters as chat templates use them, with transformers'
// tojson (json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...):
// note its first positional argument is ensure_ascii, not indent). Filters that jinja2
// implements as generators (select, reject, selectattr, rejectattr, map, unique, items,
// reverse on a list) return a one-shot generator value here too, so `|length` on them
// fails and `if xs|select(...)` is always true, exactly as in Python.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "chat_template_internal.h"

namespace gradguard {
namespace data {
namespace chat_detail {

const Value* find_arg(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& kw : args.keyword)
    if (kw.first == name) return &kw.second;
  return nullptr;
}

Value arg_or(const CallArgs& args, size_t index, const char* name, Value fallback) {
  const Value* v = find_arg(args, index, name);
  return v ? *v : fallback;
}

namespace {

using FilterFn = Value (*)(Renderer&, const Value&, CallArgs&);

Value generator(std::vector<Value> items) { return Value::new_list(std::move(items), SeqKind::kGenerator); }

int64_t len_of(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return py_len(v.s);
    case Kind::kList:
      if (v.list->seq != SeqKind::kGenerator) return static_cast<int64_t>(v.list->data.size());
      break;
    case Kind::kDict: return static_cast<int64_t>(v.dict->entries.size());
    default: break;
  }
  fail("object of type '" + type_name(v) + "' has no len()");
}

// jinja2's attribute getter for filters: "a.b.0" walks items (then attributes) per part.
Value get_path(const Value& item, const Value& attribute) {
  if (attribute.kind != Kind::kString) return getitem(item, attribute);
  Value v = item;
  size_t pos = 0;
  const std::string& path = attribute.s;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = getitem(v, digits ? Value::integer(std::atoll(part.c_str())) : Value::string(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value lower_if_string(const Value& v, bool case_sensitive) {
  return v.kind == Kind::kString && !case_sensitive ? Value::string(ascii_lower(v.s)) : v;
}

bool bool_arg(const CallArgs& a, size_t index, const char* name) { return truthy(arg_or(a, index, name, Value::boolean(false))); }

Value f_abs(Renderer&, const Value& v, CallArgs&) {
  if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
    int64_t x = v.kind == Kind::kBool ? v.b : v.i;
    if (x == INT64_MIN) fail("integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (v.is_undefined()) fail(v.s);
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_capitalize(Renderer&, const Value& v, CallArgs&) { return Value::string(py_capitalize(to_str(v))); }
Value f_lower(Renderer&, const Value& v, CallArgs&) { return Value::string(ascii_lower(to_str(v))); }
Value f_upper(Renderer&, const Value& v, CallArgs&) { return Value::string(ascii_upper(to_str(v))); }
Value f_string(Renderer&, const Value& v, CallArgs&) { return Value::string(to_str(v)); }
Value f_safe(Renderer&, const Value& v, CallArgs&) { return Value::string(to_str(v)); }
Value f_length(Renderer&, const Value& v, CallArgs&) { return Value::integer(len_of(v)); }
Value f_list(Renderer&, const Value& v, CallArgs&) { return Value::new_list(iterate(v)); }

Value f_center(Renderer& r, const Value& v, CallArgs& a) {
  int64_t width = static_cast<int64_t>(as_double(arg_or(a, 0, "width", Value::integer(80))));
  check_size(r, width);
  return Value::string(py_center(to_str(v), width, ' '));
}

Value f_default(Renderer&, const Value& v, CallArgs& a) {
  bool use_default = v.is_undefined() || (bool_arg(a, 1, "boolean") && !truthy(v));
  return use_default ? arg_or(a, 0, "default_value", Value::string("")) : v;
}

Value f_escape(Renderer&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value::string(out);
}

Value f_first(Renderer&, const Value& v, CallArgs&) {
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Renderer&, const Value& v, CallArgs&) {
  if (v.is_undefined()) fail(v.s);
  if (v.kind == Kind::kList && v.list->seq == SeqKind::kGenerator) fail("'generator' object is not reversible");
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(Renderer&, const Value& v, CallArgs& a) {
  Value fallback = arg_or(a, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(as_double(v));
  if (v.kind == Kind::kString) {
    std::string s = py_strip(v.s, nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && s.find_first_of("xXpP") == std::string::npos)
      return Value::number(d);
  }
  return fallback;
}

Value f_int(Renderer&, const Value& v, CallArgs& a) {
  Value fallback = arg_or(a, 0, "default", Value::integer(0));
  int64_t base = static_cast<int64_t>(as_double(arg_or(a, 1, "base", Value::integer(10))));
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(v.kind == Kind::kBool ? v.b : v.i);
  if (v.kind == Kind::kFloat) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) fail("cannot convert float to integer");
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.kind != Kind::kString) return fallback;
  std::string s = py_strip(v.s, nullptr, true, true);
  std::string digits;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_' && k > 0 && k + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[k - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[k + 1])))
      continue;
    digits.push_back(s[k]);
  }
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (!digits.empty() && end == digits.c_str() + digits.size() && errno == 0 &&
      digits.find_first_of(" \t\n") == std::string::npos)
    return Value::integer(x);
  char* fend = nullptr;
  double d = std::strtod(digits.c_str(), &fend);
  if (!digits.empty() && fend == digits.c_str() + digits.size() && std::isfinite(d) &&
      digits.find_first_of("xXpP") == std::string::npos)
    return Value::integer(static_cast<int64_t>(d));
  return fallback;
}

Value f_join(Renderer& r, const Value& v, CallArgs& a) {
  std::string sep = to_str(arg_or(a, 0, "d", Value::string("")));
  const Value* attribute = find_arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute && attribute->kind != Kind::kNone ? get_path(item, *attribute) : item);
    check_size(r, static_cast<int64_t>(out.size()));
  }
  return Value::string(std::move(out));
}

Value f_replace(Renderer& r, const Value& v, CallArgs& a) {
  const Value* count = find_arg(a, 2, "count");
  std::string out = py_replace(to_str(v), to_str(arg_or(a, 0, "old", Value::string(""))),
                               to_str(arg_or(a, 1, "new", Value::string(""))),
                               count && count->kind != Kind::kNone ? static_cast<int64_t>(as_double(*count)) : -1);
  check_size(r, static_cast<int64_t>(out.size()));
  return Value::string(std::move(out));
}

Value f_trim(Renderer&, const Value& v, CallArgs& a) {
  const Value* chars = find_arg(a, 0, "chars");
  bool given = chars && chars->kind != Kind::kNone;
  std::string set = given ? to_str(*chars) : std::string();
  return Value::string(py_strip(to_str(v), given ? &set : nullptr, true, true));
}

Value f_title(Renderer&, const Value& v, CallArgs&) {
  // jinja2 splits at runs of '-', whitespace, '(', '{', '[', '<' and capitalises each piece.
  std::vector<uint32_t> cps = decode_utf8(to_str(v));
  auto is_sep = [](uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c); };
  std::string out;
  size_t k = 0;
  while (k < cps.size()) {
    size_t start = k;
    bool sep = is_sep(cps[k]);
    while (k < cps.size() && is_sep(cps[k]) == sep) ++k;
    std::string piece = encode_utf8(cps, start, k);
    out += ascii_upper(piece.substr(0, 1)) + ascii_lower(piece.substr(1));
  }
  return Value::string(out);
}

Value f_wordcount(Renderer&, const Value& v, CallArgs&) {
  int64_t words = 0;
  bool in_word = false;
  for (uint32_t c : decode_utf8(to_str(v))) {
    bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                (c >= 0x80 && !is_py_space(c));
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::integer(words);
}

Value f_tojson(Renderer& r, const Value& v, CallArgs& a) {
  bool ensure_ascii = bool_arg(a, 0, "ensure_ascii");
  Value indent = arg_or(a, 1, "indent", Value::none());
  Value separators = arg_or(a, 2, "separators", Value::none());
  bool sort_keys = bool_arg(a, 3, "sort_keys");
  std::string indent_text;
  bool has_indent = indent.kind != Kind::kNone;
  if (indent.kind == Kind::kInt) indent_text = std::string(static_cast<size_t>(std::max<int64_t>(indent.i, 0)), ' ');
  else if (indent.kind == Kind::kString) indent_text = indent.s;
  else if (has_indent) fail("tojson: indent must be an int or a string");
  std::string item_sep = has_indent ? "," : ", ", key_sep = ": ";
  if (separators.kind != Kind::kNone) {
    std::vector<Value> parts = iterate(separators);
    if (parts.size() != 2 || parts[0].kind != Kind::kString || parts[1].kind != Kind::kString)
      fail("tojson: separators must be a pair of strings");
    item_sep = parts[0].s;
    key_sep = parts[1].s;
  }
  std::string out = to_json(v, has_indent ? &indent_text : nullptr, ensure_ascii, sort_keys, item_sep, key_sep);
  check_size(r, static_cast<int64_t>(out.size()));
  return Value::string(std::move(out));
}

Value f_items(Renderer&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return generator({});
  if (v.kind != Kind::kDict) fail("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& e : v.dict->entries) items.push_back(Value::new_list({e.first, e.second}, SeqKind::kTuple));
  return generator(std::move(items));
}

// select / reject / selectattr / rejectattr share this: keep items whose (attribute's)
// test result equals `keep`.
Value select_impl(Renderer& r, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) fail("Missing parameter for attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < a.positional.size()) {
    test = to_str(a.positional[next++]);
    if (!has_test(test)) fail("No test named '" + test + "'.");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
    test_args.keyword = a.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value subject = by_attr ? get_path(item, attribute) : item;
    bool result = test.empty() ? truthy(subject) : apply_test(r, test, subject, test_args);
    if (result == keep) out.push_back(item);
  }
  return generator(std::move(out));
}

Value f_select(Renderer& r, const Value& v, CallArgs& a) { return select_impl(r, v, a, false, true); }
Value f_reject(Renderer& r, const Value& v, CallArgs& a) { return select_impl(r, v, a, false, false); }
Value f_selectattr(Renderer& r, const Value& v, CallArgs& a) { return select_impl(r, v, a, true, true); }
Value f_rejectattr(Renderer& r, const Value& v, CallArgs& a) { return select_impl(r, v, a, true, false); }

Value f_map(Renderer& r, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  for (const auto& kw : a.keyword)
    if (kw.first == "attribute") attribute = &kw.second;
  if (attribute) {
    Value fallback;
    bool has_default = false;
    for (const auto& kw : a.keyword)
      if (kw.first == "default") {
        fallback = kw.second;
        has_default = true;
      }
    for (const Value& item : iterate(v)) {
      Value x = get_path(item, *attribute);
      out.push_back(x.is_undefined() && has_default ? fallback : x);
    }
    return generator(std::move(out));
  }
  if (a.positional.empty()) fail("map requires a filter argument");
  std::string filter = to_str(a.positional[0]);
  if (!has_filter(filter)) fail("No filter named '" + filter + "'.");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(v)) {
    CallArgs args = rest;
    out.push_back(apply_filter(r, filter, item, args));
  }
  return generator(std::move(out));
}

Value f_unique(Renderer&, const Value& v, CallArgs& a) {
  bool case_sensitive = bool_arg(a, 0, "case_sensitive");
  const Value* attribute = find_arg(a, 1, "attribute");
  std::vector<Value> seen, out;
  for (const Value& item : iterate(v)) {
    Value key = lower_if_string(attribute && attribute->kind != Kind::kNone ? get_path(item, *attribute) : item,
                                case_sensitive);
    bool dup = false;
    for (const Value& s : seen) dup = dup || equals(s, key);
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return generator(std::move(out));
}

Value f_sort(Renderer&, const Value& v, CallArgs& a) {
  bool reverse = bool_arg(a, 0, "reverse");
  bool case_sensitive = bool_arg(a, 1, "case_sensitive");
  const Value* attribute = find_arg(a, 2, "attribute");
  std::vector<Value> items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items)
    keyed.emplace_back(lower_if_string(attribute && attribute->kind != Kind::kNone ? get_path(item, *attribute) : item,
                                       case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, "<") < 0 : compare(x.first, y.first, "<") < 0;
  });
  std::vector<Value> out;
  for (auto& k : keyed) out.push_back(k.second);
  return Value::new_list(std::move(out));
}

Value f_reverse(Renderer&, const Value& v, CallArgs&) {
  if (v.kind == Kind::kString) {
    std::vector<uint32_t> cps = decode_utf8(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps, 0, cps.size()));
  }
  if (v.is_undefined()) fail(v.s);
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  if (v.kind == Kind::kList && v.list->seq == SeqKind::kGenerator) return Value::new_list(std::move(items));
  return generator(std::move(items));
}

Value f_round(Renderer&, const Value& v, CallArgs& a) {
  int64_t precision = static_cast<int64_t>(as_double(arg_or(a, 0, "precision", Value::integer(0))));
  std::string method = to_str(arg_or(a, 1, "method", Value::string("common")));
  if (!v.is_number()) fail("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.kind != Kind::kFloat) return Value::integer(v.kind == Kind::kBool ? v.b : v.i);
    if (precision < 0 || precision > 300) fail("round: precision outside 0..300 is not supported");
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), v.f);  // exact, half-even
    return Value::number(std::strtod(buf, nullptr));
  }
  if (method != "floor" && method != "ceil") fail("method must be 'common', 'ceil' or 'floor'");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = as_double(v) * scale;
  return Value::number((method == "floor" ? std::floor(x) : std::ceil(x)) / scale);
}

Value f_indent(Renderer& r, const Value& v, CallArgs& a) {
  Value width = arg_or(a, 0, "width", Value::integer(4));
  std::string pad = width.kind == Kind::kString ? width.s : std::string(static_cast<size_t>(std::max<int64_t>(
                                                                  static_cast<int64_t>(as_double(width)), 0)), ' ');
  bool first = bool_arg(a, 1, "first"), blank = bool_arg(a, 2, "blank");
  std::vector<std::string> lines = py_splitlines(to_str(v) + "\n");
  check_size(r, static_cast<int64_t>(to_str(v).size() + lines.size() * pad.size()));
  std::string out;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + pad : "") + lines[k];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (lines[k].empty() ? "" : pad + lines[k]);
  }
  return Value::string(first ? pad + out : out);
}

Value f_sum(Renderer&, const Value& v, CallArgs& a) {
  const Value* attribute = find_arg(a, 0, "attribute");
  Value total = arg_or(a, 1, "start", Value::integer(0));
  for (const Value& item : iterate(v)) {
    Value x = attribute && attribute->kind != Kind::kNone ? get_path(item, *attribute) : item;
    if (!x.is_number() || !total.is_number()) fail("unsupported operand type(s) for +: '" + type_name(total) + "' and '" + type_name(x) + "'");
    if (x.kind == Kind::kFloat || total.kind == Kind::kFloat) total = Value::number(as_double(total) + as_double(x));
    else total = Value::integer(static_cast<int64_t>(as_double(total)) + (x.kind == Kind::kBool ? x.b : x.i));
  }
  return total;
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  bool case_sensitive = bool_arg(a, 0, "case_sensitive");
  const Value* attribute = find_arg(a, 1, "attribute");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    return lower_if_string(attribute && attribute->kind != Kind::kNone ? get_path(item, *attribute) : item, case_sensitive);
  };
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    int c = compare(key(items[k]), key(items[best]), want_max ? ">" : "<");
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return items[best];
}
Value f_min(Renderer&, const Value& v, CallArgs& a) { return min_max(v, a, false); }
Value f_max(Renderer&, const Value& v, CallArgs& a) { return min_max(v, a, true); }

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"abs", f_abs}, {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default}, {"default", f_default}, {"e", f_escape}, {"escape", f_escape},
      {"first", f_first}, {"float", f_float}, {"indent", f_indent}, {"int", f_int},
      {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
      {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum},
      {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
      {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }

bool jinja_knows_filter(const std::string& name) {
  static const char* const kNames[] = {"attr", "batch", "dictsort", "filesizeformat", "forceescape",
                                       "format", "groupby", "pprint", "random", "slice", "striptags",
                                       "truncate", "urlencode", "urlize", "wordwrap", "xmlattr"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

Value apply_filter(Renderer& r, const std::string& name, const Value& operand, CallArgs& args) {
  return filters().at(name)(r, operand, args);
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
