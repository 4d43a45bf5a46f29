// Python methods that chat templates call on values (str.strip, str.split, dict.items,
// dict.get, ...) and the globals transformers provides (range, namespace, dict,
// raise_exception, strftime_now). As in jinja2's ImmutableSandboxedEnvironment, methods
// that would mutate a list or dict (append, pop, update, ...) are "unsafe": reading them
// gives an Undefined whose call raises "access to attribute 'append' of 'list' object is
// unsafe.", so templates that rely on list.append fail here exactly as under transformers.
#include <algorithm>
#include <cstdint>
#include <ctime>

#include "chat_template_internal.h"

namespace gradguard {
namespace data {
namespace chat_detail {

// ---- string helpers ---------------------------------------------------------------------
std::string ascii_lower(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string ascii_upper(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

int64_t py_len(const std::string& s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<uint32_t> set;
  if (chars) set = decode_utf8(*chars);
  auto strip_it = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return encode_utf8(cps, begin, end);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` around every code point
    std::vector<uint32_t> cps = decode_utf8(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (k < cps.size()) append_utf8(&out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += with;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

namespace {
bool is_line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}
}  // namespace

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (!is_line_break(cps[k])) continue;
    lines.push_back(encode_utf8(cps, start, k));
    if (cps[k] == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
    start = k + 1;
  }
  if (start < cps.size()) lines.push_back(encode_utf8(cps, start, cps.size()));
  return lines;
}

std::string py_center(const std::string& s, int64_t width, uint32_t fill) {
  int64_t n = py_len(s);
  if (width <= n) return s;
  int64_t marg = width - n;
  int64_t left = marg / 2 + (marg & width & 1);  // CPython's pad split
  std::string pad;
  append_utf8(&pad, fill);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += pad;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += pad;
  return out;
}

namespace {

Value method(const std::string& name, std::function<Value(Renderer&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.callable = std::make_shared<Callable>(Callable{name, std::move(fn)});
  return v;
}

std::string str_arg(const CallArgs& args, size_t index, const char* name, const char* method_name) {
  const Value* v = find_arg(args, index, name);
  if (!v) fail(std::string(method_name) + "() missing required argument '" + name + "'");
  if (v->kind != Kind::kString)
    fail(std::string(method_name) + "() argument must be str, not " + type_name(*v));
  return v->s;
}

int64_t int_arg(const CallArgs& args, size_t index, const char* name, int64_t fallback) {
  const Value* v = find_arg(args, index, name);
  if (!v || v->kind == Kind::kNone) return fallback;
  if (v->kind == Kind::kBool) return v->b ? 1 : 0;
  if (v->kind != Kind::kInt) fail("'" + type_name(*v) + "' object cannot be interpreted as an integer");
  return v->i;
}

Value strings(std::vector<std::string> parts) {
  std::vector<Value> items;
  for (auto& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::new_list(std::move(items));
}

// str.split / str.rsplit; `sep` nullptr splits on whitespace runs.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        size_t hit = s.find(*sep, pos);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      parts.push_back(s.substr(pos));
      return parts;
    }
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::vector<uint32_t> cps = decode_utf8(s);
  if (!from_right) {
    size_t k = 0;
    while (true) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(encode_utf8(cps, k, cps.size()));
        break;
      }
      size_t start = k;
      while (k < cps.size() && !is_py_space(cps[k])) ++k;
      parts.push_back(encode_utf8(cps, start, k));
    }
    return parts;
  }
  size_t k = cps.size();
  while (true) {
    while (k > 0 && is_py_space(cps[k - 1])) --k;
    if (k == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(encode_utf8(cps, 0, k));
      break;
    }
    size_t end = k;
    while (k > 0 && !is_py_space(cps[k - 1])) --k;
    parts.push_back(encode_utf8(cps, k, end));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

bool is_ascii_letter(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

// str.isxxx(): true when non-empty and every code point passes.
Value all_of(const std::string& s, bool (*pred)(uint32_t)) {
  std::vector<uint32_t> cps = decode_utf8(s);
  if (cps.empty()) return Value::boolean(false);
  for (uint32_t c : cps)
    if (!pred(c)) return Value::boolean(false);
  return Value::boolean(true);
}

// Python str.title(): upper after a non-letter, lower after a letter (ASCII letters).
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t c : decode_utf8(s)) {
    if (is_ascii_letter(c)) {
      bool upper = c <= 'Z';
      if (prev_cased && upper) c += 'a' - 'A';
      if (!prev_cased && !upper) c -= 'a' - 'A';
      prev_cased = true;
    } else {
      prev_cased = c >= 0xC0 && c < 0x250 && c != 0xD7 && c != 0xF7;
    }
    append_utf8(&out, c);
  }
  return out;
}

// str.format with automatic ({}) or numbered ({0}) fields, {name} keywords, !r/!s and {{ }}.
std::string py_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else fail("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out.push_back('{');
      ++k;
      continue;
    }
    size_t close = fmt.find('}', k);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = fmt.substr(k + 1, close - k - 1);
    k = close;
    char conversion = 's';
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos)
      fail("str.format: format specs and field access are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
      if (!v) fail("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      // Python parses the index as a Py_ssize_t and raises ValueError past it (no raw
      // std::out_of_range escapes from here).
      uint64_t index = 0;
      for (char d : field) {
        if (index > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d - '0')) / 10)
          fail("Too many decimal digits in format string");
        index = index * 10 + static_cast<uint64_t>(d - '0');
      }
      if (index >= args.positional.size())
        fail("Replacement index " + field + " out of range for positional args tuple");
      v = &args.positional[index];
    } else {
      for (const auto& kw : args.keyword)
        if (kw.first == field) v = &kw.second;
      if (!v) fail("'" + field + "'");
    }
    out += conversion == 'r' ? repr(*v) : to_str(*v);
  }
  return out;
}

Value string_method(const std::string& self, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method(name, [self, left, right](Renderer&, CallArgs& a) {
      const Value* chars = find_arg(a, 0, "chars");
      bool given = chars && chars->kind != Kind::kNone;
      if (given && chars->kind != Kind::kString) fail("strip arg must be None or str");
      return Value::string(py_strip(self, given ? &chars->s : nullptr, left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return method(name, [self, right](Renderer&, CallArgs& a) {
      const Value* sep = find_arg(a, 0, "sep");
      bool given = sep && sep->kind != Kind::kNone;
      if (given && sep->kind != Kind::kString) fail("must be str or None, not " + type_name(*sep));
      return strings(py_split(self, given ? &sep->s : nullptr, int_arg(a, 1, "maxsplit", -1), right));
    });
  }
  if (name == "splitlines")
    return method(name, [self](Renderer&, CallArgs&) { return strings(py_splitlines(self)); });
  if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    return method(name, [self, start, name](Renderer&, CallArgs& a) {
      const Value* p = find_arg(a, 0, "prefix");
      if (!p) fail(name + "() takes at least 1 argument (0 given)");
      std::vector<Value> options = p->kind == Kind::kList && p->list->seq == SeqKind::kTuple
                                       ? p->list->data : std::vector<Value>{*p};
      for (const Value& o : options) {
        if (o.kind != Kind::kString)
          fail(name + " first arg must be str or a tuple of str, not " + type_name(o));
        if (o.s.size() > self.size()) continue;
        if (start ? self.compare(0, o.s.size(), o.s) == 0
                  : self.compare(self.size() - o.s.size(), o.s.size(), o.s) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  if (name == "upper") return method(name, [self](Renderer&, CallArgs&) { return Value::string(ascii_upper(self)); });
  if (name == "lower" || name == "casefold")
    return method(name, [self](Renderer&, CallArgs&) { return Value::string(ascii_lower(self)); });
  if (name == "title") return method(name, [self](Renderer&, CallArgs&) { return Value::string(py_title(self)); });
  if (name == "capitalize")
    return method(name, [self](Renderer&, CallArgs&) { return Value::string(py_capitalize(self)); });
  if (name == "replace") {
    return method(name, [self](Renderer& r, CallArgs& a) {
      std::string out = py_replace(self, str_arg(a, 0, "old", "replace"), str_arg(a, 1, "new", "replace"),
                                   int_arg(a, 2, "count", -1));
      check_size(r, static_cast<int64_t>(out.size()));
      return Value::string(std::move(out));
    });
  }
  if (name == "format") {
    return method(name, [self](Renderer& r, CallArgs& a) {
      std::string out = py_format(self, a);
      check_size(r, static_cast<int64_t>(out.size()));
      return Value::string(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return method(name, [self, name](Renderer&, CallArgs& a) {
      std::string sub = str_arg(a, 0, "sub", name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(py_len(self) + 1);
        int64_t n = 0;
        for (size_t pos = self.find(sub); pos != std::string::npos; pos = self.find(sub, pos + sub.size())) ++n;
        return Value::integer(n);
      }
      size_t hit = name == "find" ? self.find(sub) : self.rfind(sub);
      return Value::integer(hit == std::string::npos ? -1 : py_len(self.substr(0, hit)));
    });
  }
  if (name == "join") {
    return method(name, [self](Renderer& r, CallArgs& a) {
      const Value* it = find_arg(a, 0, "iterable");
      if (!it) fail("join() takes exactly one argument (0 given)");
      std::string out;
      size_t k = 0;
      for (const Value& item : iterate(*it)) {
        if (item.kind != Kind::kString)
          fail("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(item) + " found");
        if (k++) out += self;
        out += item.s;
        check_size(r, static_cast<int64_t>(out.size()));
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    return method(name, [self, name](Renderer& r, CallArgs& a) {
      int64_t width = int_arg(a, 0, "width", 0);
      check_size(r, width);
      int64_t pad = width - py_len(self);
      if (name == "center") {
        const Value* fill = find_arg(a, 1, "fillchar");
        uint32_t f = fill && fill->kind == Kind::kString && py_len(fill->s) == 1 ? decode_utf8(fill->s)[0] : ' ';
        return Value::string(py_center(self, width, f));
      }
      if (pad <= 0) return Value::string(self);
      if (name == "ljust") return Value::string(self + std::string(static_cast<size_t>(pad), ' '));
      if (name == "rjust") return Value::string(std::string(static_cast<size_t>(pad), ' ') + self);
      bool sign = !self.empty() && (self[0] == '-' || self[0] == '+');
      return Value::string((sign ? self.substr(0, 1) : "") + std::string(static_cast<size_t>(pad), '0') +
                           self.substr(sign ? 1 : 0));
    });
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return method(name, [self](Renderer&, CallArgs&) { return all_of(self, is_ascii_digit); });
  if (name == "isalpha")
    return method(name, [self](Renderer&, CallArgs&) {
      return all_of(self, [](uint32_t c) { return is_ascii_letter(c) || (c >= 0x80 && !is_py_space(c)); });
    });
  if (name == "isalnum")
    return method(name, [self](Renderer&, CallArgs&) {
      return all_of(self, [](uint32_t c) { return is_ascii_letter(c) || is_ascii_digit(c) || (c >= 0x80 && !is_py_space(c)); });
    });
  if (name == "isspace") return method(name, [self](Renderer&, CallArgs&) { return all_of(self, is_py_space); });
  if (name == "islower" || name == "isupper") {
    bool lower = name == "islower";
    return method(name, [self, lower](Renderer&, CallArgs&) {
      bool cased = false;
      for (char c : self) {
        if (c >= 'a' && c <= 'z') {
          if (!lower) return Value::boolean(false);
          cased = true;
        } else if (c >= 'A' && c <= 'Z') {
          if (lower) return Value::boolean(false);
          cased = true;
        }
      }
      return Value::boolean(cased);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return method(name, [self, prefix, name](Renderer&, CallArgs& a) {
      std::string x = str_arg(a, 0, "prefix", name.c_str());
      if (x.size() <= self.size()) {
        if (prefix && self.compare(0, x.size(), x) == 0) return Value::string(self.substr(x.size()));
        if (!prefix && self.compare(self.size() - x.size(), x.size(), x) == 0)
          return Value::string(self.substr(0, self.size() - x.size()));
      }
      return Value::string(self);
    });
  }
  return Value();
}

Value unsafe(const std::string& type, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
}

}  // namespace

Value get_method(const Value& object, const std::string& name) {
  if (object.kind == Kind::kString) return string_method(object.s, name);
  if (object.kind == Kind::kDict) {
    auto d = object.dict;
    if (name == "items" || name == "keys" || name == "values") {
      int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
      return method(name, [d, which](Renderer&, CallArgs&) {
        std::vector<Value> items;
        for (const auto& e : d->entries) {
          if (which == 0) items.push_back(Value::new_list({e.first, e.second}, SeqKind::kTuple));
          else items.push_back(which == 1 ? e.first : e.second);
        }
        return Value::new_list(std::move(items));
      });
    }
    if (name == "get") {
      return method(name, [d](Renderer&, CallArgs& a) {
        const Value* key = find_arg(a, 0, "key");
        if (!key) fail("get expected at least 1 argument, got 0");
        const Value* v = d->find(*key);
        return v ? *v : arg_or(a, 1, "default", Value::none());
      });
    }
    if (name == "copy") {
      return method(name, [d](Renderer&, CallArgs&) {
        Value copy = Value::new_dict();
        copy.dict->entries = d->entries;
        return copy;
      });
    }
    if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
      return unsafe("dict", name);
    return Value();
  }
  if (object.kind == Kind::kList && object.list->seq != SeqKind::kGenerator) {
    auto l = object.list;
    if (name == "index" || name == "count") {
      bool count = name == "count";
      return method(name, [l, count](Renderer&, CallArgs& a) {
        const Value* x = find_arg(a, 0, "value");
        if (!x) fail("expected 1 argument, got 0");
        int64_t n = 0;
        for (size_t k = 0; k < l->data.size(); ++k) {
          if (!equals(l->data[k], *x)) continue;
          if (!count) return Value::integer(static_cast<int64_t>(k));
          ++n;
        }
        if (!count) fail(repr(*x) + " is not in list");
        return Value::integer(n);
      });
    }
    if (l->seq == SeqKind::kList &&
        (name == "append" || name == "clear" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "reverse" || name == "sort"))
      return unsafe("list", name);
  }
  return Value();
}

// ---- globals ----------------------------------------------------------------------------
namespace {
constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
}

Value make_global(const std::string& name) {
  if (name == "range") {
    return method(name, [](Renderer&, CallArgs& a) {
      if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) {
        stop = int_arg(a, 0, "stop", 0);
      } else {
        start = int_arg(a, 0, "start", 0);
        stop = int_arg(a, 1, "stop", 0);
        step = int_arg(a, 2, "step", 1);
      }
      if (step == 0) fail("range() arg 3 must not be zero");
      int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                           : (start > stop ? (start - stop - step - 1) / -step : 0);
      if (n > kMaxRange) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      std::vector<Value> items;
      for (int64_t k = 0; k < n; ++k) items.push_back(Value::integer(start + k * step));
      return Value::new_list(std::move(items));
    });
  }
  if (name == "namespace" || name == "dict") {
    bool ns = name == "namespace";
    return method(name, [ns](Renderer& r, CallArgs& a) {
      Value v = Value::new_dict();
      if (ns) {
        v.kind = Kind::kNamespace;
        track_namespace(r, v.dict);
      }
      for (const Value& p : a.positional) {
        if (p.kind != Kind::kDict) fail("cannot convert " + type_name(p) + " to a dictionary");
        for (const auto& e : p.dict->entries) v.dict->set(e.first, e.second);
      }
      for (const auto& kw : a.keyword) v.dict->set(Value::string(kw.first), kw.second);
      return v;
    });
  }
  if (name == "raise_exception") {
    return method(name, [](Renderer&, CallArgs& a) -> Value {
      EvalError e;
      e.message = a.positional.empty() ? "" : to_str(a.positional[0]);
      e.raised = true;
      throw e;
    });
  }
  if (name == "strftime_now") {
    return method(name, [](Renderer&, CallArgs& a) {
      const Value* fmt = find_arg(a, 0, "format");
      if (!fmt || fmt->kind != Kind::kString) fail("strftime_now() argument must be str");
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[512];
      size_t n = fmt->s.empty() ? 0 : std::strftime(buf, sizeof buf, fmt->s.c_str(), &local);
      return Value::string(std::string(buf, n));
    });
  }
  return Value();
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
